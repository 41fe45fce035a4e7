"""Position coupling (Cho et al. 2024): tasks that supply coupled position IDs, checked
against IDs assigned by hand from the rendered text."""
from __future__ import annotations

import pytest
import torch

from lengthgen.tasks import IGNORE, get_task
from tests.helpers.task_checks import check_layout
from lengthgen.model.position_transforms import build_transform


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


def test_operands_of_different_lengths_are_summed_and_coupled_by_significance():
    task = get_task("decimal_addition", coupled=True, operands="different")
    n = torch.tensor([1, 3, 6, 10] * 25)
    batch = task.sample(len(n), n, torch.Generator().manual_seed(5))
    check_layout(task, batch, n)
    shorter = set()
    for i in range(len(batch)):
        question, answer = task.to_text(batch, i)
        a, b = question[:-1].split("+")
        assert max(len(a), len(b)) == int(n[i]) and min(len(a), len(b)) >= 1
        assert answer == str(int(a) + int(b)).zfill(int(n[i]) + 1)[::-1]
        assert batch.position_ids[i, :int(batch.widths[i])].tolist() == addition_ids(question, answer)
        shorter.add("a" if len(a) < len(b) else "b" if len(b) < len(a) else "=")
    assert shorter == {"a", "b", "="}  # either operand can be the short one


def test_random_offset_keeps_the_coupling_and_reaches_max_position():
    task = get_task("decimal_addition", coupled=True)
    batch = task.sample(4000, 4, torch.Generator().manual_seed(1))  # IDs 1..6 (6: the last digit, a target only)
    moved = build_transform("random_offset", {"max_position": 20, "keep_zero": True})(batch, torch.Generator())
    shift = moved.position_ids - batch.position_ids
    real = batch.position_ids > 0
    assert (shift[~real] == 0).all()  # padding stays on 0
    per_sample = shift.masked_fill(~real, -1).amax(1)
    assert ((shift == per_sample[:, None]) | ~real).all()  # one offset per sample: equal IDs stay equal
    assert set(per_sample.tolist()) == set(range(0, 15))  # start uniform, so the largest ID reaches 20
    scored = batch.target_ids != IGNORE
    assert torch.equal((moved.target_ids - batch.target_ids)[scored], per_sample[:, None].expand_as(scored)[scored])
    assert int(moved.target_ids.max()) == 20 and (moved.target_ids[~scored] == IGNORE).all()


def test_target_ids_are_the_next_tokens_ids():
    """At a scored column j, target_ids[j] is the ID of the token at j + 1 (the last answer
    digit, never an input, takes the next significance's ID)."""
    task = get_task("decimal_addition", coupled=True)
    n = torch.tensor([1, 3, 6] * 4)
    batch = task.sample(len(n), n, torch.Generator().manual_seed(3))
    for i in range(len(batch)):
        question, answer = task.to_text(batch, i)
        every = addition_ids(question, answer + "x")  # the IDs of the question and all answer digits
        columns = batch.scored[i].nonzero()[:, 0].tolist()
        assert [int(batch.target_ids[i, j]) for j in columns] == [every[j + 1] for j in columns]
        assert (batch.target_ids[i][~batch.scored[i]] == IGNORE).all()


def test_transforms_that_move_columns_refuse_predicted_ids():
    batch = get_task("decimal_addition", coupled=True).sample(4, 3, torch.Generator())
    for name, options in (("pose", {"target_length": 64}), ("randomized", {"max_position": 64})):
        with pytest.raises(ValueError, match=f"{name} cannot move the predicted position IDs"):
            build_transform(name, options)(batch, torch.Generator())


def test_decimal_multiplication_ids_couple_digits_of_equal_significance():
    for m in (1, 2, 3):
        task = get_task("decimal_multiplication", b_digits=m, coupled=True)
        n = torch.tensor([1, 2, 6, 9] * 4)
        batch = task.sample(len(n), n, torch.Generator().manual_seed(m))
        for i in range(len(batch)):
            question, answer = task.to_text(batch, i)
            a, b = question[:-1].split("*")
            every = [2 + len(a) - 1 - j for j in range(len(a))] + [1] + [2 + len(b) - 1 - j for j in range(len(b))]
            every += [1] + [2 + s for s in range(len(answer))]
            width = int(batch.widths[i])
            assert batch.position_ids[i, :width].tolist() == every[:width], (question, answer)
            columns = batch.scored[i].nonzero()[:, 0].tolist()
            assert [int(batch.target_ids[i, j]) for j in columns] == [every[j + 1] for j in columns]


def walk_ids(task_name: str, question: str, answer: str) -> tuple[list[int], list[int]]:
    """(IDs of every token of question + answer, incl. the EOS of unique_set, by hand)."""
    if task_name == "copy":
        bits = question[:-1]
        return [2 + i for i in range(len(bits))] + [1] + [2 + i for i in range(len(answer))]
    symbols, kept = question.split()[:-1], answer.split()
    first = {s: symbols.index(s) for s in kept}
    return [2 + p for p in range(len(symbols))] + [1] + [2 + first[s] for s in kept] + [0]  # EOS: 0


def test_copy_and_unique_set_ids_point_at_the_input_they_copy():
    for name, options in (("copy", {}), ("unique_set", {"symbols": 6})):
        task = get_task(name, coupled=True, **options)
        n = torch.tensor([1, 4, 9, 12] * 5)
        batch = task.sample(len(n), n, torch.Generator().manual_seed(4))
        for i in range(len(batch)):
            question, answer = task.to_text(batch, i)
            every = walk_ids(name, question, answer)
            width = int(batch.widths[i])  # the inputs: all but the last answer token (or the EOS)
            assert batch.position_ids[i, :width].tolist() == every[:width], (name, question, answer)
            assert (batch.position_ids[i, width:] == 0).all()
            columns = batch.scored[i].nonzero()[:, 0].tolist()
            assert [int(batch.target_ids[i, j]) for j in columns] == [every[j + 1] for j in columns]
        plain = get_task(name, **options).sample(len(n), n, torch.Generator().manual_seed(4))
        assert plain.position_ids is None and plain.target_ids is None and torch.equal(plain.inputs, batch.inputs)


def abacus_ids(question: str, answer: str) -> list[int]:
    """Walk the text: each number's digits counted from its own units digit, 1, 2, ...; '+' and
    '=' -> 0. (The answer is written units first; its last digit is never an input.)"""
    a, b = question[:-1].split("+")
    ids = [len(a) - j for j in range(len(a))] + [0] + [len(b) - j for j in range(len(b))] + [0]
    return ids + [1 + i for i in range(len(answer) - 1)]


@pytest.mark.parametrize("operands", ["equal", "different", "independent"])
def test_abacus_ids_restart_at_every_number(operands):
    task = get_task("decimal_addition", abacus=True, operands=operands)
    n = torch.tensor([1, 2, 5, 9, 3] * 6)
    batch = (task.sample_range(len(n), 1, 9, torch.Generator().manual_seed(2)) if operands == "independent"
             else task.sample(len(n), n, torch.Generator().manual_seed(2)))
    for i in range(len(batch)):
        question, answer = task.to_text(batch, i)
        expected, got = abacus_ids(question, answer), batch.position_ids[i].tolist()
        assert got[:len(expected)] == expected, (question, answer, got)
        assert all(p == 0 for p in got[len(expected):])
        starts = [k for k, p in enumerate(expected) if p == 1]
        assert len(starts) == 3  # a's units digit, b's and the sum's: one restart per number
    with pytest.raises(ValueError, match="choose one"):
        get_task("decimal_addition", abacus=True, coupled=True)
