"""Seeds trained stacked (lengthgen.accel.stacked): each seed's step is its own run's step
(loss, gradients, its own clipping, AdamW), for every method whose steps can be recorded; a
stacked training writes each run's folder as training it alone does, resumes, and refuses runs
that differ in more than their seeds."""

import json

import pytest
import torch
from safetensors.torch import load_file

from lengthgen.assembly.runs import new_run
from lengthgen.methods.registry import METHODS
from lengthgen.tasks.base import sample_mixed
from lengthgen.training.run_state import RunState
from lengthgen.accel.stacked import StackedSteps, clip_rows, stacked_batch, step_shape
from lengthgen.training.stacked_seeds import train_stacked
from lengthgen.training.trainer import train, update

TASK_OF = {"ppc": ["task.name=decimal_addition", "task.options.coupled=true", "model.position=learned"]}
SIZE = ["model.d_model=32", "model.n_head=2", "model.n_layer=1", "task.train_max=6", "train.device=cpu",
        "optim.grad_clip=0.05", "optim.lr=3e-3"]  # a clip that binds, at a different scale for each seed


def states(method: str, seeds: int = 3, *extra: str):
    runs = [new_run(None, [f"method={method}", *TASK_OF.get(method, ["task.name=addition"]), *SIZE,
                           f"train.model_seed={s}", *extra]) for s in range(seeds)]
    return runs[0], [RunState.start(r.cfg, r.method, r.task, torch.device("cpu")) for r in runs]


def stepped_alike(name: str, *extra: str):
    """Three seeds stepped three times alone and stacked: the same losses and weights."""
    run, alone = states(name, 3, *extra)
    _, stacked = states(name, 3, *extra)
    steps = StackedSteps(run.method, stacked, run.cfg.optim.grad_clip, "fp32", torch.device("cpu"), capture=False)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        batches = [sample_mixed(run.task, 6, 1, 6, g) for _ in alone]  # each seed its own batch, widths differ
        losses = steps(batches, 3e-3)
        for state, batch, loss in zip(alone, batches, losses):
            state.optimizer.zero_grad(set_to_none=True)
            own = run.method.loss(state.model, batch)
            own.backward()
            update(state.optimizer, state.model, 3e-3, run.cfg.optim.grad_clip)
            assert torch.allclose(loss, own.detach(), rtol=1e-5, atol=1e-6), (loss, own)
    for a, b in zip(alone, stacked):
        for (name_, p), q in zip(a.model.named_parameters(), b.model.parameters()):
            assert torch.allclose(p, q, rtol=1e-4, atol=1e-5), name_
        assert a.model.state_dict().keys() == b.model.state_dict().keys()


@pytest.mark.parametrize("name", sorted(n for n, m in METHODS.items() if m.capturable and m.stackable))
def test_a_stacked_step_is_each_seeds_own_step(name):
    stepped_alike(name)


@pytest.mark.parametrize("position", ["rope", "alibi", "tra", "cope", "fox", "fire", "t5", "stickbreaking", "fope", "path-fox"])
def test_every_positional_scheme_stacks(position):
    """The schemes' own code (biases, content logits, position tables) runs under vmap alike."""
    stepped_alike("ntp", f"model.position={position}")


def test_each_seed_is_clipped_by_its_own_norm():
    w = torch.nn.Parameter(torch.zeros(2, 3))
    w.grad = torch.tensor([[3.0, 4.0, 0.0], [0.3, 0.4, 0.0]])  # norms 5 and 0.5
    clip_rows([w], 1.0)
    assert torch.allclose(w.grad[0], torch.tensor([0.6, 0.8, 0.0]), atol=1e-6)
    assert torch.allclose(w.grad[1], torch.tensor([0.3, 0.4, 0.0]))  # under the limit: unchanged


TINY = ["method=looped", "task.name=parity", "task.train_max=6", "model.d_model=32", "model.n_head=4",
        "model.n_layer=1", "train.steps=20", "train.batch_size=16", "train.log_interval=5",
        "train.checkpoint_interval=10", "train.device=cpu", "optim.grad_clip=0.3", "optim.lr=3e-3"]
SEEDS = [["train.model_seed=1", "data.seed=5"], ["train.model_seed=2", "data.seed=6"]]


def runs(*extra):
    return [new_run(None, TINY + seed + list(extra)) for seed in SEEDS]


def metrics(folder):
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


def assert_same_run(alone, stacked, files=("model.safetensors",)):
    a, b = metrics(alone), metrics(stacked)
    assert [r["step"] for r in a] == [r["step"] for r in b]
    assert [r["loss"] for r in a] == pytest.approx([r["loss"] for r in b], rel=1e-4)
    last = "checkpoints/step_00000020"
    for name in files:
        wa, wb = load_file(alone / last / name), load_file(stacked / last / name)
        assert wa.keys() == wb.keys()
        for key in wa:
            # float rounding that 20 AdamW steps of lr 3e-3 amplify; a wrong row or clip is off by ~1e-2
            worst = float((wa[key] - wb[key]).abs().max())
            assert torch.allclose(wa[key], wb[key], rtol=1e-3, atol=5e-5), (name, key, worst)
    for name in ("model.safetensors", "optimizer.pt"):  # its own rows only, not every seed's
        assert (alone / last / name).stat().st_size == (stacked / last / name).stat().st_size


