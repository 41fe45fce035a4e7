"""Multi-operand addition and long multiplication with Cho et al.'s scratchpads and multi-level coupled
IDs (ICLR 2025): answers by brute force, the strings and IDs against a transcription of their
released code (HanseulJo/position-coupling, src/data/addition.py, src/data/multiplication.py,
src/tokenization/tokenization.py), the data law by tally, each level's random start, the
per-level tables, and the config rules."""
from __future__ import annotations

import pytest
import torch

from lengthgen.assembly.runs import new_run
from lengthgen.config.schema import ModelConfig
from lengthgen.errors import ConfigError
from lengthgen.model.position_transforms import build_transform
from lengthgen.model.positions import LearnedPositions
from lengthgen.tasks import get_task
from lengthgen.tasks.coupled_levels import STRIDE, largest_level_id, pack, unpack


# ---------------------------------------------------------------- their code, transcribed
# Cho et al.'s generators and __getitem__, with randomize = False (every level starts at 1), on
# numbers given; the tokenizer's framing: a BOS (ID 0 in every level), then the IDs, then 0s.

def cho_multiple_addition(numbers: list[int]) -> tuple[str, str, list[list[int]]]:
    n_op = len(numbers)
    max_len = max(len(str(a)) for a in numbers)
    overflow = len(str(int("9" * max_len) * n_op))
    cum_sums = [0]
    for num in numbers:
        cum_sums.append(cum_sums[-1] + num)
    labels = ">".join(("P" * max(0, overflow - len(c)) + c)[::-1] for c in map(str, cum_sums))
    inputs = "+".join("P" * (overflow - len(str(a))) + str(a) for a in numbers)
    inp_numbers, lab_numbers = inputs.split("+"), labels.split(">")
    start = 1
    ip1 = sum((list(range(start, start + len(a) + 1))[::-1] for a in inp_numbers), start=[])[:-1]
    lp1 = sum((list(range(start, start + len(b) + 1)) for b in lab_numbers), start=[])
    ip2 = sum(([i] * (len(a) + 1) for a, i in zip(inp_numbers, range(start, start + n_op))), start=[])[:-1]
    lp2 = sum(([j] * (len(b) + 1) for b, j in zip(lab_numbers, range(start, start + len(lab_numbers)))), start=[])
    ids = [[0] + ip1 + lp1, [0] + ip2 + lp2]
    return inputs.replace("P", "0"), labels.replace("P", "0"), ids


def cho_multiplication(A: int, B: int) -> tuple[str, str, list[list[int]]]:
    pad_1, pad_2 = len(str(A)) + 1, len(str(A)) + len(str(B))
    parts = [A * int(b) for b in str(B)[::-1]]
    scratch = "+".join(("P" * max(0, pad_1 - len(p)) + p)[::-1] for p in map(str, parts)) + "="
    cum, ten, sums = 0, 1, []
    for p in parts:
        cum, ten = cum + p * ten, ten * 10
        sums.append(cum)
    labels = scratch + ">".join(("P" * max(0, pad_2 - len(c)) + c)[::-1] for c in map(str, sums))
    a, b = str(A), str(B)
    lab_1, lab_2 = labels.split("=")
    lab_1, lab_2 = lab_1.split("+"), lab_2.split(">")
    start, o = 1, 1
    ip1 = list(range(start + o, start + len(a) + o))[::-1] + [0] * (len(b) + 1)
    lp1 = sum((list(range(start, start + len(x) + 1)) for x in lab_1), start=[])
    lp1 += [0] * (sum(map(len, lab_2)) + len(lab_2))
    ip2 = [0] * (len(a) + 1) + list(range(start, start + len(b)))[::-1]
    lp2 = sum(([i] * (len(x) + 1) for x, i in zip(lab_1, range(start, start + len(lab_1)))), start=[])
    lp2 += sum(([j] * (len(x) + 1) for x, j in zip(lab_2, range(start, start + len(lab_2)))), start=[])
    ip3 = [0] * (len(a) + 1 + len(b))
    lp3 = sum((list(range(start + i, start + i + len(x) + 1)) for i, x in enumerate(lab_1)), start=[])
    lp3 += sum((list(range(start, start + len(x) + 1)) for x in lab_2), start=[])
    ids = [[0] + ip1 + lp1, [0] + ip2 + lp2, [0] + ip3 + lp3]
    return f"{a}*{b}", labels.replace("P", "0"), ids


def levels_of(batch, i: int, levels: int) -> list[list[int]]:
    """Sample i's IDs per level over its BOS, question and answer (the EOS is never an input)."""
    width = int(batch.widths[i])
    return [level.tolist() for level in unpack(batch.position_ids[i, :width], levels)]


