"""Tests of the tasks: mixed-length sampling, validation, registry, Batch helpers."""
from __future__ import annotations

import functools
from collections import Counter

import pytest
import torch

from lengthgen.tasks import BLANK, CHOMSKY, EOS, IGNORE, PAD, SPECIALS, TASKS, Batch, Task, get_task
from lengthgen.tasks.base import sample_mixed

from tests.helpers.task_checks import ORDER, SOLVERS, check_answers, check_layout  # noqa: E402



# ---------------------------------------------------------------- mixed lengths
# `sample(batch_size, lengths, generator)` with a (B,) tensor of per-sample lengths.

VARIANTS = [(name, {}) for name in ORDER] + [
    ("multiplication", {"max_a_bits": 1}), ("multiplication", {"max_a_bits": 3}),
    ("unique_set", {"symbols": 3}), ("copy_symbols", {"symbols": 2}), ("induct", {"symbols": 2}),
    ("sparse_parity", {"layout": "pairs"}), ("selective_copy", {"blank_ratio": 2.5}), ("counting", {"variables": 1})]
VARIANT_IDS = [name + "".join(f"-{k}={v}" for k, v in options.items()) for name, options in VARIANTS]


def _solver(name, options):
    return lambda q, n: SOLVERS[name](q, n, **options)


@pytest.mark.parametrize("name, options", VARIANTS, ids=VARIANT_IDS)
def test_mixed_lengths_against_brute_force(name, options):
    task = get_task(name, **options)
    g = torch.Generator().manual_seed(77)
    for lengths in (torch.randint(1, 65, (1500,), generator=g),  # short, mixed
                    torch.tensor([1, 500, 2, 499, 3, 250, 64, 1, 137, 500, 5, 333]),  # long, mixed
                    torch.tensor([9]), torch.tensor([1, 1, 1])):  # one row; all equal
        batch = task.sample(len(lengths), lengths, g)
        check_layout(task, batch, lengths)
        assert torch.equal(batch.lengths, lengths)
        check_answers(task, batch, lengths, _solver(name, options))


@pytest.mark.parametrize("name, options", VARIANTS, ids=VARIANT_IDS)
def test_mixed_rows_equal_int_path_given_same_symbols(name, options, monkeypatch):
    """Record the random draws of one mixed batch, then replay row i's share of them
    through the int path at n_i: the two must agree exactly, row by row."""
    task = get_task(name, **options)
    B = 37  # no other drawn dimension has this size
    lengths = torch.tensor([1, 2, 3, 30, 5, 1, 17, 30, 8] * 4 + [4])
    real_randint, draws = torch.randint, []

    def recording(*args, **kwargs):
        draws.append(real_randint(*args, **kwargs))
        return draws[-1]

    monkeypatch.setattr(torch, "randint", recording)
    mixed = task.sample(B, lengths, torch.Generator().manual_seed(3))
    monkeypatch.setattr(torch, "randint", real_randint)
    for i, n in enumerate(lengths.tolist()):
        replay = iter(draws)

        def replaying(low, high, size, **kwargs):
            drawn = next(replay)
            assert drawn.dim() == len(size)
            index, row_done = [], False
            for full, want in zip(drawn.shape, size):
                if full == B and want == 1 and not row_done:
                    index.append(slice(i, i + 1))  # the batch dimension
                    row_done = True
                else:
                    index.append(slice(0, want))  # a length (or fixed) dimension
            return drawn[tuple(index)]

        monkeypatch.setattr(torch, "randint", replaying)
        single = task.sample(1, n, torch.Generator())
        monkeypatch.setattr(torch, "randint", real_randint)
        row = mixed.select(torch.tensor([i]))
        for field in ("inputs", "targets", "question_len", "lengths", "n_steps"):
            assert torch.equal(getattr(row, field), getattr(single, field)), (name, i, n, field)


@pytest.mark.parametrize("name", ORDER)
def test_uniform_length_tensor_equals_int_path(name):
    task = get_task(name)
    one = task.sample(40, 13, torch.Generator().manual_seed(8))
    two = task.sample(40, torch.full((40,), 13), torch.Generator().manual_seed(8))
    for field in ("inputs", "targets", "question_len", "lengths", "n_steps"):
        assert torch.equal(getattr(one, field), getattr(two, field)), field


@pytest.mark.parametrize("name", ORDER)
def test_mixed_lengths_do_not_change_callers_tensor(name):
    lengths = torch.tensor([4, 1, 9])
    batch = get_task(name).sample(3, lengths, torch.Generator().manual_seed(0))
    batch.lengths += 1
    assert lengths.tolist() == [4, 1, 9]