@pytest.mark.parametrize("extra", [[], ["optim.ema=0.9", "optim.ema_start=5"], ["data.dataset_size=48"]],
                         ids=["plain", "ema", "finite-set"])
def test_stacked_training_writes_each_runs_folder_as_training_it_alone(tmp_path, extra):
    for i, run in enumerate(runs(*extra)):
        train(run, tmp_path / f"alone{i}", progress=False)
    folders = [tmp_path / f"stacked{i}" for i in range(2)]
    summaries = train_stacked(runs(*extra), folders, [False, False], progress=False)
    assert [s["stacked"] for s in summaries] == [2, 2] and all(s["step"] == 20 for s in summaries)
    files = ("model.safetensors", "ema.safetensors") if extra and "ema" in extra[0] else ("model.safetensors",)
    for i in range(2):
        assert_same_run(tmp_path / f"alone{i}", tmp_path / f"stacked{i}", files)


class StopAt:
    """A hook that interrupts training at a step, as Ctrl-C would."""

    def __init__(self, step):
        self.step = step

    def due(self, step, last):
        return step == self.step

    def __call__(self, weights, high):
        raise KeyboardInterrupt


def test_stacked_training_resumes_from_the_seeds_checkpoints(tmp_path):
    folders = [tmp_path / f"stacked{i}" for i in range(2)]
    with pytest.raises(KeyboardInterrupt):
        train_stacked(runs(), folders, [False, False], progress=False, hooks=lambda run, device: [StopAt(13)])
    assert all(metrics(f)[-1]["step"] == 10 for f in folders)  # the interrupted step wrote nothing
    train_stacked([None, None], folders, [True, True], progress=False)
    for i, run in enumerate(runs()):
        train(run, tmp_path / f"alone{i}", progress=False)
        assert_same_run(tmp_path / f"alone{i}", folders[i])


def test_runs_that_differ_beyond_their_seeds_train_one_after_another(tmp_path, capsys):
    different = [runs()[0], new_run(None, TINY + SEEDS[1] + ["optim.lr=1e-3"])]
    summaries = train_stacked(different, [tmp_path / "a", tmp_path / "b"], [False, False], progress=False)
    err = capsys.readouterr().err
    assert "not stacked" in err and "optim.lr" in err
    assert all("stacked" not in s and s["step"] == 20 for s in summaries)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="recording a step needs CUDA")
def test_a_recorded_stacked_step_follows_the_eager_one():
    run, eager = states("looped", 3, "train.device=cuda")
    _, recorded = states("looped", 3, "train.device=cuda")
    device = torch.device("cuda")
    eager_steps = StackedSteps(run.method, eager, 0.05, "fp32", device, capture=False)
    recorded_steps = StackedSteps(run.method, recorded, 0.05, "fp32", device, capture=True)
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        batches = [sample_mixed(run.task, 6, 1, 6, g) for _ in range(3)]
        assert torch.allclose(eager_steps(batches, 3e-3), recorded_steps(batches, 3e-3), rtol=1e-4, atol=1e-5)
    assert recorded_steps.captured is not None and recorded_steps.captured.count() >= 1
    for a, b in zip(eager, recorded):
        for p, q in zip(a.model.parameters(), b.model.parameters()):
            assert torch.allclose(p, q, rtol=1e-3, atol=1e-5)


@pytest.mark.slow  # compiles the step
def test_the_stacked_losses_compiled_whole_are_the_eager_ones():
    """train.compile on recorded stacked steps compiles the seeds' losses under vmap as one graph."""
    from lengthgen.accel.compiling import compile_step
    run, seeds = states("looped", 2)
    steps = StackedSteps(run.method, seeds, 0.0, "fp32", torch.device("cpu"), capture=False)
    g = torch.Generator().manual_seed(2)
    batches = [sample_mixed(run.task, 6, 1, 2, g) for _ in seeds]  # rows stop at 1 or 2 iterations: a short compile
    width, iterations, _ = step_shape(run.method, batches)
    batch = stacked_batch(batches, width + 2)
    torch._dynamo.reset()
    results = []
    for losses in (steps.losses, compile_step(steps.losses)):
        for w in steps.params:
            w.grad = None
        out = losses(batch, iterations + 1)
        out.sum().backward()
        results.append((out.detach(), [w.grad.clone() for w in steps.params]))
    assert torch.allclose(results[0][0], results[1][0], rtol=1e-5)
    for a, b in zip(results[0][1], results[1][1]):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
