"""The Chomsky-hierarchy tasks: answers against brute-force solvers (tests/tasks/chomsky_solvers.py),
those solvers against the authors' own generator (samples in chomsky_reference.json.gz, written by
chomsky_reference.py with their JAX code), and the data law against theirs by chi-square tests."""
from __future__ import annotations

import gzip
import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch

from lengthgen.tasks import BLANK, CHOMSKY, SPECIALS, TASKS, Batch, get_task, measure
from lengthgen.tasks.chomsky_common import slots_tape
from lengthgen.tasks.chomsky_regular import evaluate

from chomsky_solvers import SOLVERS, as_authors, input_length, output_length
from tests.helpers.task_checks import check_layout

REFERENCE = json.loads(gzip.decompress((Path(__file__).parent / "chomsky_reference.json.gz").read_bytes()))
HEX = "0123456789abcdef"
NAMES = list(CHOMSKY)
CLASSES = {"modular_arithmetic": 5, "cycle_navigation": 5, "modular_arithmetic_brackets": 5, "solve_equation": 5,
           "bucket_sort": 5, "stack_manipulation": 3, "binary_addition": 3, "binary_multiplication": 3}
INPUTS = {"modular_arithmetic": 8, "cycle_navigation": 3, "stack_manipulation": 5, "modular_arithmetic_brackets": 10,
          "solve_equation": 11, "missing_duplicate_string": 4, "binary_addition": 3, "binary_multiplication": 3,
          "bucket_sort": 5}  # the authors' input ids that are ever drawn (2 elsewhere)


def decode(sample: str) -> tuple[list[int], list[int]]:
    x, y = sample.split("|")
    return [HEX.index(c) for c in x], [HEX.index(c) for c in y]


def check(name: str, task, batch: Batch, lengths: list[int]) -> list[list[int]]:
    check_layout(task, batch, torch.tensor(lengths))
    assert batch.n_steps.tolist() == lengths
    inputs = []
    for i, n in enumerate(lengths):
        x, y = as_authors(task, batch, i)
        assert len(x) == input_length(name, n) and len(y) == output_length(name, n), (name, n, x, y)
        assert max(x) < INPUTS.get(name, 2) and max(y) < CLASSES.get(name, 2)
        assert SOLVERS[name](x) == y, (name, n, x, y)
        inputs.append(x)
    return inputs


# ---------------------------------------------------------------- the authors' generator

@pytest.mark.parametrize("name", NAMES)
def test_solvers_agree_with_the_authors_generator(name):
    """Every sample of the authors' generator (14 lengths x 40, plus 2,000 at one length): the
    brute-force solver gives their output, at their input and output lengths."""
    for part in ("exact", "law"):
        for n, samples in REFERENCE[name][part].items():
            for sample in samples:
                x, y = decode(sample)
                assert len(x) == input_length(name, int(n)) and len(y) == output_length(name, int(n))
                assert SOLVERS[name](x) == y, (name, n, sample)


def features(name: str, x: list[int], y: list[int]) -> dict[str, object]:
    """What the chi-square tests compare: small-support views of one sample."""
    text = "".join(HEX[v] for v in x)
    if name in ("modular_arithmetic_brackets", "solve_equation"):
        found = {"skeleton": "".join("d" if v < 5 else HEX[v] for v in x), "digits": tuple(sorted(Counter(
            v for v in x if v < 5).items())), "answer": y[0]}
        if name == "solve_equation" and len(x) >= 3:  # the x: the first digit at or after a uniform column
            body = x[:-2]
            place = body.index(9)
            found["gap"] = next(k for k in range(1, len(body) + 1) if body[place - k] < 5 or body[place - k] == 9) - 1
        return found
    if name == "stack_manipulation":
        first = next((k for k, v in enumerate(x) if v >= 2), len(x))
        return {"stack": first, "actions": tuple(sorted(Counter(x[first:]).items())), "answer": tuple(y)}
    if name in ("binary_addition", "binary_multiplication"):
        return {"input": text, "operator": x.index(2) if 2 in x else -1, "answer": tuple(y)}
    if name == "missing_duplicate_string":
        return {"hole": x.index(2), "input": text, "answer": y[0]}
    if name == "modular_arithmetic":
        return {"ops": text[1::2], "digits": tuple(sorted(Counter(x[0::2]).items())), "answer": y[0]}
    if name in ("cycle_navigation", "bucket_sort"):
        return {"counts": tuple(sorted(Counter(x).items())), "ends": (x[0], x[-1]), "answer": tuple(y)}
    return {"input": text, "answer": tuple(y)}


