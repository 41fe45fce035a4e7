"""Trained per-sample stopping: the losses of looped-halt, looped-uncertain and looped-clock
against brute force, and the `halt` and `first-confident` rules (the tiny runs that must learn
to halt: test_looped_learns.py)."""
import math

import pytest
import torch
import torch.nn.functional as F

from lengthgen.methods.looped import halting

from lengthgen.assembly.runs import new_run_config

from lengthgen.methods.looped import stop_passes

from lengthgen.errors import UserError
from lengthgen.methods.looped import stop_rules as stopping
from lengthgen.methods.looped.block import looped_loss, per_sample_steps
from lengthgen.methods.registry import get_method
from lengthgen.tasks import get_task
from test_looped import mixed_batch
from test_stop_rules import Scripted, scripted_case


def build(method, weight=1.0, seed=0):
    torch.manual_seed(seed)
    weighted = [f"method_options.halt_loss_weight={weight}"] if weight != 1.0 else []  # 1.0: the default, any method
    cfg = new_run_config(None, ["model.n_layer=1", "model.d_model=32", "model.n_head=2", "task.name=copy",
                                f"method={method}", *weighted])
    return get_method(method, cfg), get_method(method, cfg).build_model(cfg, get_task("copy"))


def each_step(model, batch):
    """Yield (sample, t, T_i, h (1, w, D), scored (1, w)) for t = 1..T_i, one sample at a time."""
    x, T = batch.blank_answers().inputs, per_sample_steps(batch)
    for i in range(len(batch)):
        w = int(batch.widths[i])
        h, e, pos = model.start(x[i:i + 1, :w])
        for t in range(1, int(T[i]) + 1):
            h = model.step(h, e, pos)
            yield i, t, int(T[i]), h, batch.scored[i:i + 1, :w]


def test_halt_loss_is_balanced_cross_entropy_of_the_mean_head_logit():
    method, model = build("looped-halt", weight=0.5)
    batch = mixed_batch()
    done, not_done = [], []
    for _, t, T, h, sc in each_step(model, batch):
        logit = model.halt_head(h)[0, :, 0][sc[0]].mean()
        label = torch.tensor(float(t == T))
        (done if t == T else not_done).append(F.binary_cross_entropy_with_logits(logit, label))
    expected = 0.5 * (torch.stack(done).mean() + torch.stack(not_done).mean())
    extra = method.loss(model, batch) - looped_loss(model, batch)
    assert torch.allclose(extra, expected, atol=1e-5), (extra, expected)


def test_uncertain_loss_is_cross_entropy_to_uniform_before_the_right_step():
    method, model = build("looped-uncertain", weight=2.0)
    batch = mixed_batch()
    terms = []
    for _, t, T, h, sc in each_step(model, batch):
        if t < T:
            logp = model.read(h)[0][sc[0]].log_softmax(-1)  # (tokens, V)
            terms.append(-logp.mean(-1) - math.log(logp.shape[-1]))
    expected = 2.0 * torch.cat(terms).mean()
    extra = method.loss(model, batch) - looped_loss(model, batch)
    assert torch.allclose(extra, expected, atol=1e-5), (extra, expected)
    assert float(expected.detach()) > 0  # a random read-out is not uniform


def test_clock_loss_is_squared_error_to_the_phase_pi_t_over_t_n():
    method, model = build("looped-clock", weight=0.5)
    batch = mixed_batch()
    errors = []
    for _, t, T, h, sc in each_step(model, batch):
        z = model.halt_head(h)[0][sc[0]].mean(0)  # (2,): the clock, averaged over the answer
        phase = torch.tensor(math.pi * t / T)
        errors.append((z - torch.stack([phase.cos(), phase.sin()])).pow(2).sum())
    expected = 0.5 * torch.stack(errors).mean()
    extra = method.loss(model, batch) - looped_loss(model, batch)
    assert torch.allclose(extra, expected, atol=1e-5), (extra, expected)


def first_firing_step(phases, scale=1.0):
    """The first t (1-based) at which clock_logit fires for a clock reading these phases."""
    z = scale * torch.tensor([[math.cos(p), math.sin(p)] for p in phases])
    fires = [bool(halting.clock_logit(z[t - 1:t], t)[0] > 0) for t in range(1, len(phases) + 1)]
    return fires.index(True) + 1 if any(fires) else None


