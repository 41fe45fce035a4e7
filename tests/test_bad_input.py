"""Bad input of every kind is one line naming the problem (UserError, exit code 2),
raised before anything is written; finished results are never lost."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from lengthgen import cli

from lengthgen.runtime import checkpoint

from lengthgen.config import schema as config

from lengthgen.assembly.runs import new_run_config
from lengthgen.errors import ConfigError, UserError
from lengthgen.evaluation.evaluate import load_run
from lengthgen.runtime.devices import pick_device
from lengthgen.training.run_state import decay_params
from lengthgen.training.trainer import train

TINY = ["model.d_model=16", "model.n_layer=1", "model.n_head=2", "task.name=copy", "task.train_max=4",
        "train.batch_size=8", "train.device=cpu", "train.steps=2", "train.threads=1", "train.log_interval=1"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One tiny finished run; tests damage copies of it."""
    folder = tmp_path_factory.mktemp("finished") / "run"
    train(new_run_config(None, TINY), folder, progress=False)
    return folder


@pytest.fixture
def run(finished_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(finished_run, copy)
    return copy


def state_file(folder):
    return checkpoint.latest(folder) / "state.json"


def one_line(err) -> str:
    message = str(err.value)
    assert "\n" not in message
    return message


# --- config values -------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, names", [
    (["optim.betas=[false, 0.99]"], ["optim.betas"]),
    (["optim.lr=inf"], ["optim.lr", "finite"]),
    (["optim.weight_decay=inf"], ["optim.weight_decay", "finite"]),
    (["model.position=rope", "model.position_options.theta=inf"], ["model.position_options", "finite"]),
    (["train.threads=100000"], ["train.threads", "1024"]),
    (["data.seed=100000000000000000000"], ["data.seed", "2**63"]),
    (["train.model_seed=-1"], ["train.model_seed"]),
    (["eval.seed=100000000000000000000"], ["eval.seed"]),
    (["eval.lengths=1:2000000000"], ["eval.lengths", "10000"]),
    (["eval.lengths=1,200000"], ["eval.lengths", "100000"]),
    (["task.train_max=2000000000"], ["task.train_max", "100000"]),
    (["train.device=cpu:abc"], ["train.device"]),
    (["optim.schedule=constant", "optim.warmup_steps=10"], ["optim.warmup_steps", "constant"]),
    (["model.position=learned", "model.max_positions=8"], ["model.max_positions", "task.train_max"]),
    (["task.name=copy", "model.position=sinusoidal", "model.max_positions=30", "method=ntp-pause"],
     ["model.max_positions", "at least 36"]),
])
def test_impossible_values_are_refused_naming_the_key(overrides, names):
    with pytest.raises(ConfigError) as err:
        new_run_config(None, overrides)
    message = one_line(err)
    for name in names:
        assert name in message


def test_integer_betas_become_floats_adamw_accepts():
    cfg = new_run_config(None, ["optim.betas=[0, 0.99]"])
    assert cfg.optim.betas == [0.0, 0.99] and all(isinstance(b, float) for b in cfg.optim.betas)
    torch.optim.AdamW(decay_params(torch.nn.Linear(2, 2)), betas=tuple(cfg.optim.betas))


def test_position_table_that_fits_the_training_lengths_is_accepted():
    # copy at train_max 12 reads 12 + 1 + 11 input tokens (the last answer token is only a target)
    new_run_config(None, ["task.name=copy", "model.position=learned", "model.max_positions=24"])
    with pytest.raises(ConfigError, match="at least 24"):
        new_run_config(None, ["task.name=copy", "model.position=learned", "model.max_positions=23"])


def test_eval_lengths_accepts_a_bare_integer(tmp_path):
    cfg = new_run_config(None, ["eval.lengths=24"])
    assert cfg.eval.lengths == "24" and config.parse_lengths(cfg.eval.lengths) == [24]
    preset = tmp_path / "p.toml"
    preset.write_text("[eval]\nlengths = 7\n")
    assert new_run_config(preset).eval.lengths == "7"


def test_preset_that_is_not_utf8_or_is_a_directory(tmp_path):
    latin = tmp_path / "latin.toml"
    latin.write_bytes("# caf\xe9\n[model]\nd_model = 32\n".encode("latin-1"))
    with pytest.raises(ConfigError, match="UTF-8"):
        new_run_config(latin)
    with pytest.raises(ConfigError, match="is a folder, not a TOML file"):
        new_run_config(tmp_path)


