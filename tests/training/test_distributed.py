"""Data-parallel training: two gloo processes under torchrun train the weights one process
trains with the same two data shards, write the run folder once, and resume after a kill."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lengthgen.assembly.runs import new_run_config
from lengthgen.errors import UserError
from lengthgen.model.position_transforms import build_transform
from lengthgen.tasks import get_task
from lengthgen.training.distributed import Ranks, shard_seed
from lengthgen.training.trainer import draw_batches, sample_batch, train

# dropout and EMA on: each shard's dropout masks and the averaged weights must match too; no clipping,
# which would hide the scale of the gradients (the Adam moments below compare it)
TINY = ["model.d_model=16", "model.n_layer=1", "model.n_head=2", "model.dropout=0.1", "task.name=copy",
        "task.train_max=4", "train.batch_size=8", "train.log_interval=5", "train.device=cpu", "train.threads=1",
        "optim.ema=0.9", "optim.grad_clip=0"]


def torchrun(*args: str, nproc: int = 2) -> list[str]:
    """`torchrun --standalone` (a free port per call) running `lengthgen`."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
            "-m", "lengthgen", *args]


def run(command: list[str]) -> None:
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]


def weights(folder: Path, step: int) -> tuple[dict, dict]:
    ckpt = folder / "checkpoints" / f"step_{step:08d}"
    return load_file(ckpt / "model.safetensors"), torch.load(ckpt / "optimizer.pt", weights_only=True)


def assert_same_training(a: Path, b: Path, step: int) -> None:
    """Equal weights and Adam moments up to float reduction order. The first moment is linear in
    the gradient, so gradients summed instead of averaged over processes would double it."""
    (wa, oa), (wb, ob) = weights(a, step), weights(b, step)
    assert wa.keys() == wb.keys()
    for key in wa:
        assert torch.allclose(wa[key], wb[key], rtol=1e-5, atol=1e-6), key
    for index, slot in oa["state"].items():
        for moment in ("exp_avg", "exp_avg_sq"):
            assert torch.allclose(slot[moment], ob["state"][index][moment], rtol=1e-4, atol=1e-9), (index, moment)


@pytest.mark.slow
def test_two_processes_train_what_one_process_trains_on_the_same_two_shards(tmp_path, one_thread):
    sets = TINY + ["train.steps=20", "train.checkpoint_interval=10"]
    run(torchrun("train", "--defaults", *(f"--set={s}" for s in sets), "--out", str(tmp_path / "ddp"), "--no-progress"))
    train(new_run_config(None, sets + ["data.shards=2"]), tmp_path / "one", progress=False)
    train(new_run_config(None, sets), tmp_path / "one-stream", progress=False)

    assert_same_training(tmp_path / "ddp", tmp_path / "one", 20)
    other, _ = weights(tmp_path / "one-stream", 20)  # the comparison can fail: other data, other weights
    ddp, _ = weights(tmp_path / "ddp", 20)
    assert not all(torch.allclose(ddp[k], other[k], atol=1e-4) for k in ddp)
    # one config.toml recording the two shards; one metrics line per log step, the mean loss of both
    assert new_run_config(tmp_path / "ddp" / "config.toml").data.shards == 2
    rows = [[json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
            for run in ("ddp", "one")]
    assert [r["step"] for r in rows[0]] == [5, 10, 15, 20]
    assert [r["loss"] for r in rows[0]] == pytest.approx([r["loss"] for r in rows[1]], rel=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc").is_dir(), reason="kills a process group")
def test_killed_data_parallel_run_resumes_to_the_uninterrupted_weights(tmp_path, one_thread):
    sets = TINY + ["train.steps=300", "train.checkpoint_interval=25"]
    killed = tmp_path / "killed"
    proc = subprocess.Popen(torchrun("train", "--defaults", *(f"--set={s}" for s in sets), "--out", str(killed), "--no-progress"),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    pointer = killed / "checkpoints" / "latest"
    try:
        deadline = time.time() + 180
        while time.time() < deadline and not (pointer.exists() and pointer.read_text() >= "step_00000050"):
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.02)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # torchrun and both of its processes
        proc.wait()
    saved = int(pointer.read_text().split("_")[1])
    assert 50 <= saved < 300, "the run finished before it could be killed; make it longer"
    run(torchrun("train", "--resume", "--out", str(killed), "--no-progress"))
    train(new_run_config(None, sets + ["data.shards=2"]), tmp_path / "whole", progress=False)
    assert_same_training(killed, tmp_path / "whole", 300)
    steps = [json.loads(line)["step"] for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(5, 301, 5))  # lines after the checkpoint dropped, none logged twice


def test_one_shard_is_the_stream_of_a_run_before_shards_existed():
    cfg = new_run_config(None, TINY + ["data.position_transform=random_offset",
                                       "data.position_transform_options.max_position=64"])
    task, transform = get_task("copy"), build_transform("random_offset", {"max_position": 64})
    (batch,) = draw_batches(cfg, task, transform, 0, 4, torch.Generator().manual_seed(0), range(1))
    old = torch.Generator().manual_seed(0)  # what the trainer drew before: sample, then transform, from one stream
    expected = transform(sample_batch(task, 8, 1, 4, old, per_sample=True), old)
    assert torch.equal(batch.inputs, expected.inputs) and torch.equal(batch.position_ids, expected.position_ids)


def test_a_shard_depends_on_the_seed_the_shard_and_the_step_only():
    cfg = new_run_config(None, TINY + ["data.shards=4", "data.seed=3"])
    task, none = get_task("copy"), build_transform("none", {})
    every = draw_batches(cfg, task, none, 7, 4, None, range(4))
    assert [len(b) for b in every] == [2, 2, 2, 2]
    # process 1 of 2 draws shards 2 and 3, exactly as a single process draws them
    assert Ranks(rank=1, world=2).shards(4) == range(2, 4)
    theirs = draw_batches(cfg, task, none, 7, 4, None, Ranks(rank=1, world=2).shards(4))
    assert all(torch.equal(a.inputs, b.inputs) for a, b in zip(every[2:], theirs))
    alone = sample_batch(task, 2, 1, 4, torch.Generator().manual_seed(shard_seed("data", 3, 2, 7)), per_sample=True)
    assert torch.equal(every[2].inputs, alone.inputs)
    seeds = {shard_seed(kind, 3, shard, step) for kind in ("data", "dropout") for shard in range(4) for step in range(3)}
    assert len(seeds) == 24 and all(0 <= s < 2**63 for s in seeds)


def test_shards_must_split_among_the_processes(capsys):
    one = new_run_config(None, TINY)
    assert Ranks(rank=0, world=2).sharded(one, resume=False).data.shards == 2  # one shard per process
    assert "data.shards set to 2" in capsys.readouterr().out
    assert one.data.shards == 1  # the caller's config is not changed
    with pytest.raises(UserError, match=r"data.shards \(1\) must be a multiple of the 2 processes"):
        Ranks(rank=0, world=2).sharded(one, resume=True)  # a resumed run keeps its data stream
    with pytest.raises(UserError, match=r"data.shards \(2\) must be a multiple of the 4 processes"):
        Ranks(rank=0, world=4).sharded(new_run_config(None, TINY + ["data.shards=2"]), resume=False)
    with pytest.raises(UserError, match="divide train.batch_size"):
        new_run_config(None, TINY + ["data.shards=3"])