def chi_square_p(a: Counter, b: Counter) -> float:
    """p-value of the chi-square test that two samples share one categorical law (cells expected
    below 5 pooled), from the Wilson-Hilferty normal approximation of the chi-square tail."""
    na, nb = sum(a.values()), sum(b.values())
    cells, pooled = [], [0, 0]
    for key in set(a) | set(b):
        if (a[key] + b[key]) * min(na, nb) / (na + nb) < 5:
            pooled[0], pooled[1] = pooled[0] + a[key], pooled[1] + b[key]
        else:
            cells.append((a[key], b[key]))
    if sum(pooled):
        cells.append(tuple(pooled))
    if len(cells) < 2:
        return 1.0
    stat = 0.0
    for ca, cb in cells:
        ea, eb = (ca + cb) * na / (na + nb), (ca + cb) * nb / (na + nb)
        stat += (ca - ea) ** 2 / ea + (cb - eb) ** 2 / eb
    k = len(cells) - 1
    z = ((stat / k) ** (1 / 3) - (1 - 2 / (9 * k))) / math.sqrt(2 / (9 * k))
    return 0.5 * math.erfc(z / math.sqrt(2))


@pytest.mark.parametrize("name", NAMES)
def test_law_matches_the_authors_generator(name):
    """The random streams cannot be matched (theirs are JAX, numpy and Python's), so the laws are
    compared: 20,000 lengthgen samples against their 2,000 on each feature (p > 0.001), and every
    feature value they drew is one lengthgen draws."""
    (n, samples), = REFERENCE[name]["law"].items()
    theirs = [features(name, *decode(s)) for s in samples]
    task = get_task(name)
    batch = task.sample(20000, int(n), torch.Generator().manual_seed(3))
    ours = [features(name, *as_authors(task, batch, i)) for i in range(len(batch))]
    for key in theirs[0]:
        a, b = Counter(f[key] for f in theirs), Counter(f[key] for f in ours)
        assert chi_square_p(a, b) > 1e-3, (name, key, a.most_common(5), b.most_common(5))
        common = [v for v, c in a.items() if c >= 20]
        assert all(b[v] > 0 for v in common), (name, key)


def test_chi_square_rejects_a_different_law():
    fair = Counter({v: 500 for v in range(4)})
    assert chi_square_p(fair, Counter({0: 5000, 1: 5000, 2: 5000, 3: 5000})) > 0.5
    assert chi_square_p(fair, Counter({0: 6500, 1: 4500, 2: 4500, 3: 4500})) < 1e-3


# ---------------------------------------------------------------- brute force

@pytest.mark.parametrize("name", NAMES)
def test_answers_against_brute_force(name):
    task = get_task(name)
    g = torch.Generator().manual_seed(7)
    for n in list(range(1, 41)) + [57, 100]:
        check(name, task, task.sample(60, n, g), [n] * 60)
    mixed = torch.tensor([1, 2, 3, 4, 5, 8, 13, 40, 41, 77] * 4)
    check(name, task, task.sample(40, mixed, g), mixed.tolist())


@pytest.mark.parametrize("name", NAMES)
def test_answers_at_length_500(name):
    task = get_task(name)
    check(name, task, task.sample(12, 500, torch.Generator().manual_seed(5)), [500] * 12)


@pytest.mark.parametrize("name, vocab", [("reverse_string", 3), ("duplicate_string", 5), ("odds_first", 4),
                                         ("bucket_sort", 2), ("bucket_sort", 10)])
def test_vocab_size_option(name, vocab):
    task = get_task(name, vocab_size=vocab)
    assert task.tokens == tuple(str(v) for v in range(vocab)) + ("=",) and task.answer_symbols == vocab
    batch = task.sample(200, 30, torch.Generator().manual_seed(1))
    x = [as_authors(task, batch, i) for i in range(200)]
    assert {v for xi, _ in x for v in xi} == set(range(vocab))
    assert all(SOLVERS[name](xi) == yi for xi, yi in x)


@pytest.mark.parametrize("name, options", [("reverse_string", {"vocab_size": 1}), ("bucket_sort", {"vocab_size": 11}),
                                           ("odds_first", {"vocab_size": True}),
                                           ("modular_arithmetic_brackets", {"mult": 1})])
def test_bad_options(name, options):
    with pytest.raises(ValueError, match=next(iter(options))):
        get_task(name, **options)


def test_mult_false_has_no_product():
    task = get_task("modular_arithmetic_brackets", mult=False)
    batch = task.sample(500, 25, torch.Generator().manual_seed(2))
    texts = [task.to_text(batch, i)[0] for i in range(500)]
    assert not any("*" in t for t in texts) and all(t.count("+") + t.count("-") for t in texts)
    check("modular_arithmetic_brackets", task, batch, [25] * 500)