def test_clock_logit_fires_where_the_phase_implies_t_n():
    for T in (1, 2, 3, 7, 12, 24, 100):
        exact = [math.pi * t / T for t in range(1, 2 * T + 2)]
        assert first_firing_step(exact, scale=0.3) == T, T  # only the angle counts, not the length
        # off by less than half a step either way: still T; a full step slow: one late
        assert first_firing_step([p * (1 + 0.3 / T) for p in exact]) == T, T
        assert first_firing_step([p * (1 - 0.3 / T) for p in exact]) == T, T
        assert first_firing_step([math.pi * t / (T + 1) for t in range(1, 2 * T + 4)]) == T + 1, T
    # a reading just below 0 early is early (no wrap to 2 pi); just past pi late is done
    assert halting.clock_phase(torch.tensor([[1.0, -0.01]])).item() == pytest.approx(-0.01, abs=1e-4)
    assert halting.clock_phase(torch.tensor([[-1.0, -0.01]])).item() == pytest.approx(math.pi + 0.01, abs=1e-4)


def test_stopping_losses_reach_the_block_and_start_from_the_plain_model():
    plain = build("looped")[1]
    for name in ("looped-halt", "looped-uncertain", "looped-clock"):
        method, model = build(name)
        for key, value in plain.state_dict().items():  # same seed: the same weights, the head is extra
            assert torch.equal(model.state_dict()[key], value), key
        batch = mixed_batch()
        (method.loss(model, batch) - looped_loss(model, batch)).backward()
        block = [p.grad for n, p in model.named_parameters() if n.startswith("blocks.")]
        assert any(g is not None and g.abs().sum() > 0 for g in block), name


def test_every_sample_of_length_one_has_no_negative_step():
    for name in ("looped-halt", "looped-uncertain", "looped-clock"):
        method, model = build(name)
        batch = get_task("copy").sample(4, 1, torch.Generator().manual_seed(0))
        assert torch.isfinite(method.loss(model, batch)), name


class ScriptedHalt(Scripted):
    """Scripted logits plus a scripted halting logit halt[t, b]."""

    def __init__(self, table, halt):
        super().__init__(table)
        self.halt = torch.tensor(halt, dtype=torch.float32)

    def halt_logits(self, h, scored, t):
        b, step = h[:, 0, 0].long(), h[:, 0, 1].long() - 1
        assert bool((step == t - 1).all())  # the rule passes the iteration it reads
        return self.halt[step, b]


def test_halt_stops_at_the_first_positive_logit_else_the_largest():
    batch, model = scripted_case([[0.3] * 3] * 4)
    model = ScriptedHalt(model.table, [[-1.0, 2.0, -3.0], [0.5, -1.0, -0.5], [2.0, 1.0, -2.0], [-1.0, 3.0, -1.0]])
    stats = {}
    pred, steps = stop_passes.per_sample_search(model, batch, 4, stop_passes._judge_halt, stats=stats)
    assert steps.tolist() == [2, 1, 2]  # sample 2 never fires: its largest logit, -0.5 at t = 2
    assert stats["sample_steps"] == 2 + 1 + 4  # a sample stops iterating where it fires
    for b, t in enumerate(steps.tolist()):
        assert torch.equal(pred[b], model.table[t - 1, b].argmax(-1))
    tr = stop_passes.trace(model, batch, 4)
    values, read = stopping.readout(tr, batch, "halt:4")
    assert torch.equal(read, steps)


def spread_case(conf):
    """scripted_case for confidence losses up to log V: the top logit is 0 and the V - 1
    others share the rest, so p_max = exp(-c)."""
    batch, model = scripted_case([[0.3] * 3] * len(conf))
    V = model.table.shape[-1]
    for t, row in enumerate(conf):
        for b, c in enumerate(row):
            top = int(model.table[t, b, 0].argmax())
            model.table[t, b] = math.log((math.exp(c) - 1) / (V - 1))
            model.table[t, b, :, top] = 0.0
    return batch, model


