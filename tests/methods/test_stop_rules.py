"""Stop rules of the looped model (lengthgen.methods.looped.stop_rules, lengthgen.methods.looped.stop_passes): each rule on
scripted models whose confidence at every step is given, the one-pass trace against the
rules' own passes, and real models."""
import math

import pytest
import torch
import torch.nn.functional as F

from lengthgen.assembly.runs import new_run_config
from lengthgen.methods.looped import stop_passes

from lengthgen.methods.looped import stop_rules as stopping
from lengthgen.methods.looped.block import oracle_logits
from lengthgen.methods.registry import get_method
from lengthgen.tasks import get_task, score
from test_looped import mixed_batch, tiny


class Scripted:
    """Stand-in model whose step-t logits are given: table (T, B, L, V). The
    state carries the sample index and the step, so rows can be dropped."""

    def __init__(self, table):
        self.table = table

    def start(self, inputs, position_ids=None):
        B, L = inputs.shape
        h = torch.zeros(B, L, 2)
        h[..., 0] = torch.arange(B, dtype=torch.float)[:, None]
        return h, torch.zeros(B, L, 1), torch.zeros(1, L, dtype=torch.long)

    def step(self, h, e, pos):
        return h + torch.tensor([0.0, 1.0])

    def read(self, h):
        b, t = h[:, 0, 0].long(), h[:, 0, 1].long() - 1
        return self.table[t, b][:, : h.shape[1]]


def scripted_case(conf_of):
    """Batch of 3 parity samples and a table whose answer logits at (t, b) make
    the confidence loss conf_of[t][b] and predict token 3 + (t + b) % 2."""
    batch = get_task("parity").sample(3, torch.tensor([2, 3, 4]), torch.Generator().manual_seed(0))
    T, (B, L), V = len(conf_of), batch.inputs.shape, get_task("parity").vocab_size
    table = torch.full((T, B, L, V), -1e4)
    for t in range(T):
        for b in range(B):
            c = conf_of[t][b]
            # two live logits: p_max = exp(-c) exactly when the other has 1 - p_max
            top, other = -c, (math.log(1 - math.exp(-c)) if c > 0 else -1e4)
            table[t, b, :, :] = -1e4
            table[t, b, :, 3 + (t + b) % 2] = top
            table[t, b, :, 4 - (t + b) % 2] = other
    return batch, Scripted(table)


CONF = [[0.5, 0.6, 0.3], [0.2, 0.4, 0.35], [0.3, 0.1, 0.36], [0.4, 0.3, 0.1]]  # (t, b)


def test_confidence_per_batch_picks_one_argmin_step():
    batch, model = scripted_case(CONF)
    pred, steps = stop_passes.confidence(model, batch, 4)
    means = [sum(row) / 3 for row in CONF]  # every sample has 2 scored positions: plain mean
    best = min(range(4), key=lambda t: means[t]) + 1
    assert steps.tolist() == [best] * 3
    assert torch.equal(pred, model.table[best - 1].argmax(-1))


def test_confidence_per_sample_picks_each_argmin():
    batch, model = scripted_case(CONF)
    pred, steps = stop_passes.confidence_per_sample(model, batch, 4)
    assert steps.tolist() == [2, 3, 4]
    for b, t in enumerate(steps.tolist()):
        assert torch.equal(pred[b], model.table[t - 1, b].argmax(-1))


def test_confidence_separates_steps_a_float32_softmax_rounds_to_zero():
    # leads of 20-35 nats: float32 log_softmax gives exactly 0 for all of them, so a
    # plain argmin would take the earliest step; the losses still differ and must rank
    conf = [[1e-9, 0.3, 0.5], [1e-12, 0.2, 0.5], [1e-10, 0.1, 1e-15]]
    batch, model = scripted_case(conf)
    assert float(-torch.log_softmax(model.table[0, 0], -1).max(-1).values.max()) == 0.0
    _, steps = stop_passes.confidence_per_sample(model, batch, 3)
    assert steps.tolist() == [2, 3, 3]
    tr = stop_passes.trace(model, batch, 3)
    assert torch.allclose(tr.confidence, torch.tensor(conf, dtype=torch.float64), rtol=1e-3, atol=0)


def test_released_float32_confidence_ties_sure_steps_at_zero():
    """eval.confidence_precision = "float32" is the released nn.CrossEntropyLoss: the same three
    rows give 0 wherever the lead is past ~17 nats, so ties take the earliest step."""
    conf = [[1e-9, 0.3, 0.5], [1e-12, 0.2, 0.5], [1e-10, 0.1, 1e-15]]
    batch, model = scripted_case(conf)
    with stop_passes.confidence_precision("float32"):
        _, steps = stop_passes.confidence_per_sample(model, batch, 3)
        tr = stop_passes.trace(model, batch, 3)
        released = F.cross_entropy(model.table[0, 0], model.table[0, 0].argmax(-1), reduction="none")
        assert torch.equal(stop_passes.token_confidence(model.table[0])[0].float(), released)
    assert steps.tolist() == [1, 3, 3]  # sample 0: steps 1 and 2 both 0.0, the earliest wins
    assert tr.confidence[:2, 0].tolist() == [0.0, 0.0]
    assert stop_passes.confidence_per_sample(model, batch, 3)[1].tolist() == [2, 3, 3]  # float64 again outside


