"""Tests of the tasks: answers against brute-force solvers, batch layout, registry."""
from __future__ import annotations

import sys
from collections import Counter

import pytest
import torch

from lengthgen.tasks import PAD, TASKS, get_task
from lengthgen.tasks.addition import add_bits

from tests.helpers.task_checks import (ORDER, SOLVERS, check_answers, check_layout, solve_multiplication,
                                       solve_unique_set)



# ---------------------------------------------------------------- correctness

@pytest.mark.parametrize("name", ["binary_sum", "multiplication", "unique_set"])
def test_inputs_after_answer_are_pad(name):
    task = get_task(name)
    batch = task.sample(64, 20, torch.Generator().manual_seed(0))
    q = batch.question_len[:, None]
    a = (batch.scored.sum(1) - 1)[:, None]
    j = torch.arange(batch.inputs.shape[1])[None, :]
    assert (batch.inputs[j >= q + a] == PAD).all()


@pytest.mark.parametrize("name", ORDER)
def test_answers_against_brute_force(name):
    task = get_task(name)
    g = torch.Generator().manual_seed(1234)
    total = 0
    for n in range(1, 65):
        batch = task.sample(157, n, g)
        check_layout(task, batch, n)
        check_answers(task, batch, n, SOLVERS[name])
        total += len(batch)
    assert total >= 10_000


@pytest.mark.parametrize("name", ORDER)
def test_answers_at_length_500(name):
    task = get_task(name)
    batch = task.sample(48, 500, torch.Generator().manual_seed(5))
    check_layout(task, batch, 500)
    check_answers(task, batch, 500, SOLVERS[name])


def test_binary_sum_empty_zero_as_released():
    """empty_zero: a count of zero has no answer token, the '=' predicts the EOS; the rest as before."""
    task, plain = get_task("binary_sum", empty_zero=True), get_task("binary_sum")
    zeros = 0
    for n in (1, 2, 3, 5, 9):
        batch = task.sample(300, n, torch.Generator().manual_seed(n))
        check_layout(task, batch, n, empty_ok=True)
        check_answers(task, batch, n, lambda q, n: ("" if "1" not in q else SOLVERS["binary_sum"](q, n)[0], n))
        empty = batch.scored.sum(1) == 1
        zeros += int(empty.sum())
        assert torch.equal(empty, (batch.inputs[:, :n] == task.token_id("0")).all(1))
        same = plain.sample(300, n, torch.Generator().manual_seed(n))  # the same draws, "0" written
        assert torch.equal(same.inputs[:, :n], batch.inputs[:, :n])
    assert zeros > 100
    with pytest.raises(ValueError, match="empty_zero"):
        get_task("binary_sum", empty_zero=1)


@pytest.mark.parametrize("max_a_bits", [1, 3])
def test_multiplication_other_a_widths(max_a_bits):
    task = get_task("multiplication", max_a_bits=max_a_bits)
    g = torch.Generator().manual_seed(7)
    widths = Counter()
    for n in (1, 2, 5, 17, 64, 300):
        batch = task.sample(300, n, g)
        check_layout(task, batch, n)
        check_answers(task, batch, n,
                      lambda q, n: solve_multiplication(q, n, max_a_bits=max_a_bits))
        widths.update((batch.question_len - n - 2).tolist())
    assert set(widths) == set(range(1, max_a_bits + 1))


@pytest.mark.parametrize("min_a_bits, max_a_bits", [(2, 2), (2, 3), (3, 3)])
def test_multiplication_with_a_short_factor_of_at_least_min_a_bits(min_a_bits, max_a_bits):
    """The released test: the short factor always has 2 bits (min_a_bits = max_a_bits = 2)."""
    task = get_task("multiplication", max_a_bits=max_a_bits, min_a_bits=min_a_bits)
    g = torch.Generator().manual_seed(11)
    widths = Counter()
    for n in (1, 4, 33):
        batch = task.sample(200, n, g)
        check_layout(task, batch, n)
        check_answers(task, batch, n, lambda q, n: solve_multiplication(q, n, max_a_bits=max_a_bits))
        widths.update((batch.question_len - n - 2).tolist())
        assert batch.n_steps.tolist() == ((batch.question_len - n - 2) * n).tolist()  # T(n) = len(a) * n
    assert set(widths) == set(range(min_a_bits, max_a_bits + 1))
    mixed = task.sample(64, torch.randint(1, 9, (64,), generator=g), g)
    assert int((mixed.question_len - mixed.lengths - 2).min()) >= min_a_bits


@pytest.mark.parametrize("min_a_bits", [0, 3, True, 1.5])
def test_multiplication_refuses_a_min_a_bits_outside_1_to_max(min_a_bits):
    with pytest.raises(ValueError, match="min_a_bits"):
        get_task("multiplication", min_a_bits=min_a_bits)


def test_unique_set_few_symbols():
    task = get_task("unique_set", symbols=3)
    assert task.tokens == ("0", "1", "2", "=") and task.answer_symbols == 3
    g = torch.Generator().manual_seed(3)
    for n in (1, 2, 3, 10, 100):
        batch = task.sample(200, n, g)
        check_layout(task, batch, n)
        check_answers(task, batch, n, lambda q, n: solve_unique_set(q, n, symbols=3))
    assert set((batch.scored.sum(1) - 1).tolist()) == {3}  # n = 100 shows every symbol


