"""The captured training step (lengthgen.accel.captured): on CPU, the padded fixed-shape loss
it records equals today's packed loss, with its gradients, for every method it records; its
optimizer bookkeeping round-trips. On CUDA (skipped elsewhere), a recorded run follows an eager one."""

import pytest
import torch

from lengthgen.assembly.runs import new_run, new_run_config
from lengthgen.methods.registry import METHODS
from lengthgen.accel.compiling import compilations
from lengthgen.runtime.checkpoint import portable_state
from lengthgen.tasks.base import sample_mixed
from lengthgen.accel.captured import (WIDTH_MULTIPLE, bucket, capture_refusal, padded, replayed_or_none, restore,
                                         shape_of, snapshot)

TASK_OF = {"ppc": ["task.name=decimal_addition", "task.options.coupled=true"]}
SIZE = ["model.d_model=32", "model.n_head=2", "model.n_layer=1", "task.train_max=6", "train.device=cpu"]


def built(method: str, *extra: str):
    run = new_run(None, [f"method={method}", *TASK_OF.get(method, ["task.name=addition"]), *SIZE, *extra])
    torch.manual_seed(0)
    return run, run.method.build_model(run.cfg, run.task)


def loss_and_grads(loss_of, model):
    model.zero_grad(set_to_none=True)
    loss = loss_of()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def assert_same(a, b):
    assert torch.allclose(a[0], b[0], atol=1e-6, rtol=1e-5), (a[0], b[0])
    assert len(a[1]) == len(b[1]) > 0
    for x, y in zip(a[1], b[1]):
        assert torch.allclose(x, y, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("name", sorted(n for n, m in METHODS.items() if m.capturable))
@pytest.mark.parametrize("position", ["nope", "rope", "alibi", "tra"])
def test_padded_fixed_shape_loss_is_the_packed_loss(name, position):
    """Extra columns and extra loop iterations change neither the loss nor any gradient."""
    if name == "ppc" and position in ("alibi", "tra"):
        pytest.skip("ppc decodes with a KV cache, which these schemes cannot use")
    if not METHODS[name].has_positions and position != "nope":
        pytest.skip("a recurrent model has no positions: it refuses every scheme but nope")
    run, model = built(name, f"model.position={'learned' if name == 'ppc' else position}")
    batch = sample_mixed(run.task, 9, 1, 6, torch.Generator().manual_seed(3))
    width, iterations, _ = shape_of(run.method, batch)
    wider = padded(batch, width + 5)
    assert wider.inputs.shape[1] == width + 5 and batch.inputs.shape[1] == width
    packed = loss_and_grads(lambda: run.method.loss(model, batch), model)
    fixed = loss_and_grads(lambda: run.method.fixed_shape_loss(model, wider, iterations + 2), model)
    assert_same(packed, fixed)


def test_looped_iterations_are_the_largest_t():
    run, _ = built("looped")
    batch = run.task.sample(4, torch.tensor([1, 5, 3, 2]), torch.Generator().manual_seed(0))
    assert run.method.iterations(batch) == int(batch.n_steps.max()) > 1
    assert METHODS["ntp"]().iterations(batch) == 0


def test_too_few_iterations_change_the_loss():
    """The test above can fail: a loop count below the batch's largest T_i gives another loss."""
    run, model = built("looped")
    batch = run.task.sample(4, torch.tensor([1, 5, 3, 2]), torch.Generator().manual_seed(0))
    full = run.method.fixed_shape_loss(model, batch, run.method.iterations(batch))
    short = run.method.fixed_shape_loss(model, batch, run.method.iterations(batch) - 1)
    assert not torch.allclose(full, short)


def test_padding_fills_every_field():
    run, _ = built("ppc")
    batch = run.task.sample(3, 4, torch.Generator().manual_seed(0))
    grown = padded(batch, batch.inputs.shape[1] + 3)
    from lengthgen.tasks import IGNORE, PAD
    assert (grown.inputs[:, -3:] == PAD).all() and (grown.targets[:, -3:] == IGNORE).all()
    assert (grown.target_ids[:, -3:] == IGNORE).all()
    assert torch.equal(grown.inputs[:, :-3], batch.inputs) and torch.equal(grown.targets[:, :-3], batch.targets)


def test_a_batch_replays_the_cheapest_graph_that_holds_it():
    key, new = bucket([], 9, 3, ())
    assert new and key == (2 * WIDTH_MULTIPLE, 3, ())  # 9 columns round up to the next multiple
    keys = [key, (4 * WIDTH_MULTIPLE, 3, ()), (WIDTH_MULTIPLE, 5, ())]
    assert bucket(keys, WIDTH_MULTIPLE + 1, 2, ()) == (key, False)  # narrower and fewer loops fit
    assert bucket(keys, 3 * WIDTH_MULTIPLE, 3, ()) == ((4 * WIDTH_MULTIPLE, 3, ()), False)
    assert bucket(keys, 3, 4, ()) == ((WIDTH_MULTIPLE, 5, ()), False)  # the only one looping enough
    assert bucket(keys, 3, 6, ()) == ((WIDTH_MULTIPLE, 6, ()), True)
    assert bucket(keys, 3, 1, ("packed",)) == ((WIDTH_MULTIPLE, 1, ("packed",)), True)  # another layout


def test_methods_that_cannot_be_recorded_say_why():
    for name in ("ntp-pause", "tape-rnn"):
        assert capture_refusal(METHODS[name](), 1, 1), name
    for name in ("looped-halt", "looped-clock", "looped-uncertain"):  # their losses at fixed shapes: fixed_steps
        assert capture_refusal(METHODS[name](), 1, 1) is None, name
    assert capture_refusal(METHODS["looped"](), 1, 1) is None
    assert "data-parallel" in capture_refusal(METHODS["looped"](), 2, 2)


def adamw(model, **kw):
    return torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, **kw)