def test_first_confident_stops_below_log_2_else_at_the_most_confident():
    conf = [[1.0, 0.9, 1.7], [0.5, 0.8, 1.5], [0.2, 0.1, 1.2], [0.6, 0.05, 1.1]]
    batch, model = spread_case(conf)
    assert torch.allclose(stop_passes.trace(model, batch, 4).confidence, torch.tensor(conf, dtype=torch.float64))
    pred, steps = stop_passes.first_confident(model, batch, 4)
    assert steps.tolist() == [2, 3, 4]  # 0.5 < log 2 at t = 2; 0.1 at t = 3; never: argmin 1.1 at t = 4
    tr = stop_passes.trace(model, batch, 4)
    assert torch.equal(stopping.readout(tr, batch, "first-confident:4")[1], steps)
    for b, t in enumerate(steps.tolist()):
        assert torch.equal(pred[b], model.table[t - 1, b].argmax(-1))


@pytest.mark.parametrize("name", ["looped-halt", "looped-clock"])
def test_rules_on_a_real_halting_model_match_the_trace(name):
    _, model = build(name)
    model.eval()
    batch = mixed_batch()
    tr = stop_passes.trace(model, batch, 16)
    for rule in ("halt", "halt:+3", "first-confident", "first-confident:9"):
        values, steps = stopping.readout(tr, batch, rule)
        pred, want = stopping.predict_stop(model, batch, rule)
        assert torch.equal(steps, want), rule
        assert torch.equal(values["accuracy"], ((pred == batch.targets) | ~batch.scored).all(1)), rule
    assert stopping.readout(stop_passes.trace(build("looped")[1].eval(), batch, 16), batch, "halt") is None


def test_halt_needs_a_halting_head(tmp_path):
    with pytest.raises(ValueError, match="looped-halt, looped-halt-probe or looped-clock"):
        stopping.parse_rule("halt").check(get_method("looped"))
    assert stopping.parse_rule("halt:+20").check(get_method("looped-halt")).relative
    assert stopping.parse_rule("halt").check(get_method("looped-clock"))
    with pytest.raises(ValueError, match="first-confident"):
        stopping.parse_rule("first-confident:x")


def test_halt_rule_on_a_plain_looped_run_is_a_one_line_error(tmp_path):
    from lengthgen.evaluation.evaluate import evaluate_run
    from lengthgen.evaluation.settings import EvalSettings
    from lengthgen.training.trainer import train
    cfg = new_run_config(None, ["method=looped", "task.name=parity", "task.train_max=3", "model.n_layer=1",
                                "model.d_model=16", "model.n_head=2", "train.steps=2", "train.device=cpu"])
    train(cfg, tmp_path / "run", progress=False)
    with pytest.raises(UserError, match="halting head"):
        evaluate_run(tmp_path / "run", EvalSettings(lengths=[2], samples=8, stops=["oracle", "halt"], progress=False))


def test_pooled_states_are_the_answer_and_question_means():
    h = torch.randn(2, 6, 3)
    scored = torch.tensor([[0, 0, 0, 1, 1, 0], [0, 1, 0, 1, 0, 0]], dtype=torch.bool)
    pooled = halting.pooled_states(h, scored)
    assert torch.allclose(pooled[0], torch.cat([h[0, 3:5].mean(0), h[0, :4].mean(0)]))  # the question and its '='
    assert torch.allclose(pooled[1], torch.cat([h[1, [1, 3]].mean(0), h[1, :2].mean(0)]))


def test_probe_data_labels_done_from_t_n_on():
    _, model = build("looped-halt-probe")
    batch = mixed_batch()
    x, done = halting.probe_data(model.eval(), batch)
    T = per_sample_steps(batch)
    assert x.shape[:2] == done.shape == (int(T.max()) + halting.PROBE_EXTRA, len(batch))
    assert done.sum(0).tolist() == (len(x) + 1 - T).tolist()  # t = T_i .. the last
    tr = stop_passes.trace(model, batch, len(x))  # the probe's logits on these states are the rule's
    assert torch.allclose(model.halt_head(x), tr.halt.float(), atol=1e-5)


class Counter:
    """Stand-in looped model whose state is (T_i, t) at every position."""

    def __init__(self, steps):
        self.steps = steps.float()

    def start(self, inputs, position_ids=None):
        h = torch.zeros(*inputs.shape, 2)
        h[..., 0] = self.steps[:, None]
        return h, None, None

    def step(self, h, e, pos):
        return h + torch.tensor([0.0, 1.0])