def test_add_bits_against_python_ints():
    g = torch.Generator().manual_seed(11)
    for width in (1, 2, 3, 64, 500):
        x, y = torch.randint(0, 2, (2, 50, width), generator=g)
        if width >= 3:  # long carry chains: all ones plus one
            x[0], y[0] = 1, 0
            y[0, 0] = 1
        total, carry = add_bits(x, y)
        for i in range(50):
            xi = int("".join(map(str, x[i].flip(0).tolist())), 2)
            yi = int("".join(map(str, y[i].flip(0).tolist())), 2)
            got = int("".join(map(str, total[i].flip(0).tolist())), 2) + (int(carry[i]) << width)
            assert got == xi + yi


@pytest.mark.parametrize("name", ORDER)
def test_example_is_correct(name):
    task = get_task(name)
    question, answer = task.example.split(" -> ")
    n = len(question.split(task.sep)) - 1 if task.sep else len(question) - 1
    if name in ("addition", "decimal_addition"):
        n = len(question.split("+")[0])
    if name == "multiplication":
        n = len(question[:-1].split("*")[1])
    if name in ("decimal_multiplication", "long_multiplication"):
        n = len(question.split("*")[0])
    if name == "multi_operand_addition":
        n = len(str(int(question.split("+")[0])))
    if name == "induct":
        n = len(question.split("?")[0]) - 1
    if name == "sparse_parity":
        n = (len(question) - 1) // 2
    if name == "selective_copy":
        n = len(question[:-1].replace(".", ""))
    if name == "counting":
        n = question.count(";")  # every statement ends with one
    assert SOLVERS[name](question, n)[0] == answer
    assert TASKS[name].__module__.startswith("lengthgen.tasks.")
    doc = sys.modules[TASKS[name].__module__].__doc__
    assert doc and "T(n)" in doc


# ---------------------------------------------------------------- reproducibility

@pytest.mark.parametrize("name", ORDER)
def test_same_seed_same_batch_different_seed_different(name):
    task = get_task(name)
    one = task.sample(32, 12, torch.Generator().manual_seed(9))
    two = task.sample(32, 12, torch.Generator().manual_seed(9))
    other = task.sample(32, 12, torch.Generator().manual_seed(10))
    for field in ("inputs", "targets", "question_len", "lengths", "n_steps"):
        assert torch.equal(getattr(one, field), getattr(two, field))
    assert one.inputs.shape != other.inputs.shape or not torch.equal(one.inputs, other.inputs)
    # the global RNG is not used
    torch.manual_seed(0)
    a = task.sample(8, 5, torch.Generator().manual_seed(1))
    torch.manual_seed(1)
    b = task.sample(8, 5, torch.Generator().manual_seed(1))
    assert torch.equal(a.inputs, b.inputs)


# ---------------------------------------------------------------- distributions

def _texts(task, n, count=4000, seed=21):
    batch = task.sample(count, n, torch.Generator().manual_seed(seed))
    return [task.to_text(batch, i) for i in range(len(batch))], batch


def test_parity_distribution():
    texts, _ = _texts(get_task("parity"), 9)
    ones = sum(a == "1" for _, a in texts) / len(texts)
    assert abs(ones - 0.5) < 0.03
    bits = "".join(q[:-1] for q, _ in texts)
    assert abs(bits.count("1") / len(bits) - 0.5) < 0.01


def test_copy_and_binary_sum_bits_uniform():
    for name in ("copy", "binary_sum"):
        texts, _ = _texts(get_task(name), 16)
        bits = "".join(q[:-1] for q, _ in texts)
        assert abs(bits.count("1") / len(bits) - 0.5) < 0.01
        per_position = [sum(q[k] == "1" for q, _ in texts) / len(texts) for k in range(16)]
        assert all(abs(p - 0.5) < 0.04 for p in per_position)
    texts, _ = _texts(get_task("binary_sum"), 16)
    assert {len(a) for _, a in texts} == {1, 2, 3, 4}  # 5 bits only for 16 ones (p = 2^-16)


def test_addition_operands_uniform():
    texts, _ = _texts(get_task("addition"), 8)
    values = [int(part, 2) for q, _ in texts for part in q[:-1].split("+")]
    assert len(set(values)) == 256  # every 8-bit value, leading zeros included
    assert abs(sum(values) / len(values) / 255 - 0.5) < 0.02
    carries = sum(a[0] == "1" for _, a in texts) / len(texts)
    assert abs(carries - 0.498) < 0.03  # P(a + b >= 2^8) = (255 * 256 / 2) / 2^16


def test_multiplication_uses_both_a_lengths():
    texts, _ = _texts(get_task("multiplication"), 6)
    a_values = Counter(q.split("*")[0] for q, _ in texts)
    assert set(a_values) == {"0", "1", "00", "01", "10", "11"}
    one_bit = sum(a_values[v] for v in ("0", "1")) / len(texts)
    assert abs(one_bit - 0.5) < 0.03
    for v in ("00", "01", "10", "11"):
        assert abs(a_values[v] / len(texts) - 0.125) < 0.02
    b_values = {int(q[:-1].split("*")[1], 2) for q, _ in texts}
    assert b_values == set(range(64))


def test_unique_set_uses_all_symbols():
    texts, _ = _texts(get_task("unique_set"), 20)
    counts = Counter(s for q, _ in texts for s in q.split()[:-1])
    assert set(counts) == {str(s) for s in range(50)}
    mean = sum(counts.values()) / 50
    assert all(abs(c - mean) < 0.15 * mean for c in counts.values())
    lengths = {len(a.split()) for _, a in texts}
    assert len(lengths) >= 4 and max(lengths) <= 20  # answer lengths vary