def test_snapshot_restore_puts_weights_and_state_back():
    _, model = built("ntp")
    opt = adamw(model)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()  # state exists before the snapshot
    before = [p.detach().clone() for p in model.parameters()]
    state_before = {k: v.clone() for k, v in opt.state[next(model.parameters())].items()}
    kept = snapshot(model, opt)
    opt.step()
    assert not torch.equal(next(model.parameters()), before[0])
    restore(model, opt, kept)
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    for k, v in opt.state[next(model.parameters())].items():
        assert torch.equal(v, state_before[k]), k


def test_restore_zeroes_state_made_after_the_snapshot():
    _, model = built("ntp")
    opt = adamw(model)
    kept = snapshot(model, opt)  # a fresh optimizer: no state yet
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    restore(model, opt, kept)
    slots = opt.state[next(model.parameters())]
    assert float(slots["step"]) == 0 and not slots["exp_avg"].any() and not slots["exp_avg_sq"].any()


def test_portable_state_is_plain_and_leaves_the_optimizer_alone():
    _, model = built("ntp")
    opt = adamw(model)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opt.step()
    for group in opt.param_groups:  # as a recorded run holds them
        group["capturable"], group["lr"] = True, torch.tensor(0.5)
    saved = portable_state(opt)
    assert all(g["lr"] == 0.5 and isinstance(g["lr"], float) and not g["capturable"] for g in saved["param_groups"])
    assert all(isinstance(g["lr"], torch.Tensor) and g["capturable"] for g in opt.param_groups)
    fresh = adamw(model)
    fresh.load_state_dict(saved)  # an eager CPU run reads it and steps
    fresh.step()


@pytest.mark.parametrize("name, extra", [("looped", ()), pytest.param("looped-halt", (), marks=pytest.mark.slow),
                                         pytest.param("ntp", (), marks=pytest.mark.slow),
                                         pytest.param("ntp", ("model.position=tra",), marks=pytest.mark.slow)],
                         ids=["looped", "looped-halt", "ntp", "ntp-tra"])
def test_the_loss_compiled_whole_is_the_eager_loss(name, extra):
    """train.compile on a recorded step compiles its fixed-shape loss whole (every iteration, the
    backward): the same loss and gradients, on CPU as on CUDA; TRA's chunked attention too (a
    recorded step's shapes are fixed)."""
    from lengthgen.accel.compiling import compilable, compile_step
    run, model = built(name, *extra)
    assert compilable(model, whole=True) is None
    # lengths 1 and 2: rows that stop looping before others, padding, and an extra iteration, in as
    # few unrolled iterations as show them (each more is more kernels to compile)
    batch = sample_mixed(run.task, 9, 1, 2, torch.Generator().manual_seed(3))
    width, iterations, _ = shape_of(run.method, batch)
    batch = padded(batch, width + 3)
    eager = loss_and_grads(lambda: run.method.fixed_shape_loss(model, batch, iterations + 1), model)
    torch._dynamo.reset()
    compiled = compile_step(run.method.fixed_shape_loss)
    assert_same(eager, loss_and_grads(lambda: compiled(model, batch, iterations + 1), model))
    assert compilations() >= 1