@pytest.mark.parametrize("length, operands", [(1, 2), (3, 3), (4, [2, 5]), (2, 11)])
def test_addition_strings_and_ids_are_cho_et_al_s(length, operands):
    task = get_task("multi_operand_addition", operands=operands, coupled=2, bos=True)
    batch = task.sample(40, length, torch.Generator().manual_seed(length))
    for i in range(len(batch)):
        question, answer = task.to_text(batch, i)
        numbers = [int(x) for x in question[:-1].split("+")]
        inputs, labels, ids = cho_multiple_addition(numbers)
        assert (question, answer) == (inputs + "=", labels)
        assert levels_of(batch, i, 2) == [level[:int(batch.widths[i])] for level in ids]


@pytest.mark.parametrize("length, multiplier", [(1, 1), (3, 2), (5, [1, 4]), (2, 6)])
def test_multiplication_strings_and_ids_are_cho_et_al_s(length, multiplier):
    task = get_task("long_multiplication", multiplier=multiplier, coupled=True, bos=True)
    batch = task.sample(40, length, torch.Generator().manual_seed(length))
    for i in range(len(batch)):
        question, answer = task.to_text(batch, i)
        a, b = question[:-1].split("*")
        assert len(a) == length and (len(a) == 1 or a[0] != "0") and (len(b) == 1 or b[0] != "0")
        inputs, labels, ids = cho_multiplication(int(a), int(b))
        assert (question, answer) == (inputs + "=", labels)
        assert answer.split("=")[-1].split(">")[-1] == str(int(a) * int(b)).zfill(len(a) + len(b))[::-1]
        assert levels_of(batch, i, 3) == [level[:int(batch.widths[i])] for level in ids]


def test_one_level_without_scratchpad_is_cho_et_al_2024():
    """scratchpad = false, coupled = 1: the sum alone, significance IDs
    (their MultipleAdditionDatasetWithCoupledPositions)."""
    task = get_task("multi_operand_addition", operands=[2, 4], scratchpad=False, coupled=1, bos=True)
    batch = task.sample(30, 3, torch.Generator().manual_seed(0))
    for i in range(len(batch)):
        question, answer = task.to_text(batch, i)
        numbers = [int(x) for x in question[:-1].split("+")]
        inputs, labels, ids = cho_multiple_addition(numbers)
        assert answer == labels.split(">")[-1] == str(sum(numbers)).zfill(len(inputs.split("+")[0]))[::-1]
        width = int(batch.widths[i])
        expected = ids[0][:len(inputs) + 2] + list(range(2, 2 + len(answer)))[:width - len(inputs) - 2]
        assert batch.position_ids[i, :width].tolist() == expected


def test_the_partially_uniform_law_by_tally():
    """Training draws: half the samples give every operand one digit count, half draw each on its
    own; the operand count uniform over its range; a count > 1 has no leading zero."""
    task = get_task("multi_operand_addition", operands=[2, 4])
    low, high, samples = 1, 3, 6000
    batch = task.sample_range(samples, low, high, torch.Generator().manual_seed(0))
    equal, operand_counts = 0, {2: 0, 3: 0, 4: 0}
    for i in range(samples):
        question, answer = task.to_text(batch, i)
        numbers = question[:-1].split("+")
        operand_counts[len(numbers)] += 1
        counts = [len(str(int(x))) for x in numbers]  # zero has one digit, as in their code
        assert int(batch.lengths[i]) == max(counts) and all(low <= c <= high for c in counts)
        assert answer.split(">")[-1] == str(sum(map(int, numbers))).zfill(len(numbers[0]))[::-1]
        equal += len(set(counts)) == 1
    # P(equal) = 1/2 + 1/2 * E over m of P(m independent counts agree) = 1/2 + 1/2 * (1/3 + 1/9 + 1/27) / 3
    expected = 0.5 + 0.5 * (1 / 3 + 1 / 9 + 1 / 27) / 3
    assert abs(equal / samples - expected) < 0.025
    assert all(abs(c / samples - 1 / 3) < 0.03 for c in operand_counts.values())


def test_random_offset_shifts_each_level_by_its_own_start():
    task = get_task("multi_operand_addition", operands=[2, 5], coupled=2)
    batch = task.sample(400, 4, torch.Generator().manual_seed(0))
    moved = build_transform("random_offset", {"max_position": [12, 9], "keep_zero": True, "levels": 2})(
        batch, torch.Generator().manual_seed(1))
    starts = [set(), set()]
    for level, (before, after) in enumerate(zip(unpack(batch.position_ids, 2), unpack(moved.position_ids, 2))):
        assert torch.equal(before == 0, after == 0)  # BOS, EOS, padding stay 0
        shift = (after - before).masked_fill(before == 0, -1)
        for row in shift:
            values = set(row[row >= 0].tolist())
            assert len(values) == 1  # one start per sample and level
            starts[level] |= values
        assert int(after.max()) <= [12, 9][level]
    # every start drawn: at length 4, W = 5 (level 0 up to 2 + 4), m + 1 groups (level 1 up to 3 at m = 2)
    assert starts[0] == set(range(12 - 6 + 1)) and starts[1] == set(range(9 - 3 + 1))


