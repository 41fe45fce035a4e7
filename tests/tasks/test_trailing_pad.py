"""task.trailing_pad: K scored PAD targets after each answer (the released looped code's rows)."""
from __future__ import annotations

import pytest
import torch

from lengthgen.assembly.runs import new_run_config
from lengthgen.errors import ConfigError
from lengthgen.evaluation.evaluate import evaluate_run
from lengthgen.evaluation.settings import EvalSettings
from lengthgen.tasks import IGNORE, PAD, get_task, measure
from lengthgen.tasks.base import TrailingPad, pad_answers
from lengthgen.training.trainer import train


@pytest.mark.parametrize("name", ["parity", "copy", "addition", "binary_sum", "multiplication", "unique_set"])
@pytest.mark.parametrize("k", [1, 3])
def test_each_answer_is_followed_by_k_scored_pads(name, k):
    task = get_task(name)
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 9, (64,), generator=g)
    plain = task.sample(64, lengths, torch.Generator().manual_seed(1))
    padded = TrailingPad(task, k).sample(64, lengths, torch.Generator().manual_seed(1))
    for b in range(64):  # brute force, row by row
        scored = plain.targets[b][plain.targets[b] != IGNORE].tolist()
        assert padded.targets[b][padded.targets[b] != IGNORE].tolist() == scored + [PAD] * k
        first = int((plain.targets[b] != IGNORE).nonzero()[0])
        last = int((plain.targets[b] != IGNORE).nonzero()[-1])
        assert padded.targets[b][first:last + k + 1].ne(IGNORE).all()  # one run of scored positions
        assert padded.inputs[b][:last + 1].tolist() == plain.inputs[b][:last + 1].tolist()
        assert int(padded.inputs[b][last + 1]) == scored[-1]  # ntp reads its last answer token
        assert padded.inputs[b][last + 2:].eq(PAD).all()
    assert padded.widths.tolist() == (plain.widths + k).tolist()
    assert torch.equal(padded.question_len, plain.question_len) and torch.equal(padded.n_steps, plain.n_steps)
    assert TrailingPad(task, k).random_baseline(6) == task.random_baseline(6)  # the pads are known


@pytest.mark.parametrize("name", ["parity", "copy", "binary_sum", "unique_set"])
@pytest.mark.parametrize("k", [0, 2])
def test_pad_to_row_scores_pads_up_to_the_widest_row_then_k(name, k):
    task = get_task(name)
    lengths = torch.randint(1, 9, (48,), generator=torch.Generator().manual_seed(0))
    plain = task.sample(48, lengths, torch.Generator().manual_seed(1))
    padded = TrailingPad(task, k, to_row=True).sample(48, lengths, torch.Generator().manual_seed(1))
    widest = int(plain.widths.max())
    for b in range(48):  # brute force: the answer, then PADs through column widest - 1 + k
        scored = plain.targets[b][plain.targets[b] != IGNORE].tolist()
        first = int((plain.targets[b] != IGNORE).nonzero()[0])
        assert padded.targets[b][first:].tolist() == scored + [PAD] * (widest + k - first - len(scored))
    assert padded.widths.tolist() == [widest + k] * 48  # every row ends at the same column
    assert torch.equal(padded.n_steps, plain.n_steps)


def test_exact_match_counts_the_pads():
    batch = pad_answers(get_task("copy").sample(8, 5, torch.Generator().manual_seed(0)), 2)
    pred = batch.targets.clamp(min=0)
    assert measure(get_task("copy"), pred, batch)["accuracy"].tolist() == [1.0] * 8
    last = batch.widths - 1
    pred[torch.arange(8), last] = 3  # a wrong token where a pad belongs
    assert measure(get_task("copy"), pred, batch)["accuracy"].tolist() == [0.0] * 8


@pytest.mark.parametrize("sets, message", [
    (["task.name=flipflop", "task.train_min=2", "task.train_max=8", "eval.lengths=8"], "scored inside the sequence"),
    (["task.trailing_pad=-1"], "task.trailing_pad must be"),
    (["task.name=decimal_addition", "task.options.coupled=true", "task.train_max=4", "eval.lengths=4"],
     "position IDs"),
])
def test_trailing_pad_is_refused_where_it_cannot_apply(sets, message):
    with pytest.raises(ConfigError, match=message):
        new_run_config(None, ["task.trailing_pad=2", *sets] if "task.trailing_pad=-1" not in sets else sets)


def test_a_looped_run_with_trailing_pads_trains_and_is_evaluated(tmp_path):
    cfg = new_run_config(None, ["method=looped", "task.name=parity", "task.train_max=4", "task.trailing_pad=3",
                                "model.d_model=16", "model.n_layer=1", "model.n_head=2", "train.steps=3",
                                "train.batch_size=8", "train.checkpoint_interval=3", "eval.lengths=2,6",
                                "eval.samples=16"])
    train(cfg, tmp_path / "run", progress=False)
    rows = evaluate_run(tmp_path / "run", EvalSettings(lengths=[2, 6], samples=16, stops=["oracle", "confidence"],
                                                       progress=False))
    assert {(r["length"], r["stop"]) for r in rows} == {(2, "oracle"), (6, "oracle"), (2, "confidence"),
                                                        (6, "confidence")}
    assert "trailing_pad = 3" in (tmp_path / "run" / "config.toml").read_text()