def test_modular_arithmetic_products_never_overflow():
    """Long chains of * (the authors' int32 products wrap past 2^31): the value mod 5 exactly."""
    digits = torch.tensor([[4] * 40, [3] * 40, [2] * 39 + [0]])
    ops = torch.full((3, 39), 2)
    ops[2, 10] = 1  # 2^11 - 2^29 * 0
    assert evaluate(digits, ops, torch.tensor([40, 40, 40])).tolist() == [4 ** 40 % 5, 3 ** 40 % 5, 2 ** 11 % 5]


# ---------------------------------------------------------------- laws drawn by hand

def test_stack_length_and_bracket_split_are_uniform():
    g = torch.Generator().manual_seed(4)
    task = get_task("stack_manipulation")
    batch = task.sample(9500, 20, g)
    stacks = Counter(next(k for k, v in enumerate(as_authors(task, batch, i)[0]) if v >= 2) for i in range(9500))
    assert set(stacks) == set(range(1, 20)) and max(stacks.values()) < 1.25 * min(stacks.values())
    task = get_task("modular_arithmetic_brackets")
    batch = task.sample(8000, 20, g)
    lefts, ops = Counter(), Counter()
    for i in range(8000):
        text, depth = task.to_text(batch, i)[0][1:-2], 0  # inside the outer brackets
        for k, c in enumerate(text):
            depth += (c == "(") - (c == ")")
            if depth == 0 and c in "+-*" and k > 0 and text[k - 1] not in "+-*":
                lefts[k], ops[c] = lefts[k] + 1, ops[c] + 1
                break
    assert set(lefts) == set(range(1, 17)) and max(lefts.values()) < 1.3 * min(lefts.values())
    assert max(ops.values()) < 1.1 * min(ops.values())


# ---------------------------------------------------------------- layout, score, registry

def test_registry_names_tokens_and_examples():
    assert list(TASKS)[-len(CHOMSKY):] == NAMES and len(NAMES) == 15
    for name in NAMES:
        task = get_task(name)
        assert task.vocab[:3] == SPECIALS and len(set(task.tokens)) == len(task.tokens) and "=" in task.tokens
        assert task.answer_symbols == CLASSES.get(name, 2) and not task.eos
        question, answer = task.example.split(" -> ")
        x = [task.tokens.index(t) for t in (question.split(" ") if task.sep else list(question))[:-1]]
        assert question.endswith("=") and SOLVERS[name](x) == as_authors_answer(task, answer)


def as_authors_answer(task, answer: str) -> list[int]:
    return [2 if t == "#" else int(t) for t in (answer.split(" ") if task.sep else list(answer))]


def test_chomsky_accuracy_masks_after_the_end_token():
    task = get_task("binary_addition")
    batch = task.sample(1, 5, torch.Generator().manual_seed(0))
    pred = batch.targets.clone()
    end = task.token_id("#")
    scored = batch.scored[0].nonzero()[:, 0]
    first_end = int(scored[(batch.targets[0, scored] == end)][0])
    pred[0, first_end + 1:] = task.token_id("1")  # wrong pads: not in the authors' accuracy
    metrics = measure(task, pred, batch)
    assert metrics["chomsky_accuracy"].tolist() == [1.0] and metrics["token_accuracy"].item() < 1
    assert metrics["chomsky_accuracy_per_sequence"].tolist() == [1.0]
    pred[0, scored[0]] = task.token_id("#")  # a wrong first token: 1 of the tokens up to the end
    up_to_end = int((scored <= first_end).sum())
    assert measure(task, pred, batch)["chomsky_accuracy"].item() == pytest.approx(1 - 1 / up_to_end)
    plain = get_task("reverse_string")
    batch = plain.sample(30, 9, torch.Generator().manual_seed(1))
    pred = torch.where(torch.rand(batch.targets.shape) < 0.3, 3, batch.targets)
    metrics = measure(plain, pred, batch)
    assert torch.equal(metrics["chomsky_accuracy"], metrics["token_accuracy"])


def authors_accuracy(pred, batch, end: int) -> tuple[float, float]:
    """(pooled, per-sequence) accuracy of one batch, written out as Delétang et al.'s training script
    computes the first (example.py: sum(mask * right) / sum(mask), the mask up to and including the
    first end token), one row and one token at a time."""
    right = total = 0
    shares = []
    for b in range(len(pred)):
        row_right = row_total = 0
        for j in batch.scored[b].nonzero()[:, 0].tolist():
            row_right += int(pred[b, j] == batch.targets[b, j])
            row_total += 1
            if int(batch.targets[b, j]) == end:
                break
        right, total = right + row_right, total + row_total
        shares.append(row_right / row_total)
    return right / total, sum(shares) / len(shares)