def test_probe_fits_a_separable_signal():
    """States that say t and T_i: the fitted probe must call "done" exactly from T_i on."""
    batch = get_task("parity").sample(6, torch.tensor([1, 2, 3, 4, 5, 6]), torch.Generator().manual_seed(0))
    model = Counter(per_sample_steps(batch))
    probe = halting.fit_halt_probe(model, [batch], steps=300)
    x, done = halting.probe_data(model, batch)
    assert torch.equal(probe(x) > 0, done)


def test_distinct_samples_are_each_sample_once_with_how_often_it_was_drawn():
    batch = get_task("parity").sample(64, 3, torch.Generator().manual_seed(0))  # 8 inputs of length 3
    distinct, counts = halting.distinct_samples(batch)
    rows = [tuple(r) for r in batch.inputs.tolist()]
    assert sorted(tuple(r) for r in distinct.inputs.tolist()) == sorted(set(rows))
    assert counts.tolist() == [rows.count(tuple(r)) for r in distinct.inputs.tolist()]
    for i, r in enumerate(distinct.inputs.tolist()):  # each distinct sample is one of the drawn ones, whole
        j = rows.index(tuple(r))
        assert torch.equal(distinct.targets[i], batch.targets[j]) and distinct.n_steps[i] == batch.n_steps[j]


def test_a_weighted_probe_fit_is_the_fit_on_the_rows_repeated():
    """Weights are counts: the fit on distinct rows weighted k must be the fit on each row k times."""
    x, y = torch.randn(12, 5, dtype=torch.float64), torch.rand(12) < 0.3
    k = torch.randint(1, 4, (12,))
    fits = []
    for rows, labels, weights in ((x, y, [k.double()]), (x.repeat_interleave(k, 0), y.repeat_interleave(k), None)):
        torch.manual_seed(0)
        net = torch.nn.Linear(5, 1).double()
        halting.train_probe(lambda: [net(rows)[:, 0]], [labels], net.parameters(), 50, 1e-2, weights)
        fits.append(torch.cat([p.flatten() for p in net.parameters()]))
    assert torch.allclose(*fits, atol=1e-9)


@pytest.mark.slow
def test_probe_leaves_the_block_training_bit_for_bit_as_plain_looped(tmp_path):
    """The same seeds with a tight clip (it scales every step): with the probe's parameters in the
    block's clipped norm, its weight decay, or a loss of its own, the weights would differ."""
    from safetensors.torch import load_file
    from lengthgen.training.trainer import train
    weights = {}
    for name in ("looped", "looped-halt-probe"):
        cfg = new_run_config(None, [f"method={name}", "task.name=parity", "task.train_max=5", "model.n_layer=1",
                                    "model.d_model=32", "model.n_head=2", "train.steps=12", "optim.grad_clip=0.05",
                                    "data.curriculum_start=2", "data.curriculum_interval=3", "train.device=cpu",
                                    "data.length_sampling=per_sample", "train.checkpoint_interval=12"])
        train(cfg, tmp_path / name, progress=False)
        weights[name] = load_file(next((tmp_path / name).glob("checkpoints/*/model.safetensors")))
    plain, probed = weights["looped"], weights["looped-halt-probe"]
    assert set(probed) - set(plain) and all(k.startswith("halt_head.") for k in set(probed) - set(plain))
    for key, value in plain.items():
        assert torch.equal(probed[key], value), key
    assert float(probed["halt_head.std"].sub(1).abs().sum()) > 0  # fitted after the last step


@pytest.mark.slow
def test_probe_is_fitted_in_the_ema_weights_too(tmp_path):
    from safetensors.torch import load_file
    from lengthgen.training.trainer import train
    cfg = new_run_config(None, ["method=looped-halt-probe", "task.name=parity", "task.train_max=3", "model.n_layer=1",
                                "model.d_model=16", "model.n_head=2", "train.steps=2", "optim.ema=0.9",
                                "train.device=cpu"])
    train(cfg, tmp_path / "run", progress=False)
    for name in ("model", "ema"):
        weights = load_file(next((tmp_path / "run").glob(f"checkpoints/*/{name}.safetensors")))
        assert float(weights["halt_head.std"].sub(1).abs().sum()) > 0, name