def test_unavailable_device_is_refused(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name in ("mps:0", "mps", "cuda:1"):
        with pytest.raises(UserError, match="not available"):
            pick_device(name)
    assert pick_device("cpu") == torch.device("cpu")


# --- run folders ---------------------------------------------------------------------------

def test_out_that_is_a_file_is_refused(tmp_path, capsys):
    file = tmp_path / "notes.txt"
    file.write_text("keep me")
    cfg = new_run_config(None, TINY)
    for folder in (file, file / "sub"):
        with pytest.raises(UserError, match="is a file, not a folder"):
            train(cfg, folder, progress=False)
        with pytest.raises(UserError, match="is a file, not a folder"):
            train(cfg, folder, resume=True, progress=False)
    assert cli.main(["train", "--defaults", "--out", str(file), *[f"--set={s}" for s in TINY], "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lengthgen: error:") and err.count("\n") == 1
    assert file.read_text() == "keep me"


# --- checkpoints ---------------------------------------------------------------------------

@pytest.mark.parametrize("edit", [
    lambda s: {},
    lambda s: [1],
    lambda s: {**s, "config": 5},
    lambda s: {k: v for k, v in s.items() if k != "step"},
    lambda s: {**s, "step": "3"},
    lambda s: {**s, "config": {**s["config"], "model": {"d_model": "big"}}},
], ids=["empty", "list", "config-int", "no-step", "step-str", "config-bad-value"])
def test_state_json_with_wrong_contents_is_a_one_line_error(run, edit):
    path = state_file(run)
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    for attempt in (lambda: train(None, run, resume=True, progress=False), lambda: load_run(run)):
        with pytest.raises(UserError) as err:
            attempt()
        assert str(path) in one_line(err)


@pytest.mark.parametrize("key, value", [("data_rng", "AAAA"), ("torch_rng", "!!"), ("data_rng", 5)])
def test_corrupt_rng_state_is_a_one_line_error(run, key, value):
    path = state_file(run)
    path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))
    metrics = (run / "metrics.jsonl").read_text()
    with pytest.raises(UserError) as err:
        train(None, run, resume=True, progress=False)
    assert str(path) in one_line(err) and key in one_line(err)
    assert (run / "metrics.jsonl").read_text() == metrics


def test_flipped_byte_in_weights_is_detected(run):
    weights = checkpoint.latest(run) / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # inside the last tensor: still a valid file, one weight changed
    weights.write_bytes(bytes(data))
    for attempt in (lambda: train(None, run, resume=True, progress=False), lambda: load_run(run)):
        with pytest.raises(UserError, match="sha256") as err:
            attempt()
        assert str(weights) in one_line(err)


def test_checkpoint_records_digests_and_older_ones_still_load(run):
    path = state_file(run)
    state = json.loads(path.read_text())
    assert set(state["sha256"]) == {"model.safetensors", "optimizer.pt"}
    del state["sha256"], state["state_sha256"]  # a checkpoint written before digests were recorded
    path.write_text(json.dumps(state))
    assert load_run(run)[-1] == 2
    assert train(None, run, resume=True, progress=False)["step"] == 2


def test_optimizer_state_of_another_model_is_refused(run, tmp_path):
    other = tmp_path / "other"
    train(new_run_config(None, TINY + ["model.d_model=32"]), other, progress=False)
    swapped = checkpoint.latest(run) / "optimizer.pt"
    shutil.copy(checkpoint.latest(other) / "optimizer.pt", swapped)
    with pytest.raises(UserError, match="sha256"):
        train(None, run, resume=True, progress=False)
    loose = tmp_path / "optimizer.pt"  # outside a checkpoint: no digest, the shapes are checked
    shutil.copy(swapped, loose)
    _, _, _, model, _ = load_run(run)
    with pytest.raises(UserError, match="does not match the model") as err:
        checkpoint.load_optimizer(torch.optim.AdamW(decay_params(model)), loose)
    one_line(err)


# --- metrics.jsonl on resume ---------------------------------------------------------------

def test_partial_last_metrics_line_is_dropped_on_resume(run, capsys):
    metrics = run / "metrics.jsonl"
    whole = metrics.read_text()
    with metrics.open("a") as f:
        f.write('{"step": 3, "lo')  # the run was killed mid-write
    train(None, run, resume=True, progress=False)
    assert metrics.read_text() == whole
    assert "metrics.jsonl" in capsys.readouterr().err


def test_a_damaged_metrics_line_in_the_middle_is_dropped_with_a_note_on_resume(run, capsys):
    """The checkpoint, not the log, is what resumes: the damaged line goes, named, the rest stays."""
    metrics = run / "metrics.jsonl"
    whole = metrics.read_text()
    lines = whole.splitlines(keepends=True)
    metrics.write_text(lines[0] + "garbage\n" + "".join(lines[1:]))
    train(None, run, resume=True, progress=False)
    assert metrics.read_text() == whole
    assert f"skipped 1 damaged line(s) of {metrics} (first: line 2)" in capsys.readouterr().err