def test_fixed_and_oracle_steps():
    batch, model = scripted_case(CONF)
    pred, steps = stop_passes.fixed(model, batch, 3)
    assert steps.tolist() == [3, 3, 3] and torch.equal(pred, model.table[2].argmax(-1))
    real = tiny().eval()
    pred, steps = stopping.predict_stop(real, mixed_batch(), "oracle")
    assert torch.equal(steps, mixed_batch().n_steps)
    assert torch.equal(pred, oracle_logits(real, mixed_batch()).argmax(-1))


def test_retirement_exact_rules_keep_the_result():
    # sample 0 reaches confidence 0 at t=2 (exact retirement); unimodal rows suit patience=1
    conf = [[0.5, 0.6, 0.3], [0.0, 0.4, 0.2], [0.3, 0.1, 0.25], [0.4, 0.3, 0.28], [0.1, 0.5, 0.3]]
    batch, model = scripted_case(conf)
    plain, _ = stop_passes.confidence_per_sample(model, batch, 5)
    for patience, cost in ((None, 5 + 5 + 5 - 3), (1, 2 + 4 + 3)):
        stats = {}
        pred, steps = stop_passes.confidence_per_sample(model, batch, 5, patience, stats)
        assert steps.tolist() == [2, 3, 2] and torch.equal(pred, plain)
        assert stats["sample_steps"] == cost


def test_trace_record_and_rule_parsing():
    batch, model = scripted_case(CONF)
    tr = stop_passes.trace(model, batch, 4)
    exact, conf = tr.exact, tr.confidence
    assert exact.shape == conf.shape == (4, 3)
    assert torch.allclose(conf, torch.tensor(CONF, dtype=torch.float64), atol=1e-4)
    right = model.table.argmax(-1)[:, torch.arange(3)] == batch.targets
    assert torch.equal(exact, (right | ~batch.scored).all(-1))
    rule = stopping.parse_rule("fixed:7")
    assert isinstance(rule, stopping.Fixed) and rule.args == [7] and str(rule) == "fixed:7"
    rule = stopping.parse_rule("confidence-per-sample:40:3")
    assert isinstance(rule, stopping.ConfidencePerSample) and rule.args == [40, 3]
    assert stopping.parse_rule(rule) is rule and set(stopping.RULES) == {
        "oracle", "fixed", "confidence", "confidence-per-sample", "first-confident", "halt"}
    rule = stopping.parse_rule("confidence:+20")  # the released window: T(n) + 20, per batch
    assert rule.relative and rule.args == [20] and str(rule) == "confidence:+20"
    assert rule.steps_needed(batch) == int(batch.n_steps.max()) + 20
    rule = stopping.parse_rule("confidence-per-sample:+2:3")
    assert rule.relative and rule.args == [2, 3] and str(rule) == "confidence-per-sample:+2:3"
    assert not stopping.parse_rule("confidence:20").relative
    for bad in ("fixed", "fixed:x", "confidence:0", "oracle:3", "best", "fixed:+3", "confidence:+0",
                "confidence:+x", "confidence:-3", "confidence: 4", "confidence-per-sample:4:+1"):
        with pytest.raises(ValueError, match="oracle, fixed:N, confidence"):
            stopping.parse_rule(bad)



def test_rules_read_from_one_trace_match_their_own_passes():
    batch, model = scripted_case(CONF)
    tr = stop_passes.trace(model, batch, 4)
    for rule in ("fixed:3", "confidence", "confidence:2", "confidence-per-sample", "confidence-per-sample:3"):
        if stopping.steps_needed(batch, rule) > 4:
            assert stopping.readout(tr, batch, rule) is None  # the default search bound 2 T(n) is 8 here
            continue
        values, steps = stopping.readout(tr, batch, rule)
        pred, want = stopping.predict_stop(model, batch, rule)
        assert torch.equal(steps, want), rule
        assert torch.equal(values["accuracy"], ((pred == batch.targets) | ~batch.scored).all(1)), rule
    assert stopping.readout(tr, batch, "confidence-per-sample:4:1") is None  # patience needs its own pass
    model, batch = tiny().eval(), mixed_batch()  # a real model, samples of several lengths
    tr = stop_passes.trace(model, batch, 16)  # 2 T(n) of the longest
    for rule in ("oracle", "fixed:5", "confidence", "confidence:6", "confidence-per-sample", "confidence-per-sample:9",
                 "confidence:+3", "confidence-per-sample:+8"):
        values, steps = stopping.readout(tr, batch, rule)
        pred, want = stopping.predict_stop(model, batch, rule)
        right = (pred == batch.targets) & batch.scored
        assert torch.equal(steps, want), rule
        assert torch.equal(values["accuracy"], (right | ~batch.scored).all(1)), rule
        assert torch.allclose(values["token_accuracy"], right.sum(1).float() / batch.scored.sum(1)), rule


