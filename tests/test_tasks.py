"""Tests of the tasks: answers against brute-force solvers, batch layout, registry."""
from __future__ import annotations

import re
import sys
from collections import Counter

import pytest
import torch

from lengthgen.tasks import BLANK, EOS, IGNORE, PAD, SPECIALS, TASKS, Batch, Task, get_task
from lengthgen.tasks.addition import add_bits
from lengthgen.tasks.base import sample_mixed

ORDER = ["parity", "copy", "addition", "binary_sum", "multiplication", "unique_set"]


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Small tensors: intra-op threads only add overhead (and stall on a busy CPU)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


# ---------------------------------------------------------------- brute force
# Each solver parses the question text and returns (answer text, T(n)) with plain
# Python, or raises AssertionError if the question does not have the right form.

def _match(pattern: str, question: str) -> re.Match:
    m = re.fullmatch(pattern, question)
    assert m, f"question {question!r} does not match {pattern!r}"
    return m


def solve_parity(q: str, n: int) -> tuple[str, int]:
    bits = _match(rf"([01]{{{n}}})=", q).group(1)
    return str(bits.count("1") % 2), n


def solve_copy(q: str, n: int) -> tuple[str, int]:
    return _match(rf"([01]{{{n}}})=", q).group(1), n


def solve_addition(q: str, n: int) -> tuple[str, int]:
    a, b = _match(rf"([01]{{{n}}})\+([01]{{{n}}})=", q).groups()
    return format(int(a, 2) + int(b, 2), f"0{n + 1}b"), n


def solve_binary_sum(q: str, n: int) -> tuple[str, int]:
    bits = _match(rf"([01]{{{n}}})=", q).group(1)
    return format(bits.count("1"), "b")[::-1], n


def solve_multiplication(q: str, n: int, max_a_bits: int = 2) -> tuple[str, int]:
    a, b = _match(rf"([01]{{1,{max_a_bits}}})\*([01]{{{n}}})=", q).groups()
    width = len(a) + len(b)
    return format(int(a, 2) * int(b, 2), f"0{width}b")[::-1], len(a) * n


def solve_unique_set(q: str, n: int, symbols: int = 50) -> tuple[str, int]:
    parts = _match(rf"((?:\d+ ){{{n}}})=", q).group(1).split()
    assert len(parts) == n and all(0 <= int(p) < symbols and str(int(p)) == p for p in parts)
    seen: list[str] = []
    for p in parts:
        if p not in seen:
            seen.append(p)
    return " ".join(seen), n


SOLVERS = {"parity": solve_parity, "copy": solve_copy, "addition": solve_addition,
           "binary_sum": solve_binary_sum, "multiplication": solve_multiplication,
           "unique_set": solve_unique_set}


# ---------------------------------------------------------------- layout check

def check_layout(task: Task, batch: Batch, n: int | torch.Tensor) -> None:
    """Vectorised checks of the Batch layout that do not use to_text.
    n: the problem length of every sample, or a (B,) tensor of per-sample lengths."""
    B, L = batch.inputs.shape
    assert batch.targets.shape == (B, L)
    for t in (batch.question_len, batch.lengths, batch.n_steps):
        assert t.shape == (B,) and t.dtype == torch.long
    assert batch.inputs.dtype == torch.long and batch.targets.dtype == torch.long
    assert (batch.lengths == n).all()
    q = batch.question_len[:, None]
    e = int(task.eos)  # one scored EOS after answers whose length varies
    scored_count = batch.scored.sum(1)[:, None]
    a = scored_count - e  # answer tokens
    assert (a >= 1).all()
    end = q - 1 + scored_count  # one past the last scored (= last input) column
    assert L == int(end.max())  # no all-padding column
    j = torch.arange(L)[None, :]
    # scored exactly from '=' to the end of the answer
    assert torch.equal(batch.scored, (j >= q - 1) & (j < end))
    # the question: task tokens only, ending with '='
    in_q = j < q
    assert (batch.inputs[in_q] >= len(SPECIALS)).all()
    assert (batch.inputs[in_q] < task.vocab_size).all()
    assert (batch.inputs.gather(1, q - 1) == task.token_id("=")).all()
    # targets: answer tokens, then one EOS if the task has one
    last = end - 1
    assert ((batch.targets.gather(1, last) == EOS) == bool(e)).all()
    answer_targets = batch.scored & (j < end - e)
    assert (batch.targets[answer_targets] >= len(SPECIALS)).all()
    assert (batch.targets[answer_targets] < task.vocab_size).all()
    # inputs in the answer region are the targets shifted by one; PAD afterwards
    in_a = (j >= q) & (j < end)
    shifted = torch.nn.functional.pad(batch.targets[:, :-1], (1, 0), value=IGNORE)
    assert torch.equal(batch.inputs[in_a], shifted[in_a])
    # after the answer: PAD (the EOS is a target only)
    assert (batch.inputs[j >= end] == PAD).all()


def check_answers(task: Task, batch: Batch, n: int | torch.Tensor, solve) -> None:
    n_steps = batch.n_steps.tolist()
    per_sample = n.tolist() if isinstance(n, torch.Tensor) else [n] * len(batch)
    for i in range(len(batch)):
        question, answer = task.to_text(batch, i)
        expected, steps = solve(question, per_sample[i])
        assert answer == expected, (task.name, per_sample[i], question, answer, expected)
        assert n_steps[i] == steps, (task.name, question, n_steps[i], steps)


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
    if name == "addition":
        n = len(question.split("+")[0])
    if name == "multiplication":
        n = len(question[:-1].split("*")[1])
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


# ---------------------------------------------------------------- mixed lengths
# `sample(batch_size, lengths, generator)` with a (B,) tensor of per-sample lengths.

VARIANTS = [(name, {}) for name in ORDER] + [
    ("multiplication", {"max_a_bits": 1}), ("multiplication", {"max_a_bits": 3}),
    ("unique_set", {"symbols": 3})]
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
    assert all(abs(c / 3000 - 1 / 15) < 0.025 for c in counts.values())
    check_layout(task, batch, batch.lengths)
    check_answers(task, batch.select(torch.arange(200)), batch.lengths[:200], SOLVERS[name])


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
    assert list(TASKS) == ORDER
    for name, cls in TASKS.items():
        assert issubclass(cls, Task) and cls.name == name
        task = get_task(name)
        assert isinstance(task, cls)
        assert len(set(task.tokens)) == len(task.tokens) and "=" in task.tokens
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
