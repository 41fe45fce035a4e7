"""Cho et al.'s data and framing for coupled arithmetic (HanseulJo/position-coupling, src/data/addition.py,
src/data/multiplication.py, src/tokenization/tokenization.py), checked from their definitions:
the independent operand law against a brute-force tally, the BOS/EOS framing, and the coupled
IDs their code gives the same strings."""
from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
import torch

from lengthgen.assembly.runs import new_run_config
from lengthgen.errors import ConfigError
from lengthgen.model.position_transforms import build_transform
from lengthgen.tasks import EOS, IGNORE, get_task


def operand_law(low: int, high: int) -> tuple[Fraction, Fraction]:
    """By enumeration over every pair of digit counts (uniform, independent): the mean padded
    operand length and the share of zero digits among the padded operands' digits. A d-digit
    operand has a nonzero leading digit (d > 1), 1/10 zeros among the rest; padding is zeros."""
    counts = range(low, high + 1)
    lengths = zeros = digits = Fraction(0)
    for da, db in itertools.product(counts, counts):
        width = max(da, db)
        lengths += width
        for d in (da, db):
            zeros += (width - d) + Fraction(1 if d == 1 else d - 1, 10)
            digits += width
    return lengths / len(counts) ** 2, zeros / digits


def test_the_law_over_1_to_30_digits():
    """The figures docs/sparsity.md quotes: a mean length of 20.5 and 31 % zero digits."""
    mean, zeros = operand_law(1, 30)
    assert round(float(mean), 1) == 20.5 and round(float(zeros), 3) == 0.315


def parse(task, batch):
    rows = []
    for i in range(len(batch)):
        question, answer = task.to_text(batch, i)
        a, b = question[:-1].split("+")
        rows.append((a, b, answer))
    return rows


def test_independent_operands_follow_the_law_by_tally():
    """20,000 training samples over 1..6 digits: each operand's own digit count uniform and
    independent of the other's, both written with the longer one's length, zeros as the
    enumeration says, and the sum right."""
    task = get_task("decimal_addition", operands="independent")
    low, high, samples = 1, 6, 20_000
    batch = task.sample_range(samples, low, high, torch.Generator().manual_seed(0))
    pairs, widths, zero_digits, all_digits = {}, [], 0, 0
    for (a, b, answer), n in zip(parse(task, batch), batch.lengths.tolist()):
        assert len(a) == len(b) == n and answer == str(int(a) + int(b)).zfill(n + 1)[::-1]
        own = (len(str(int(a))), len(str(int(b))))  # digit counts without the padding
        assert max(own) == n
        pairs[own] = pairs.get(own, 0) + 1
        widths.append(n)
        zero_digits += (a + b).count("0")
        all_digits += 2 * n
    cells = (high - low + 1) ** 2
    assert len(pairs) == cells
    expected = samples / cells  # every (da, db) pair equally likely: chi-square, 35 degrees of freedom
    chi2 = sum((count - expected) ** 2 / expected for count in pairs.values())
    assert chi2 < 35 + 5 * math.sqrt(2 * 35), chi2
    mean, zeros = operand_law(low, high)
    spread = torch.tensor(widths, dtype=torch.float64).std().item() / math.sqrt(samples)
    assert abs(sum(widths) / samples - float(mean)) < 4 * spread
    share = zero_digits / all_digits  # digits within a sample are not independent: a loose bound
    assert abs(share - float(zeros)) < 0.01, (share, float(zeros))


def test_uniform_lengths_give_the_default_law():
    """The other modes keep lengthgen's law: one uniform length, then the task's own draws."""
    task = get_task("decimal_addition")
    assert not task.draws_own_lengths
    one = task.sample_range(64, 1, 9, torch.Generator().manual_seed(4))
    g = torch.Generator().manual_seed(4)
    two = task.sample(64, torch.randint(1, 10, (64,), generator=g), g)
    assert torch.equal(one.inputs, two.inputs)


def test_at_a_test_length_both_operands_have_exactly_n_digits():
    task = get_task("decimal_addition", operands="independent")
    batch = task.sample(500, 7, torch.Generator().manual_seed(1))
    for a, b, answer in parse(task, batch):
        assert len(str(int(a))) == len(str(int(b))) == 7 and answer == str(int(a) + int(b)).zfill(8)[::-1]


def cho_addition_ids(a: str, b: str, answer: str, start: int = 1) -> list[int]:
    """AdditionDatasetWithCoupledPositions.__getitem__ (reverse_input false, reverse_output true),
    then tokenize_for_decoder: BOS takes 0, then the input, '=' and the answer positions."""
    a_ids = list(range(start + 1, start + 1 + len(a)))[::-1]
    b_ids = list(range(start + 1, start + 1 + len(b)))[::-1]
    answer_ids = list(range(start + 1, start + 1 + len(answer)))
    return [0] + a_ids + [start] + b_ids + [start] + answer_ids


