"""Experiment trackers: TensorBoard event files and an offline W&B run hold every metrics.jsonl
line, a resumed run continues both, and a machine without them trains exactly as before."""
from __future__ import annotations

import json
import struct
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lengthgen.runtime import checkpoint

from lengthgen.assembly.runs import new_run_config
from lengthgen.config.schema import to_toml
from lengthgen.errors import UserError
from lengthgen.reproduction.jobs import config_difference
from lengthgen.training.trainer import train

TINY = ["model.d_model=16", "model.n_layer=1", "model.n_head=2", "task.name=copy", "task.train_max=4",
        "train.batch_size=8", "train.device=cpu", "train.steps=20", "train.log_interval=5",
        "train.checkpoint_interval=10"]
TIMING = ("time", "samples_per_s")  # measured, so they differ between two runs of one config


def tiny(*extra: str):
    return new_run_config(None, TINY + list(extra))


def metrics(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture
def offline_wandb(tmp_path, monkeypatch):
    """W&B as a user without an account has it: WANDB_MODE unset, its own folders in tmp."""
    monkeypatch.delenv("WANDB_MODE", raising=False)
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")


def tensorboard_scalars(folder: Path, tag: str) -> dict[int, float]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder / "tensorboard"))
    events.Reload()  # reads every event file, applying the purge a resumed writer asked for
    steps = [(e.step, e.value) for e in events.Scalars(tag)]
    assert len({s for s, _ in steps}) == len(steps), f"a step logged twice: {steps}"
    return dict(steps)


def wandb_history(run_file: Path) -> list[dict]:
    """The history rows of an offline W&B run file: a LevelDB-style log (32 KiB blocks, 7-byte
    record headers after a 7-byte file header) of protobuf records."""
    from wandb.proto import wandb_internal_pb2

    data, pos, block, pending, rows = run_file.read_bytes(), 7, 32768, b"", []
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a full record, or the last piece of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                             for item in record.history.item})
    return rows


class Stop(Exception):
    pass


@pytest.mark.slow
def test_tensorboard_and_offline_wandb_hold_every_line_and_continue_on_resume(tmp_path, monkeypatch, offline_wandb):
    folder = tmp_path / "run"
    cfg = tiny('train.log_to=["jsonl", "tensorboard", "wandb"]')
    real_save = checkpoint.save

    def killed_at_20(folder, step, *args, **kwargs):  # lines 15 and 20 are logged, the checkpoint of 20 is not
        if step == 20:
            raise Stop
        return real_save(folder, step, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "save", killed_at_20)
    with pytest.raises(Stop):
        train(cfg, folder, progress=False)
    before = metrics(folder)
    assert [r["step"] for r in before] == [5, 10, 15, 20]
    assert sorted(tensorboard_scalars(folder, "train/loss")) == [5, 10, 15, 20]
    run_id = (folder / "wandb" / "run_id").read_text().strip()
    monkeypatch.setattr(checkpoint, "save", real_save)
    time.sleep(1.0)  # W&B names an offline run folder by its start second: two sessions in one second share one
    train(cfg, folder, resume=True, progress=False)

    rows = metrics(folder)
    assert [r["step"] for r in rows] == [5, 10, 15, 20] and rows[:2] == before[:2]
    assert rows[2]["loss"] == pytest.approx(before[2]["loss"], rel=1e-6)  # a resumed run trains the same steps
    for key in ("loss", "lr", "max_length", "samples_per_s", "time"):
        logged = tensorboard_scalars(folder, f"train/{key}")  # events after step 10 were purged and logged anew
        assert logged == pytest.approx({r["step"]: r[key] for r in rows}, rel=1e-6), key

    assert (folder / "wandb" / "run_id").read_text().strip() == run_id  # the resumed run is the same W&B run
    runs = sorted((folder / "wandb").glob(f"offline-run-*-{run_id}/run-{run_id}.wandb"))
    assert len(runs) == 2, "an offline run folder per training session"
    first, second = (wandb_history(run) for run in runs)
    assert [h["train/step"] for h in first] == [5, 10, 15, 20] and [h["train/step"] for h in second] == [15, 20]
    for logged, row in zip(first[:2] + second, rows):
        assert {k: logged[f"train/{k}"] for k in row} == pytest.approx(row)


@pytest.fixture
def trackers_missing(monkeypatch):
    """TensorBoard and W&B as on a machine without them: importing either fails."""
    for name in ("wandb", "tensorboard", "torch.utils.tensorboard"):
        monkeypatch.setitem(sys.modules, name, None)


def test_without_the_trackers_nothing_changes_unless_one_is_asked_for(tmp_path, trackers_missing):
    train(tiny(), tmp_path / "without", progress=False)
    assert sorted(p.name for p in (tmp_path / "without").iterdir()) == ["checkpoints", "config.toml", "metrics.jsonl"]
    with pytest.MonkeyPatch.context() as installed:  # the same run where the packages are importable
        for name in ("wandb", "tensorboard", "torch.utils.tensorboard"):
            installed.delitem(sys.modules, name, raising=False)
        train(tiny(), tmp_path / "with", progress=False)
    drop = lambda rows: [{k: v for k, v in r.items() if k not in TIMING} for r in rows]  # noqa: E731
    assert drop(metrics(tmp_path / "without")) == drop(metrics(tmp_path / "with"))
    a = load_file(tmp_path / "without" / "checkpoints" / "step_00000020" / "model.safetensors")
    b = load_file(tmp_path / "with" / "checkpoints" / "step_00000020" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)

    for sink in ("tensorboard", "wandb"):  # asked for but missing: one line naming the extra, nothing written
        with pytest.raises(UserError) as err:
            train(tiny(f'train.log_to=["jsonl", "{sink}"]'), tmp_path / sink, progress=False)
        assert str(err.value) == f"train.log_to '{sink}' needs the {sink} package: pip install 'lengthgen[{sink}]'"
        assert not (tmp_path / sink).exists()


def test_log_to_is_checked_and_changes_no_result(tmp_path):
    assert new_run_config(None).train.log_to == ["jsonl"]  # a config.toml written before the key loads as before
    with pytest.raises(UserError, match=r"train.log_to names 'tensorbord' \(did you mean tensorboard\?\)"):
        tiny('train.log_to=["jsonl", "tensorbord"]')
    # where a run logs is not what it computes: a reproduction does not take it for another config
    (tmp_path / "config.toml").write_text(to_toml(tiny()))
    assert config_difference(tmp_path, tiny('train.log_to=["jsonl", "wandb"]')) is None
    assert "optim.lr" in config_difference(tmp_path, tiny("optim.lr=0.1"))


def test_cli_refuses_a_missing_tracker_in_one_line(tmp_path, trackers_missing, capsys):
    from lengthgen.cli import main

    args = [f"--set={s}" for s in TINY] + ['--set=train.log_to=["wandb"]', "--out", str(tmp_path / "run")]
    assert main(["train", "--defaults", *args, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err == "lengthgen: error: train.log_to 'wandb' needs the wandb package: pip install 'lengthgen[wandb]'\n"
    assert not (tmp_path / "run").exists()
