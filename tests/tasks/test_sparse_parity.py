"""Sparse parity: exactly k selectors, k's distribution in training, and the checks on k."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from lengthgen.assembly.runs import new_run_config
from lengthgen.config.schema import ConfigError
from lengthgen.tasks import get_task
from tests.helpers.task_checks import check_answers, check_layout, solve_sparse_parity


@pytest.mark.parametrize("layout", ["blocks", "pairs"])
@pytest.mark.parametrize("k", [1, 4, 7])
def test_a_fixed_k_selects_exactly_k_bits_and_the_answer_is_their_xor(k, layout):
    task = get_task("sparse_parity", k=k, layout=layout)
    n = torch.tensor([7, 9, 12, 30] * 8)
    batch = task.sample(len(n), n, torch.Generator().manual_seed(k))
    check_layout(task, batch, n)
    check_answers(task, batch, n, lambda q, m: solve_sparse_parity(q, m, k=k, layout=layout))


def test_the_pairs_layout_puts_each_selector_after_its_bit():
    blocks, pairs = (get_task("sparse_parity", k=2, layout=layout) for layout in ("blocks", "pairs"))
    a, b = (task.sample(1, 3, torch.Generator().manual_seed(5)) for task in (blocks, pairs))
    (qa, answer_a), (qb, answer_b) = blocks.to_text(a, 0), pairs.to_text(b, 0)
    assert qb == "".join(x + z for x, z in zip(qa[:3], qa[3:6])) + "=" and answer_a == answer_b
    with pytest.raises(ValueError, match="layout must be 'blocks' or 'pairs', got 'mixed'"):
        get_task("sparse_parity", layout="mixed")


def test_training_draws_k_uniformly_up_to_k_max_and_never_past_the_length():
    task = get_task("sparse_parity", k_max=4)
    batch = task.sample(4000, 10, torch.Generator().manual_seed(0))
    ks = Counter(task.to_text(batch, i)[0].count("+") for i in range(len(batch)))
    assert sorted(ks) == [1, 2, 3, 4]
    assert all(abs(count / 4000 - 0.25) < 0.03 for count in ks.values()), ks
    short = task.sample(500, 2, torch.Generator().manual_seed(1))
    assert {task.to_text(short, i)[0].count("+") for i in range(500)} == {1, 2}


def test_every_position_is_selected_equally_often():
    task = get_task("sparse_parity", k=3)
    batch = task.sample(6000, 12, torch.Generator().manual_seed(2))
    selectors = batch.inputs[:, 12:24] == task.token_id("+")
    share = selectors.float().mean(0)  # each of 12 positions: 3/12
    assert (share - 0.25).abs().max() < 0.03, share
    answers = batch.targets[:, -1] - task.token_id("0")
    assert abs(answers.float().mean() - 0.5) < 0.03  # the random baseline is 1/2


def test_k_larger_than_the_length_is_refused():
    with pytest.raises(ValueError, match="k = 5 selected bits need length >= 5, got 4"):
        get_task("sparse_parity", k=5).sample(2, 4, torch.Generator())
    with pytest.raises(ValueError, match="k_max must be an integer >= 1"):
        get_task("sparse_parity", k_max=0)
    with pytest.raises(ConfigError, match=r"eval.lengths includes 4; sparse_parity with k=8 needs lengths >= 8"):
        new_run_config(None, ["task.name=sparse_parity", "eval.lengths=4,16", "eval.sweep={k=[4, 8]}"])
    with pytest.raises(ConfigError, match="task.train_min must be >= 6"):
        new_run_config(None, ["task.name=sparse_parity", "task.options={k=6}", "task.train_min=2"])