def test_bos_and_eos_frame_the_sequence_as_cho_et_al_do():
    """[BOS] a + b = sum [EOS] with BOS = EOS (bos_to_eos), the EOS scored, the '=' not; BOS's ID 0,
    every other ID as their code assigns it, the EOS target's ID 0."""
    task = get_task("decimal_addition", operands="independent", coupled=True, bos=True, eos=True)
    batch = task.sample_range(300, 1, 8, torch.Generator().manual_seed(2))
    for i, (a, b, answer) in enumerate(parse(task, batch)):
        q = int(batch.question_len[i])
        assert int(batch.inputs[i, 0]) == EOS and q == len(a) + len(b) + 3
        scored = batch.scored[i].nonzero()[:, 0].tolist()
        assert scored == list(range(q - 1, q + len(answer)))  # from '=' to the last digit, which predicts EOS
        assert int(batch.targets[i, scored[-1]]) == EOS
        ids = cho_addition_ids(a, b, answer)
        width = int(batch.widths[i])  # the last answer digit is an input now: it predicts the EOS
        assert batch.position_ids[i, :width].tolist() == ids[:width], (a, b, answer)
        assert (batch.position_ids[i, width:] == 0).all()
        assert [int(batch.target_ids[i, j]) for j in scored] == ids[q:q + len(answer)] + [0]
    moved = build_transform("random_offset", {"max_position": 40, "keep_zero": True})(batch, torch.Generator())
    assert (moved.position_ids[:, 0] == 0).all() and (moved.position_ids[:, 1] > 1).any()  # BOS stays at 0


def test_the_loss_reads_the_eos():
    task = get_task("decimal_addition", eos=True)
    plain = get_task("decimal_addition").sample(8, 5, torch.Generator().manual_seed(0))
    framed = task.sample(8, 5, torch.Generator().manual_seed(0))
    assert (framed.scored.sum(1) == plain.scored.sum(1) + 1).all()
    assert task.random_baseline(5) == pytest.approx(get_task("decimal_addition").random_baseline(5))


def cho_multiplication_ids(a: str, b: str, answer: str, start: int = 1) -> list[int]:
    """NxMMultiplicationDatasetWithCoupledPositions.__getitem__ (reverse_output true)."""
    end = start + len(a) + len(b)
    question = list(range(end - len(a), end + 1)) + list(range(end - len(b), end + 1))
    return question + list(range(end - len(answer), end))[::-1]


def test_multiplication_is_numbered_as_the_mirror_image_of_cho_et_al():
    """Their IDs fall with significance and put the operators last; lengthgen's rise from the
    operators. On every sample one reflection, id -> c - id, maps one onto the other, so tokens
    sharing an ID share it in both and every ID difference is the same up to sign."""
    task = get_task("decimal_multiplication", coupled=True, leading_zero=False)
    batch = task.sample(200, torch.randint(1, 9, (200,), generator=torch.Generator().manual_seed(7)),
                        torch.Generator().manual_seed(8))
    for i in range(len(batch)):
        question, answer = task.to_text(batch, i)
        a, b = question[:-1].split("*")
        assert len(a) == 1 or a[0] != "0"  # leading_zero false: exactly n digits, as their law
        theirs = cho_multiplication_ids(a, b, answer + "x")[:int(batch.widths[i])]
        ours = batch.position_ids[i, :len(theirs)].tolist()
        assert len({o + t for o, t in zip(ours, theirs)}) == 1, (question, ours, theirs)


@pytest.mark.parametrize("override, words", [
    ("task.options.operands=independant", ["operands", "independent"]),
    ("task.options.bos=1", ["bos", "true or false"]),
    ("task.options.eos=\"yes\"", ["eos", "true or false"]),
])
def test_bad_task_options_are_one_line_errors(override, words):
    with pytest.raises(ConfigError) as err:
        new_run_config(None, ["task.name=decimal_addition", override])
    assert "\n" not in str(err.value) and all(w in str(err.value) for w in words), str(err.value)


def test_the_independent_law_refuses_one_length_per_batch():
    with pytest.raises(ConfigError, match="data.length_sampling"):
        new_run_config(None, ["task.name=decimal_addition", "task.options.operands=independent",
                              "data.length_sampling=per_batch"])


def test_rendering_drops_the_bos():
    task = get_task("decimal_addition", bos=True, eos=True)
    batch = task.sample(3, 4, torch.Generator().manual_seed(0))
    question, answer = task.to_text(batch, 0)
    assert question.endswith("=") and question[0].isdigit() and len(answer) == 5
    assert IGNORE not in batch.targets[0, batch.scored[0]].tolist()