@pytest.mark.parametrize("name", ORDER)
@pytest.mark.parametrize("bad, word", [
    (torch.tensor([3, 0, 2, 5]), ">= 1"),
    (torch.tensor([3, 2, -4, 5]), ">= 1"),
    (torch.tensor([3.0, 2.0, 1.0, 5.0]), "dtype"),
    (torch.tensor([3, 2, 1, 5], dtype=torch.int32), "dtype"),
    (torch.tensor([True, True, True, True]), "dtype"),
    (torch.tensor([3, 2, 1]), "shape"),
    (torch.tensor([[3, 2], [1, 5]]), "shape"),
    (torch.tensor(3), "shape"),
])
def test_check_length_rejects_tensors(name, bad, word):
    task = get_task(name)
    with pytest.raises(ValueError, match="length") as err:
        task.sample(4, bad, torch.Generator().manual_seed(0))
    assert word in str(err.value) and name in str(err.value)


def test_check_length_accepts_both_forms():
    task = get_task("copy")
    task.check_length(3)
    task.check_length(torch.tensor([1, 7, 2]))
    task.check_length(torch.tensor([1, 7, 2]), batch_size=3)
    with pytest.raises(ValueError, match="shape"):
        task.check_length(torch.tensor([1, 7, 2]), batch_size=4)


@pytest.mark.parametrize("name", ORDER)
def test_sample_mixed_covers_range(name):
    task = get_task(name)
    batch = sample_mixed(task, 3000, 3, 17, torch.Generator().manual_seed(6))
    counts = Counter(batch.lengths.tolist())
    assert set(counts) == set(range(3, 18))
    if not task.draws_own_lengths:  # a task with its own law (multi_operand_addition) tests it itself
        assert all(abs(c / 3000 - 1 / 15) < 0.025 for c in counts.values())
    check_layout(task, batch, batch.lengths)
    # the task's own law draws operands shorter than the longest (multi_operand_addition's)
    solver = functools.partial(SOLVERS[name], exact=False) if task.draws_own_lengths else SOLVERS[name]
    check_answers(task, batch.select(torch.arange(200)), batch.lengths[:200], solver)


def test_sample_mixed_single_length_and_errors():
    task = get_task("parity")
    g = torch.Generator().manual_seed(0)
    assert sample_mixed(task, 16, 5, 5, g).lengths.tolist() == [5] * 16
    one = sample_mixed(task, 16, 2, 9, torch.Generator().manual_seed(1))
    two = sample_mixed(task, 16, 2, 9, torch.Generator().manual_seed(1))
    assert torch.equal(one.inputs, two.inputs) and torch.equal(one.lengths, two.lengths)
    for low, high in ((0, 5), (6, 5), (2.0, 5), (1, True)):
        with pytest.raises(ValueError, match="low"):
            sample_mixed(task, 4, low, high, g)


# ---------------------------------------------------------------- validation

@pytest.mark.parametrize("name", ORDER)
@pytest.mark.parametrize("bad", [0, -1, -20, 2.0, True, "3"])
def test_check_length_rejects(name, bad):
    with pytest.raises(ValueError, match="length"):
        get_task(name).sample(4, bad, torch.Generator().manual_seed(0))


def test_registry_order_and_exports():
    # flip-flop: tests/tasks/test_flipflop.py; text (windows of a corpus): tests/evaluation/test_lm.py;
    # the Chomsky-hierarchy suite: tests/tasks/test_chomsky.py
    assert [name for name in TASKS if name not in ("flipflop", "text") and name not in CHOMSKY] == ORDER
    assert "flipflop" in TASKS and "text" in TASKS
    for name, cls in TASKS.items():
        assert issubclass(cls, Task) and cls.name == name
        task = get_task(name)
        assert isinstance(task, cls)
        assert len(set(task.tokens)) == len(task.tokens) and ("=" in task.tokens) == task.answer_region
        assert task.vocab[:3] == SPECIALS
    assert (PAD, EOS, BLANK) == (0, 1, 2) and IGNORE == -100


@pytest.mark.parametrize("wrong, close", [("copyy", "copy"), ("Parity", "parity"),
                                          ("binarysum", "binary_sum"), ("unique", "unique_set")])
