"""Position coupling (Cho et al. 2024): tasks that supply coupled position IDs, checked
against IDs assigned by hand from the rendered text."""
from __future__ import annotations

import torch

from lengthgen.tasks import get_task
from lengthgen.transforms import build_transform


def addition_ids(question: str, answer: str) -> list[int]:
    """Walk the text: a digit of significance i -> 2 + i, '+' and '=' -> 1 (start 1)."""
    a, b = question[:-1].split("+")
    ids = [2 + len(a) - 1 - j for j in range(len(a))] + [1]
    ids += [2 + len(b) - 1 - j for j in range(len(b))] + [1]
    return ids + [2 + i for i in range(len(answer) - 1)]  # the last answer digit is never an input


def test_decimal_addition_ids_couple_digits_of_equal_significance():
    task = get_task("decimal_addition", coupled=True)
    n = torch.tensor([1, 2, 5, 9, 3] * 6)
    batch = task.sample(len(n), n, torch.Generator().manual_seed(0))
    for i in range(len(batch)):
        question, answer = task.to_text(batch, i)
        expected = addition_ids(question, answer)
        got = batch.position_ids[i].tolist()
        assert got[:len(expected)] == expected, (question, answer, got)
        assert all(p == 0 for p in got[len(expected):])  # padding
    plain = get_task("decimal_addition").sample(len(n), n, torch.Generator().manual_seed(0))
    assert plain.position_ids is None and torch.equal(plain.inputs, batch.inputs)


def test_random_offset_keeps_the_coupling_and_reaches_max_position():
    task = get_task("decimal_addition", coupled=True)
    batch = task.sample(4000, 4, torch.Generator().manual_seed(1))  # input IDs 1..5 (the last digit is no input)
    moved = build_transform("random_offset", {"max_position": 20, "keep_zero": True})(batch, torch.Generator())
    shift = moved.position_ids - batch.position_ids
    real = batch.position_ids > 0
    assert (shift[~real] == 0).all()  # padding stays on 0
    per_sample = shift.masked_fill(~real, -1).amax(1)
    assert ((shift == per_sample[:, None]) | ~real).all()  # one offset per sample: equal IDs stay equal
    assert set(per_sample.tolist()) == set(range(0, 16))  # start uniform, so the largest ID reaches 20
    assert int(moved.position_ids.max()) == 20