@pytest.mark.parametrize("name", ["stack_manipulation", "binary_addition"])
def test_chomsky_accuracy_pools_tokens_over_each_batch_of_64_as_the_authors(name):
    """Issue 10: for the same predictions (the first 20 answer tokens right), the per-sequence mean
    scored above the authors' statistic; `chomsky_accuracy` is now theirs, pooled over each 64
    sequences, and the per-sequence mean is `chomsky_accuracy_per_sequence`."""
    task = get_task(name)
    batch = task.sample(128, 41, torch.Generator().manual_seed(1))
    first = batch.scored.long().cumsum(1)
    pred = torch.where(batch.scored & (first <= 20), batch.targets, task.token_id("=")).clone()  # then wrong
    metrics = measure(task, pred, batch)
    halves = [authors_accuracy(pred[i:i + 64], batch.select(torch.arange(i, i + 64)), task.token_id("#"))
              for i in (0, 64)]
    pooled = sum(h[0] for h in halves) / 2  # their range evaluation: the mean over sub-batches of 64
    per_sequence = sum(h[1] for h in halves) / 2
    assert float(metrics["chomsky_accuracy"].mean()) == pytest.approx(pooled, abs=1e-6)
    assert float(metrics["chomsky_accuracy_per_sequence"].mean()) == pytest.approx(per_sequence, abs=1e-6)
    assert per_sequence - pooled > 0.01  # shorter answers are more often right in their first 20 tokens
    for half, (mine, _) in zip((0, 64), halves):  # each sub-batch of 64 is pooled on its own
        assert float(metrics["chomsky_accuracy"][half:half + 64].mean()) == pytest.approx(mine, abs=1e-6)


@pytest.mark.parametrize("name", [n for n in NAMES if not get_task(n).end])
def test_without_an_end_token_both_scores_are_the_token_accuracy(name):
    """Every sequence of one length has as many scored tokens, so pooling changes nothing."""
    task = get_task(name)
    batch = task.sample(100, 9, torch.Generator().manual_seed(2))
    pred = torch.where(torch.rand(batch.targets.shape, generator=torch.Generator().manual_seed(3)) < 0.3,
                       task.token_id("="), batch.targets)
    metrics = measure(task, pred, batch)
    assert torch.allclose(metrics["chomsky_accuracy"], metrics["token_accuracy"], atol=1e-6)
    assert torch.equal(metrics["chomsky_accuracy_per_sequence"], metrics["token_accuracy"])


@pytest.mark.parametrize("name", NAMES)
def test_slots_tape_is_inputs_then_output_slots(name):
    """The authors' tape: n inputs then T_out slots, here the '=' and the answer inputs blanked."""
    task = get_task(name)
    lengths = torch.tensor([1, 7, 3, 12])
    batch = task.sample(4, lengths, torch.Generator().manual_seed(0))
    tape = slots_tape(batch)
    for i, n in enumerate(lengths.tolist()):
        size, slots = input_length(name, n), output_length(name, n)
        row = tape.inputs[i]
        assert (row[:size] == batch.inputs[i, :size]).all() and (row[size:size + slots] == BLANK).all()
        assert (row[size + slots:] == 0).all()
        assert batch.scored[i].nonzero()[:, 0].tolist() == list(range(size, size + slots))
    j = torch.arange(batch.inputs.shape[1])[None, :]
    same = (j < batch.widths[:, None]) & (j != batch.question_len[:, None] - 1)  # blank_answers keeps the '='
    assert torch.equal(batch.blank_answers().inputs[same], tape.inputs[same])


@pytest.mark.parametrize("name", NAMES)
def test_reproducible_and_concat_round_trip(name):
    task = get_task(name)
    one = task.sample(16, 9, torch.Generator().manual_seed(9))
    torch.manual_seed(123)  # the global generator is not used
    two = task.sample(16, 9, torch.Generator().manual_seed(9))
    assert torch.equal(one.inputs, two.inputs) and torch.equal(one.targets, two.targets)
    parts = [task.sample(3, n, torch.Generator().manual_seed(n)) for n in (2, 11, 5)]
    joined = Batch.concat(parts)
    texts = [task.to_text(p, i) for p in parts for i in range(3)]
    assert [task.to_text(joined, i) for i in range(9)] == texts
    back = joined.select(torch.arange(3, 6))
    assert torch.equal(back.inputs, parts[1].inputs) and torch.equal(back.targets, parts[1].targets)
    for bad in (0, -3, 2.0, True):
        with pytest.raises(ValueError, match="length"):
            task.sample(2, bad, torch.Generator())