def test_get_task_unknown_name_suggests(wrong, close):
    with pytest.raises(ValueError) as err:
        get_task(wrong)
    message = str(err.value)
    assert f"'{wrong}'" in message and f"did you mean '{close}'" in message
    assert "choose from" in message and "multiplication" in message


def test_get_task_unknown_name_without_match():
    with pytest.raises(ValueError, match="choose from parity, copy, addition") as err:
        get_task("zzzzzz")
    assert "did you mean" not in str(err.value)


@pytest.mark.parametrize("name, options, error, word", [
    ("copy", {"symbols": 3}, TypeError, None),
    ("parity", {"foo": 1}, TypeError, None),
    ("multiplication", {"symbols": 3}, TypeError, None),
    ("unique_set", {"max_a_bits": 2}, TypeError, None),
    ("unique_set", {"symbols": 0}, ValueError, "symbols"),
    ("unique_set", {"symbols": -3}, ValueError, "symbols"),
    ("unique_set", {"symbols": "5"}, ValueError, "symbols"),
    ("unique_set", {"symbols": 2.5}, ValueError, "symbols"),
    ("multiplication", {"max_a_bits": 0}, ValueError, "max_a_bits"),
    ("multiplication", {"max_a_bits": True}, ValueError, "max_a_bits"),
])
def test_bad_options(name, options, error, word):
    with pytest.raises(error) as err:
        get_task(name, **options)
    if word:
        assert word in str(err.value) and "\n" not in str(err.value)


def test_options_accepted_positionally_rejected():
    with pytest.raises(TypeError):
        TASKS["unique_set"](10)
    assert get_task("unique_set", symbols=7).answer_symbols == 7
    assert get_task("multiplication", max_a_bits=3).max_a_bits == 3


# ---------------------------------------------------------------- Batch helpers

@pytest.mark.parametrize("name", ORDER)
def test_concat_and_select_round_trip(name):
    task = get_task(name)
    g = torch.Generator().manual_seed(4)
    parts = [task.sample(5, n, g) for n in (3, 11, 1, 7)]
    texts = [task.to_text(b, i) for b in parts for i in range(len(b))]
    joined = Batch.concat(parts)
    assert len(joined) == 20
    assert joined.inputs.shape[1] == max(b.inputs.shape[1] for b in parts)
    assert [task.to_text(joined, i) for i in range(20)] == texts
    assert joined.lengths.tolist() == [n for n in (3, 11, 1, 7) for _ in range(5)]
    assert torch.equal(joined.n_steps, torch.cat([b.n_steps for b in parts]))
    # selecting one part back gives exactly that batch
    start = 0
    for part in parts:
        back = joined.select(torch.arange(start, start + len(part)))
        for field in ("inputs", "targets", "question_len", "lengths", "n_steps"):
            assert torch.equal(getattr(back, field), getattr(part, field)), field
        start += len(part)
    picked = joined.select(torch.tensor([17, 2, 9]))
    assert [task.to_text(picked, i) for i in range(3)] == [texts[17], texts[2], texts[9]]
    assert picked.inputs.shape[1] == int((picked.question_len + picked.scored.sum(1) - 1).max())


@pytest.mark.parametrize("name", ["copy", "multiplication", "unique_set"])
def test_blank_answers(name):
    task = get_task(name)
    batch = task.sample(40, 9, torch.Generator().manual_seed(2))
    blanked = batch.blank_answers()
    j = torch.arange(batch.inputs.shape[1])[None, :]
    after = j >= batch.question_len[:, None]
    assert (blanked.inputs[after] == BLANK).all()
    assert torch.equal(blanked.inputs[~after], batch.inputs[~after])
    assert (batch.inputs[~after] != BLANK).all()
    assert torch.equal(blanked.targets, batch.targets)
    assert [task.to_text(blanked, i)[0] for i in range(40)] == \
        [task.to_text(batch, i)[0] for i in range(40)]


# ---------------------------------------------------------------- random baseline

def test_random_baseline():
    assert get_task("parity").random_baseline(17) == pytest.approx(0.5)
    assert get_task("copy").random_baseline(3) == pytest.approx(1 / 8)
    assert get_task("addition").random_baseline(3) == pytest.approx(1 / 16)
    assert get_task("unique_set", symbols=2).random_baseline(1) == pytest.approx(0.5)
    # multiplication at n = 1: answers of 2 or 3 bits, half each
    assert get_task("multiplication").random_baseline(1, samples=20000) == \
        pytest.approx(0.5 * 1 / 4 + 0.5 * 1 / 8, rel=0.03)
