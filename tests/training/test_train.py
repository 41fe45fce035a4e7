"""Trainer: learning, curriculum, schedule, checkpoints, resume, divergence."""
from __future__ import annotations

import json
import sys

import pytest
import torch
from safetensors.torch import load_file

from lengthgen.assembly.runs import Run, new_run_config
from lengthgen.errors import ConfigError, TrainingDiverged, UserError
from lengthgen.evaluation.evaluate import Measure, accuracy_at, load_run
from lengthgen.evaluation.settings import EvalSettings
from lengthgen.methods.next_token import NextTokenPrediction
from lengthgen.tasks import get_task
from lengthgen.config.schedules import curriculum_end, curriculum_max, learning_rate
from lengthgen.training.run_state import decay_params
from lengthgen.training.trainer import sample_batch, train
from tests.helpers.tiny_runs import killed_after

TINY = ["model.d_model=16", "model.n_layer=1", "model.n_head=2", "task.name=copy", "task.train_max=4",
        "train.batch_size=8", "train.log_interval=5", "train.device=cpu"]


def tiny(*extra: str):
    return new_run_config(None, TINY + list(extra))


@pytest.mark.slow
def test_tiny_run_learns_copy(tmp_path):
    """A small RoPE decoder must copy perfectly at its training lengths. 400 steps score 1.0 at 3
    and 6 (as 600 did); 300 steps 1.0 / 0.977 (seed 1: 1.0 / 1.0), 150 steps 1.0 / 0.672, a miss
    (2026-12-07)."""
    cfg = new_run_config(None, ["task.name=copy", "task.train_max=6", "model.d_model=64", "model.n_layer=2",
                             "model.position=rope", "train.steps=400", "optim.lr=0.002", "optim.warmup_steps=50",
                             "train.log_interval=100", "train.checkpoint_interval=400", "train.device=cpu"])
    train(cfg, tmp_path / "run", progress=False)
    _, task, method, model, step = load_run(tmp_path / "run")
    assert step == 400
    for n in (3, 6):
        acc, *_ = accuracy_at(Measure(method, model, 256, 256, seed=7, device=torch.device("cpu")), task, n)
        assert acc >= 0.95, (n, acc)
    losses = [json.loads(line)["loss"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < 0.1 * losses[0]


def test_curriculum_and_schedules():
    cfg = tiny("task.train_max=10", "data.curriculum_start=2", "data.curriculum_interval=100",
               "train.steps=2000", "optim.schedule=curriculum_cosine", "optim.lr=0.01")
    assert [curriculum_max(cfg, s) for s in (0, 99, 100, 250, 800, 5000)] == [2, 2, 3, 4, 10, 10]
    assert curriculum_end(cfg) == 800
    assert learning_rate(cfg, 0) == learning_rate(cfg, 799) == 0.01  # constant until the curriculum ends
    assert learning_rate(cfg, 1400) == pytest.approx(0.005)  # halfway through the decay
    assert learning_rate(cfg, 2000) == pytest.approx(0.0)
    cos = tiny("train.steps=1000", "optim.warmup_steps=100", "optim.lr=0.01", "optim.min_lr_ratio=0.1")
    assert learning_rate(cos, 0) == pytest.approx(1e-4)
    assert learning_rate(cos, 99) == pytest.approx(0.01)
    assert learning_rate(cos, 550) == pytest.approx(0.0055)
    assert learning_rate(cos, 1000) == pytest.approx(0.001)
    line = tiny("train.steps=1000", "optim.warmup_steps=100", "optim.lr=0.01", "optim.schedule=linear")
    assert learning_rate(line, 99) == pytest.approx(0.01)
    assert learning_rate(line, 325) == pytest.approx(0.0075)  # a quarter of the way down
    assert learning_rate(line, 1000) == pytest.approx(0.0)
    assert curriculum_max(tiny(), 0) == 4  # no curriculum: the maximum from the start
    late = tiny("task.train_max=10", "data.curriculum_start=2", "data.curriculum_interval=100",
                "train.steps=2000", "optim.schedule=curriculum_cosine", "optim.lr=0.01", "optim.cosine_start=1000")
    assert learning_rate(late, 999) == learning_rate(late, 1000) == 0.01  # held past the curriculum's end
    assert learning_rate(late, 1500) == pytest.approx(0.005)


def test_decay_all_decays_biases_and_norms_too():
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.LayerNorm(3))
    matrices, rest = decay_params(model)
    assert [p.dim() for p in matrices["params"]] == [2] and rest["weight_decay"] == 0.0 and len(rest["params"]) == 3
    (every,) = decay_params(model, decay_all=True)
    assert len(every["params"]) == 4 and "weight_decay" not in every  # the optimizer's own decay for all


def test_sample_batch_lengths():
    task, g = get_task("parity"), torch.Generator().manual_seed(0)
    mixed = sample_batch(task, 512, 3, 9, g, per_sample=True)
    assert set(mixed.lengths.tolist()) == set(range(3, 10))
    single = sample_batch(task, 64, 3, 9, g, per_sample=False)
    assert len(set(single.lengths.tolist())) == 1


def test_run_folder_is_never_overwritten_without_force(tmp_path):
    cfg = tiny("train.steps=5")
    train(cfg, tmp_path / "run", progress=False)
    before = (tmp_path / "run" / "metrics.jsonl").read_text()
    with pytest.raises(UserError, match="already exists"):
        train(cfg, tmp_path / "run", progress=False)
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == before
    train(cfg, tmp_path / "run", force=True, progress=False)
    with pytest.raises(UserError, match="no checkpoint"):
        train(cfg, tmp_path / "empty", resume=True, progress=False)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = NextTokenPrediction.loss

    def poisoned(self, model, batch):
        calls["n"] += 1
        loss = real(self, model, batch)
        return loss * float("nan") if calls["n"] > 12 else loss

    monkeypatch.setattr(NextTokenPrediction, "loss", poisoned)
    cfg = tiny("train.steps=40", "train.checkpoint_interval=10")
    with pytest.raises(TrainingDiverged, match="NaN or inf"):
        train(cfg, tmp_path / "run", progress=False)
    latest = (tmp_path / "run" / "checkpoints" / "latest").read_text()
    assert latest == "step_00000010"
    weights = load_file(tmp_path / "run" / "checkpoints" / latest / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_ema_weights_follow_the_recursion(tmp_path):
    cfg = tiny("train.steps=1", "optim.ema=0.9", "optim.lr=0.05")
    torch.manual_seed(cfg.train.model_seed)
    init = NextTokenPrediction().build_model(cfg, get_task("copy")).state_dict()
    train(cfg, tmp_path / "run", progress=False)
    ckpt = tmp_path / "run" / "checkpoints" / "step_00000001"
    new, ema = load_file(ckpt / "model.safetensors"), load_file(ckpt / "ema.safetensors")
    name = "blocks.0.mlp.fc.weight" if "blocks.0.mlp.fc.weight" in new else next(k for k in new if k.endswith("weight") and new[k].dim() == 2)
    assert not torch.equal(new[name], init[name])
    assert torch.allclose(ema[name], 0.9 * init[name] + 0.1 * new[name], atol=1e-6)


def test_ema_start_restarts_the_ema_from_the_weights_then(tmp_path):
    """optim.ema_start = 3: the EMA is the weights after step 3, then follows the recursion (the
    released code's restart at the curriculum's end). Run A stops at step 3 with the same data
    and constant rate, so its weights are B's at step 3."""
    a = tiny("train.steps=3", "optim.lr=0.05", "optim.schedule=constant")
    b = tiny("train.steps=4", "optim.lr=0.05", "optim.schedule=constant", "optim.ema=0.9", "optim.ema_start=3")
    train(a, tmp_path / "a", progress=False)
    train(b, tmp_path / "b", progress=False)
    at3 = load_file(tmp_path / "a" / "checkpoints" / "step_00000003" / "model.safetensors")
    ckpt = tmp_path / "b" / "checkpoints" / "step_00000004"
    new, ema = load_file(ckpt / "model.safetensors"), load_file(ckpt / "ema.safetensors")
    for name in new:
        assert torch.allclose(ema[name], 0.9 * at3[name] + 0.1 * new[name], atol=1e-6), name
    assert any(not torch.equal(at3[k], new[k]) for k in new)
    with pytest.raises(ConfigError, match="optim.ema_start must be in 0..train.steps - 1"):
        tiny("train.steps=4", "optim.ema_start=4")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "lengthgen", *args]


@pytest.mark.slow
def test_resume_after_kill_matches_an_uninterrupted_run(tmp_path):
    """Kill a run after its first checkpoints, resume it: same final step, same weights. Only the
    killed run is a process of its own (SIGKILL, as a crash); the uninterrupted run and the resume
    are the same `lengthgen train` commands run in this process (one torch thread, as
    train.threads=1 sets in the child), which saves two interpreter and torch starts."""
    from lengthgen.cli import main
    sets = [f"--set={s}" for s in TINY + ["train.steps=300", "train.checkpoint_interval=25", "train.threads=1"]]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert main(["train", "--defaults", *sets, "--out", str(whole), "--no-progress"]) == 0
    saved = killed_after(_cli("train", "--defaults", *sets, "--out", str(killed), "--no-progress"), killed)
    pointer = killed / "checkpoints" / "latest"
    assert 50 <= saved < 300, "the run finished before it could be killed; make it longer"
    # a loaded state equals what was saved
    _, _, _, model, step = load_run(killed)
    stored = load_file(killed / "checkpoints" / pointer.read_text() / "model.safetensors")
    assert step == saved
    assert all(torch.equal(model.state_dict()[k], v) for k, v in stored.items())
    assert main(["train", "--resume", "--out", str(killed), "--no-progress"]) == 0
    a = load_file(whole / "checkpoints" / "step_00000300" / "model.safetensors")
    b = load_file(killed / "checkpoints" / "step_00000300" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    steps, seconds = [r["step"] for r in rows], [r["time"] for r in rows]
    assert steps == sorted(set(steps)) and steps[-1] == 300
    assert seconds == sorted(seconds)  # training time goes on from the checkpoint's, it does not restart at 0


def test_bf16_training_is_refused_where_the_device_lacks_it(tmp_path, monkeypatch):
    """Without native bf16 (an AVX2-only CPU) bf16 would run hundreds of times
    slower than fp32: training stops with a one-line error before it writes
    anything, and evaluating a bf16 run falls back to its fp32 weights."""
    import lengthgen.runtime.devices as devices
    import lengthgen.evaluation.evaluate as evaluate
    cfg = tiny("train.steps=2", "train.precision=bf16")
    monkeypatch.setattr(devices, "native_bf16", lambda device: False)
    with pytest.raises(UserError, match="native bf16.*train.precision=fp32"):
        train(cfg, tmp_path / "refused", progress=False)
    assert not (tmp_path / "refused").exists()

    monkeypatch.setattr(devices, "native_bf16", lambda device: True)
    train(cfg, tmp_path / "run", progress=False)  # two tiny steps: cheap even where bf16 is emulated
    used = []
    monkeypatch.setattr(evaluate, "autocast", lambda device, precision: used.append(precision) or torch.autocast(
        device.type, enabled=False))
    monkeypatch.setattr(evaluate, "native_bf16", lambda device: False)
    evaluate.evaluate_run(tmp_path / "run", EvalSettings(lengths=[3], samples=8, progress=False))
    assert used == ["fp32"]
    monkeypatch.setattr(evaluate, "native_bf16", lambda device: True)
    evaluate.evaluate_run(tmp_path / "run", EvalSettings(lengths=[3], samples=8, progress=False))
    assert used == ["fp32", "bf16"]


def test_a_hook_runs_when_due_on_the_tested_weights_and_its_values_join_the_log(tmp_path):
    """The Trainer calls each hook due after a step (not when it is not), on the weights that
    are tested, and writes its values into that step's metrics.jsonl row."""
    from lengthgen.runtime.devices import pick_device
    from lengthgen.training.distributed import Ranks
    from lengthgen.training.run_state import RunState
    from lengthgen.training.trainer import Trainer

    class EveryThird:
        def __init__(self):
            self.seen = []

        def due(self, step, last):
            return step % 3 == 0

        def __call__(self, weights, current_max):
            self.seen.append(weights)
            return {"hook@sum": float(sum(p.detach().sum() for p in weights.parameters()))}

    cfg = tiny("train.steps=7", "train.log_interval=100", "train.checkpoint_interval=100")
    folder = tmp_path / "run"
    folder.mkdir()
    device = pick_device("cpu")
    run = Run.from_checked(cfg)
    state = RunState.start(cfg, run.method, run.task, device)
    hook = EveryThird()
    Trainer(run, folder, state, Ranks(), device, [hook]).run(progress=False)
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [3, 6, 7]  # logged when the hook was due, and at the end
    assert [("hook@sum" in r) for r in rows] == [True, True, False]
    assert len(hook.seen) == 2 and all(w is state.model for w in hook.seen)
    assert state.step == 7 and (folder / "checkpoints").is_dir()


def test_a_run_state_saved_and_restored_continues_exactly(tmp_path):
    """RunState.save then restore into a fresh state gives the same weights, optimizer moments,
    data stream and step."""
    from lengthgen.training.run_state import RunState

    cfg = tiny("train.steps=4", "optim.ema=0.9")
    task, method = get_task("copy"), NextTokenPrediction()
    state = RunState.start(cfg, method, task, torch.device("cpu"))
    batch = task.sample(8, 3, state.data)
    loss = method.loss(state.model, batch)
    loss.backward()
    state.optimizer.step()
    state.update_ema(cfg.optim)
    state.step = 1
    state.save(tmp_path, cfg)
    fresh = RunState.start(cfg, method, task, torch.device("cpu"))
    fresh.restore(tmp_path)
    assert fresh.step == 1
    for a, b in zip(state.model.state_dict().values(), fresh.model.state_dict().values()):
        assert torch.equal(a, b)
    for a, b in zip(state.ema.state_dict().values(), fresh.ema.state_dict().values()):
        assert torch.equal(a, b)
    assert torch.equal(state.data.get_state(), fresh.data.get_state())
    moments = lambda s: [v["exp_avg"] for v in s.optimizer.state_dict()["state"].values()]  # noqa: E731
    assert all(torch.equal(a, b) for a, b in zip(moments(state), moments(fresh)))