@pytest.mark.parametrize("options, message", [
    ({"max_position": 10, "levels": 2}, "keep_zero"),
    ({"max_position": [10, 10, 10], "keep_zero": True, "levels": 2}, "one per level"),
])
def test_random_offset_refuses_bad_levels(options, message):
    with pytest.raises(ValueError, match=message):
        build_transform("random_offset", options)


def test_packing_round_trips_and_the_learned_tables_sum_per_level():
    levels = [torch.randint(0, 40, (3, 7)) for _ in range(3)]
    ids = pack(levels)
    assert all(torch.equal(a, b) for a, b in zip(unpack(ids, 3), levels))
    assert largest_level_id(ids, 3) == max(int(level.max()) for level in levels) < STRIDE
    scheme = LearnedPositions(ModelConfig(d_model=8, max_positions=40), std=1.0, levels=3)
    x = torch.randn(3, 7, 8)
    expected = x + scheme.wpe(levels[0]) + scheme.level_tables[0](levels[1]) + scheme.level_tables[1](levels[2])
    assert torch.allclose(scheme.embed(x, ids), expected)
    with pytest.raises(ValueError, match="outside the learned position table"):
        scheme.embed(x, pack([levels[0], levels[1], levels[2] + 40]))


COUPLED = ["task.name=multi_operand_addition", "task.options.coupled=2", "task.train_min=1", "task.train_max=3",
           "model.max_positions=16", "eval.lengths=3"]


@pytest.mark.parametrize("overrides, message", [
    (["model.position=rope"], "a scheme with a levels option"),
    (["model.position=learned", "model.position_options.levels=2", "data.position_transform=pose",
      "data.position_transform_options.target_length=64"], "random_offset with levels, or none"),
    (["model.position=learned", "model.position_options.levels=3"], "model.position_options.levels = 2"),
    (["model.position=learned", "data.position_transform=random_offset", "data.position_transform_options.levels=1",
      "data.position_transform_options.max_position=15", "data.position_transform_options.keep_zero=true"],
     "data.position_transform_options.levels = 2"),
    (["model.position=learned", "data.position_transform=random_offset",
      "data.position_transform_options.max_position=15"], "keep_zero"),
    (["model.position=learned", "data.position_transform=random_offset",
      "data.position_transform_options.keep_zero=true", "data.position_transform_options.max_position=[15, 4]"],
     "max_position 4 of level 1"),  # 5 operands: 6 groups
    (["model.position=learned", "model.position_options.levels=2", "model.max_positions=5"], "max_positions"),
])
def test_multi_level_ids_need_a_table_and_a_start_per_level(overrides, message):
    with pytest.raises(ConfigError, match=message):
        new_run(None, [*COUPLED, *overrides])


def test_levels_on_a_task_without_them_are_refused():
    plain = ["task.name=decimal_addition", "task.options.coupled=true", "model.max_positions=16", "eval.lengths=3"]
    with pytest.raises(ConfigError, match="1 level"):
        new_run(None, [*plain, "model.position=learned", "model.position_options.levels=2"])
    with pytest.raises(ConfigError, match="1 level"):
        new_run(None, [*plain, "data.position_transform=random_offset",
                       "data.position_transform_options.levels=2",
                       "data.position_transform_options.max_position=15",
                       "data.position_transform_options.keep_zero=true"])


def test_a_multi_level_run_takes_a_table_and_a_start_per_level_from_the_task():
    run = new_run(None, [*COUPLED, "model.position=learned", "data.position_transform=random_offset",
                         "data.position_transform_options.max_position=[15, 10]",
                         "data.position_transform_options.keep_zero=true"])
    assert run.cfg.model.position_options == {"levels": 2, "std": 1.0}  # Cho et al.'s N(0, 1) tables
    assert run.transform.levels == 2 and run.transform.tops == [15, 10]
    assert run.cfg.data.position_transform_options["levels"] == 2  # written into the run's config.toml


@pytest.mark.parametrize("name, options", [
    ("multi_operand_addition", {"operands": 1.5}), ("multi_operand_addition", {"operands": [5, 2]}),
    ("multi_operand_addition", {"coupled": 3}), ("multi_operand_addition", {"coupled": 2, "scratchpad": False}),
    ("long_multiplication", {"multiplier": 0}), ("long_multiplication", {"coupled": 1}),
])
def test_bad_options_are_refused(name, options):
    with pytest.raises(ValueError, match=name):
        get_task(name, **options)