def test_buckets_are_compiled_from_where_the_curriculum_ends(monkeypatch):
    """train.compile on a recorded step: graphs recorded before `compile_after` calls stay as they
    are; from then on a batch replays only graphs compiled whole, recording one where none fits."""
    from lengthgen.accel.captured import CapturedSteps
    run, _ = built("looped")
    steps = object.__new__(CapturedSteps)  # the bucket policy alone: no CUDA graph is made
    steps.method, steps.compiled, steps.compile_after, steps.calls, steps.graphs = run.method, True, 2, 0, {}
    steps.device, steps.lr = torch.device("cpu"), torch.zeros(())
    made = []

    def record(batch, iterations, compiled=False):
        made.append((batch.inputs.shape[1], iterations, compiled))
        return type("Graph", (), {"compiled": compiled, "replay": lambda self, b: torch.tensor(0.0)})()
    monkeypatch.setattr(steps, "record", record)
    g = torch.Generator().manual_seed(0)
    long, short = (run.task.sample(4, n, g) for n in (6, 3))
    for batch in (long, short, short, long, short):
        steps(batch, 1e-3)
    assert [m[2] for m in made] == [False, True, True]  # short fitted the long graph; after 2 calls it did not
    assert made[1][1] < made[2][1]  # the first compiled graph was the short one's; the long one got its own


def test_a_step_that_fails_to_compile_is_recorded_uncompiled(monkeypatch, capsys):
    from lengthgen.accel.captured import CapturedSteps
    failure = type("BackendCompilerFailed", (Exception,), {"__module__": "torch._dynamo.exc"})
    steps = object.__new__(CapturedSteps)
    steps.compiled, made = True, []

    def record(batch, iterations, compiled=False):
        if compiled:
            raise failure("inductor could not lower an operator")
        made.append(iterations)
        return "graph"
    monkeypatch.setattr(steps, "record", record)
    assert steps.recorded(None, 4, True) == "graph" and made == [4] and not steps.compiled
    assert "recording it uncompiled" in capsys.readouterr().err
    with pytest.raises(ValueError):  # any other error is not a compilation's: it propagates
        monkeypatch.setattr(steps, "record", lambda *a: (_ for _ in ()).throw(ValueError("bad")))
        steps.recorded(None, 4, False)


def test_a_step_that_fails_to_record_says_why_and_runs_eagerly(capsys):
    def fails(*_):
        raise RuntimeError("operation not permitted when stream is capturing\nsecond line")

    assert replayed_or_none(lambda x, y: x + y, 2, 3) == 5
    assert replayed_or_none(fails, 1, what="the stacked step") is None
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "recording the stacked step failed (RuntimeError: operation not permitted" in err
    for lack in (torch.OutOfMemoryError("CUDA out of memory"), MemoryError()):
        def short(*_, lack=lack):
            raise lack
        with pytest.raises(type(lack)):
            replayed_or_none(short)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@cuda
@pytest.mark.parametrize("method", ["looped", "ntp"])
def test_recorded_run_follows_the_eager_run(tmp_path, method):
    from lengthgen.training.trainer import train
    common = [f"method={method}", "task.name=parity", "task.train_max=6", "model.d_model=32", "model.n_head=2",
              "model.n_layer=1", "train.steps=30", "train.batch_size=16", "train.device=cuda",
              "train.log_interval=10", "train.checkpoint_interval=100"]
    losses = {}
    for capture in ("true", "false"):
        out = tmp_path / capture
        train(new_run_config(None, [*common, f"train.capture={capture}"]), out, progress=False)
        losses[capture] = [__import__("json").loads(line)["loss"] for line in (out / "metrics.jsonl").open()]
    assert losses["true"] == pytest.approx(losses["false"], rel=1e-3)