def test_rules_on_a_real_model_agree_with_the_per_step_record():
    model, batch = tiny().eval(), mixed_batch()
    tr = stop_passes.trace(model, batch, 12)
    exact, conf = tr.exact, tr.confidence
    _, steps = stop_passes.confidence_per_sample(model, batch, 12)
    assert torch.equal(steps, conf.argmin(0) + 1)
    _, steps = stop_passes.confidence(model, batch, 12)
    tokens = batch.scored.sum(1)
    assert steps.unique().tolist() == [int(((conf * tokens).sum(1)).argmin()) + 1]
    method = get_method("looped")
    for rule in ("oracle", "fixed:4", "confidence", "confidence:6", "confidence-per-sample:12:2"):
        pred, steps = method.predict_stop(model, batch, rule)
        assert pred.shape == batch.inputs.shape and steps.shape == (len(batch),)
    pred, steps = method.predict_stop(model, batch, "fixed:4")
    assert torch.equal(exact[3], ((pred == batch.targets) | ~batch.scored).all(1))


def test_a_model_with_nan_logits_stops_at_step_1_under_every_rule():
    """A broken model must not crash the rules, and the one-pass readout must agree with them."""
    model, batch = tiny().eval(), mixed_batch()
    with torch.no_grad():
        model.lm_head.weight[0, 0] = float("nan")
    tr = stop_passes.trace(model, batch, 16)
    for rule in ("confidence", "confidence-per-sample", "confidence-per-sample:16:2"):
        _, steps = stopping.predict_stop(model, batch, rule)
        assert steps.tolist() == [1] * len(batch), rule
        read = stopping.readout(tr, batch, rule)
        assert read is None or torch.equal(read[1], steps), rule


def test_a_looped_method_reads_out_its_rules_from_one_pass_as_each_alone():
    """Method.read_out, what evaluation asks: rules read from one shared trace choose and score as
    each rule's own pass does; with per_step, the curve is the trace's sums over the batch after
    each iteration t <= 2 T(n), and the oracle step beside them."""
    model, batch, task, method = tiny().eval(), mixed_batch(), get_task("copy"), get_method("looped")
    stops = method.stops(["oracle", "fixed:3", "confidence", "oracle"])
    assert stops == ["oracle", "fixed:3", "confidence"] and method.stops() == ["oracle"]
    shared, curve = method.read_out(model, batch, task, stops, per_step=True)
    for stop, (values, steps) in zip(stops, shared):
        ((alone, alone_steps),), none = method.read_out(model, batch, task, [stop])
        assert none is None and torch.equal(steps, alone_steps), stop
        assert all(torch.equal(values[k], alone[k]) for k in ("accuracy", "token_accuracy")), stop
    tr = stop_passes.trace(model, batch, stopping.default_t_max(batch), task)
    assert torch.equal(curve["accuracy"], tr.exact.float().sum(1))
    assert torch.equal(curve["confidence"], tr.confidence.sum(1))
    assert curve["oracle_step"].tolist() == [float(batch.n_steps.sum())] * len(tr.exact)
    with pytest.raises(ValueError, match="halting head"):
        method.stops(["oracle", "halt"])


def test_a_looped_method_reads_out_in_its_own_confidence_precision():
    """eval.confidence_precision is the method's setting: its read-out enters it (the rows of
    test_released_float32_confidence_ties_sure_steps_at_zero)."""
    batch, model = scripted_case([[1e-9, 0.3, 0.5], [1e-12, 0.2, 0.5], [1e-10, 0.1, 1e-15]])
    released = get_method("looped", new_run_config(None, ["method=looped", "eval.confidence_precision=float32"]))
    for method, picked in ((released, [1, 3, 3]), (get_method("looped"), [2, 3, 3])):
        ((_, steps),), _ = method.read_out(model, batch, get_task("parity"), ["confidence-per-sample:3"])
        assert steps.tolist() == picked


def test_a_method_without_stop_rules_reads_out_its_own_prediction():
    """The plain read-out: the method's prediction scored by the task, no step, no curve; stop
    rules are ignored here (the CLI and the grid refuse them)."""
    cfg = new_run_config(None, ["model.n_layer=1", "model.d_model=16", "model.n_head=2", "task.name=copy"])
    task, method = get_task("copy"), get_method("ntp", cfg)
    model, batch = method.build_model(cfg, task).eval(), mixed_batch()
    assert method.stops(["oracle"]) == [None]
    ((values, steps),), curve = method.read_out(model, batch, task, [None], per_step=True)
    exact, token = score(method.predict(model, batch), batch)
    assert steps is None and curve is None
    assert torch.equal(values["accuracy"], exact) and torch.equal(values["token_accuracy"], token)
