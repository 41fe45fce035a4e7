"""A finite training set (data.dataset_size): drawn once, each sample read exactly once per
epoch in a fresh order, the same batches after a resume."""
from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file

from lengthgen.runtime import checkpoint

from lengthgen.assembly.runs import new_run_config
from lengthgen.errors import ConfigError
from lengthgen.tasks import get_task
from lengthgen.training.finite_set import FiniteSet, training_set
from lengthgen.training.trainer import train

pytestmark = pytest.mark.usefixtures("one_thread")


def rows(batch) -> list[tuple]:
    """Each sample as its question and answer token IDs (unpadded), its identity."""
    out = []
    for i in range(len(batch)):
        q, scored = int(batch.question_len[i]), batch.scored[i]
        out.append((tuple(batch.inputs[i, :q].tolist()), tuple(batch.targets[i, scored].tolist())))
    return out


def test_every_sample_once_per_epoch_in_a_fresh_order():
    task = get_task("decimal_addition", operands="independent", coupled=True)
    size, batch_size = 50, 16  # 4 steps an epoch: 16, 16, 16, 2
    finite = FiniteSet(task, size, batch_size, 5, 9, seed=3)
    stored = rows(finite.samples)
    assert len(set(stored)) == size  # 5..9 digit sums: no two alike
    epochs = []
    for epoch in range(3):
        batches = [finite.batch(epoch * 4 + k) for k in range(4)]
        assert [len(b) for b in batches] == [16, 16, 16, 2]
        seen = [r for b in batches for r in rows(b)]
        assert sorted(seen) == sorted(stored)  # each sample exactly once
        epochs.append(seen)
        assert all(b.inputs.dtype == torch.long and b.position_ids is not None for b in batches)
    assert epochs[0] != epochs[1] != epochs[2]  # reshuffled every epoch
    again = FiniteSet(task, size, batch_size, 5, 9, seed=3)
    assert rows(again.batch(9)) == rows(finite.batch(9))  # a step's batch: a function of (seed, step)
    assert rows(FiniteSet(task, size, batch_size, 5, 9, seed=4).samples) != stored


def test_the_set_follows_the_tasks_law():
    task = get_task("decimal_addition", operands="independent")
    finite = FiniteSet(task, 2000, 100, 1, 6, seed=0)
    lengths = finite.samples.lengths.long()
    # the longer of two uniform counts: P(n = 6) = 11/36, P(n = 1) = 1/36
    assert abs(float((lengths == 6).float().mean()) - 11 / 36) < 0.04
    assert abs(float((lengths == 1).float().mean()) - 1 / 36) < 0.015


def tiny(*extra):
    return new_run_config(None, ["task.name=decimal_addition", "task.train_max=4", "task.options.coupled=true",
                                 "model.position=learned", "model.max_positions=16", "model.d_model=16",
                                 "model.n_layer=1", "model.n_head=2", "train.batch_size=8", "data.dataset_size=20",
                                 "data.position_transform=random_offset",
                                 "data.position_transform_options={max_position=12, keep_zero=true}",
                                 "train.steps=12", "train.checkpoint_interval=6", "train.log_interval=3",
                                 "train.device=cpu", *extra])


def test_a_resumed_run_reads_the_same_batches(tmp_path, monkeypatch):
    """A copy of the run as it stood after step 6 (mid-epoch: 4 steps an epoch, the last of 6
    samples), resumed: the weights at step 12 equal the uninterrupted run's, bit for bit."""
    cfg = tiny("data.dataset_size=30", "train.batch_size=8")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    save = checkpoint.save

    def save_and_copy(folder, step, *args, **kw):
        path = save(folder, step, *args, **kw)
        if step == 6:
            shutil.copytree(folder, cut)
        return path

    monkeypatch.setattr(checkpoint, "save", save_and_copy)
    train(cfg, whole, progress=False)
    monkeypatch.setattr(checkpoint, "save", save)
    assert checkpoint.latest(cut).name == "step_00000006"
    train(cfg, cut, resume=True, progress=False)
    a = load_file(whole / "checkpoints" / "step_00000012" / "model.safetensors")
    b = load_file(cut / "checkpoints" / "step_00000012" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    fresh = tmp_path / "fresh"
    train(tiny("data.dataset_size=0", "train.batch_size=8"), fresh, progress=False)
    c = load_file(fresh / "checkpoints" / "step_00000012" / "model.safetensors")
    assert not all(torch.equal(a[k], c[k]) for k in a)  # a finite set is not the fresh stream


def test_no_set_by_default():
    assert training_set(tiny("data.dataset_size=0"), get_task("decimal_addition")) is None


@pytest.mark.parametrize("override, words", [
    ("data.dataset_size=-1", ["data.dataset_size", "0.."]),
    ("data.curriculum_start=2", ["data.dataset_size", "curriculum"]),
    ("data.length_sampling=per_batch", ["data.dataset_size", "per_sample"]),
    ("data.shards=2", ["data.dataset_size", "data.shards"]),
])
def test_bad_settings_are_one_line_errors(override, words):
    with pytest.raises(ConfigError) as err:
        tiny(override)
    assert "\n" not in str(err.value) and all(w in str(err.value) for w in words), str(err.value)
