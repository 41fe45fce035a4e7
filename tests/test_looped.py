"""Looped transformer, its step-dependent loss, the stop rules and the baselines."""
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from lengthgen import methods, presets, stop_passes, stopping
from lengthgen.attention import Packed
from lengthgen.looped import LoopedTransformer, looped_loss, oracle_logits
from lengthgen.positions import SCHEMES
from lengthgen.methods import METHODS, get_method, pause_batch, steps_at
from lengthgen.tasks import BLANK, IGNORE, PAD, Batch, get_task

MIXED = torch.tensor([1, 5, 3, 8, 2, 5, 1])  # mixed lengths, repeats and ties in T(n)


def tiny(injection=True, seed=0, **model):
    torch.manual_seed(seed)
    cfg = presets.load(None, ["model.n_layer=1", "model.d_model=32", "model.n_head=2"]
                      + [f"model.{k}={v}" for k, v in model.items()])
    return LoopedTransformer(cfg.model, get_task("copy").vocab_size, injection=injection)


def mixed_batch(task="copy", lengths=MIXED, seed=1):
    return get_task(task).sample(len(lengths), lengths, torch.Generator().manual_seed(seed))


# --- model ------------------------------------------------------------------

def test_first_iteration_is_blocks_on_embedding():
    model = tiny().eval()
    x = mixed_batch().blank_answers().inputs
    pos = model.position_ids_for(x)
    e = model.embed(x, pos)
    expected = model.lm_head(model.ln_f(model.run_blocks(e, pos)))
    assert torch.allclose(model(x, n_steps=1), expected, atol=1e-6)
    assert torch.allclose(next(model.iterate(x, None, 3)), expected, atol=1e-6)


def test_injection_changes_later_iterations_only():
    with_inj, without = tiny(True).eval(), tiny(False).eval()
    without.load_state_dict(with_inj.state_dict())
    x = mixed_batch().blank_answers().inputs
    assert torch.allclose(with_inj(x, n_steps=1), without(x, n_steps=1), atol=1e-6)  # h_0 = 0 vs e: same h_1
    assert not torch.allclose(with_inj(x, n_steps=3), without(x, n_steps=3), atol=1e-3)
    steps = list(with_inj.iterate(x, None, 3))
    assert torch.allclose(steps[-1], with_inj(x, n_steps=3), atol=1e-6)


def test_training_loss_is_the_benchmarked_packed_path(monkeypatch):
    """benchmarks/looped_speed.py times looped_loss; training must run it too,
    not the (B, L, V) logits that evaluation pads for its stop rules."""
    model, batch = tiny(), mixed_batch()
    expected = looped_loss(model, batch)

    def padded_logits(*args, **kwargs):
        raise AssertionError("training padded the logits")
    monkeypatch.setattr(methods, "oracle_logits", padded_logits)
    for name in ("looped", "looped-wo-injection"):
        assert torch.equal(get_method(name).loss(model, batch), expected)


@pytest.mark.parametrize("position", sorted(SCHEMES))
@pytest.mark.parametrize("explicit_ids", [False, True])
def test_prefix_and_max_schemes_same_loss_and_gradients(position, explicit_ids):
    model = tiny(position=position)
    batch = mixed_batch()
    if explicit_ids:  # e.g. randomly shifted positions: rows must stay with their own ids
        shift = torch.randint(0, 50, (len(batch), 1), generator=torch.Generator().manual_seed(0))
        batch.position_ids = torch.arange(batch.inputs.shape[1])[None, :] + shift
    grads = {}
    for scheme in ("prefix", "prefix-padded", "max"):
        model.zero_grad()
        loss = looped_loss(model, batch, scheme)
        loss.backward()
        grads[scheme] = (loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None])
    for scheme in ("prefix", "prefix-padded"):
        assert torch.allclose(grads[scheme][0], grads["max"][0], atol=1e-6)
        assert len(grads[scheme][1]) == len(grads["max"][1]) > 0
        for a, b in zip(grads[scheme][1], grads["max"][1]):
            assert torch.allclose(a, b, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("widths", [[5, 3, 3, 1], [4, 4, 4]])
def test_packed_rows_round_trip(widths):
    layout = Packed(widths)
    tokens = torch.randn(sum(widths), 6)
    rows = layout.pad(tokens)  # (k, W, C)
    assert rows.shape == (len(widths), max(widths), 6)
    start = 0
    for r, w in enumerate(widths):  # row r holds its own tokens, then zeros
        assert torch.equal(rows[r, :w], tokens[start:start + w])
        assert not rows[r, w:].any()
        start += w
    assert torch.equal(layout.unpad(rows), tokens)
    rounded = Packed(widths, multiple=8)  # token array rounded up to 8 rows, zeros at the end
    padded = rounded.unpad(rows)
    assert padded.shape[0] == rounded.capacity == -(-sum(widths) // 8) * 8
    assert torch.equal(padded[:sum(widths)], tokens) and not padded[sum(widths):].any()
    assert torch.equal(rounded.pad(padded), rows)


def test_loss_is_mean_over_scored_tokens():
    model, batch = tiny(), mixed_batch()
    logits = oracle_logits(model, batch, "max")
    tokens = F.cross_entropy(logits.flatten(0, 1), batch.targets.flatten(), ignore_index=IGNORE, reduction="sum")
    assert torch.allclose(looped_loss(model, batch), tokens / batch.scored.sum(), atol=1e-6)
    with pytest.raises(ValueError, match="unknown loss scheme 'fast'"):
        looped_loss(model, batch, "fast")


def test_each_sample_read_at_its_own_step():
    model, batch = tiny().eval(), mixed_batch()
    logits = oracle_logits(model, batch)
    for i in range(len(batch)):
        one = batch.select(torch.tensor([i]))
        alone = model(one.blank_answers().inputs, n_steps=int(one.n_steps[0]))  # (1, w, V)
        scored = one.scored[0]
        assert torch.allclose(logits[i, :scored.shape[0]][scored], alone[0][scored], atol=1e-5)


def test_methods_registered_and_predict_shape():
    for name in ("looped", "looped-wo-injection", "ntp-loop", "ntp-pause", "ntp"):
        assert name in METHODS
    cfg = presets.load(None, ["method=looped", "model.n_layer=1", "model.d_model=32"])
    task = get_task("copy")
    batch = mixed_batch()
    for name, injection in (("looped", True), ("looped-wo-injection", False)):
        method = get_method(name)
        model = method.build_model(cfg, task)
        assert model.injection is injection
        assert method.predict(model, batch).shape == batch.inputs.shape


def _train_and_score(tmp_path: Path, overrides: list[str], lengths) -> list[float]:
    from lengthgen.evaluate import accuracy_at
    from lengthgen.train import train
    cfg = presets.load(None, overrides + ["train.device=cpu"])
    train(cfg, tmp_path / "run", progress=False)
    task, method = get_task(cfg.task.name), get_method(cfg.method)
    model = method.build_model(cfg, task)
    from lengthgen import checkpoint
    checkpoint.load_weights(model, checkpoint.latest(tmp_path / "run") / "model.safetensors")
    model.eval()
    return [accuracy_at(task, method, model, n, 256, 256, 7, torch.device("cpu"))[0] for n in lengths]


def test_looped_learns_parity(tmp_path):
    acc = _train_and_score(tmp_path, [
        "method=looped", "task.name=parity", "task.train_max=8", "model.n_layer=1", "model.d_model=64",
        "model.n_head=4", "train.steps=1500", "train.lr=1e-3", "train.batch_size=32", "train.warmup_steps=50",
        "train.curriculum_start=2", "train.curriculum_interval=40", "train.log_interval=500",
        "train.checkpoint_interval=1500"], range(1, 9))
    assert min(acc) >= 0.95, acc


# --- stop rules ---------------------------------------------------------------

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


# --- baselines ----------------------------------------------------------------

def slow_pause(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sample reference of pause_batch: question, T(n) BLANKs, answer."""
    rows = []
    for i in range(len(batch)):
        q, a, p = int(batch.question_len[i]), int(batch.scored[i].sum()) - 1, int(batch.n_steps[i])
        x = batch.inputs[i, :q].tolist() + [BLANK] * p + batch.inputs[i, q:q + a].tolist()
        y = [IGNORE] * (q - 1 + p) + batch.targets[i, q - 1:q + a].tolist()
        rows.append((x, y))
    width = max(len(x) for x, _ in rows)
    inputs = torch.tensor([x + [PAD] * (width - len(x)) for x, _ in rows])
    targets = torch.tensor([y + [IGNORE] * (width - len(y)) for _, y in rows])
    return inputs, targets


@pytest.mark.parametrize("task", ["copy", "multiplication", "binary_sum"])
def test_pause_batch_matches_slow_reference(task):
    batch = mixed_batch(task)
    paused = pause_batch(batch)
    inputs, targets = slow_pause(batch)
    assert torch.equal(paused.inputs, inputs) and torch.equal(paused.targets, targets)
    assert torch.equal(paused.question_len, batch.question_len + batch.n_steps)
    assert torch.equal(paused.scored.sum(1), batch.scored.sum(1))


def test_pause_logits_map_back_to_the_original_layout():
    cfg = presets.load(None, ["method=ntp-pause", "model.n_layer=1", "model.d_model=32"])
    task, method = get_task("copy"), get_method("ntp-pause")
    model, batch = method.build_model(cfg, task).eval(), mixed_batch()
    paused = pause_batch(batch)
    direct = model(paused.inputs)  # (B, W', V)
    mapped = method.logits(model, batch)  # (B, L, V)
    assert mapped.shape[:2] == batch.inputs.shape
    assert torch.allclose(mapped[batch.scored], direct[paused.scored], atol=1e-6)
    ce = F.cross_entropy(direct.flatten(0, 1), paused.targets.flatten(), ignore_index=IGNORE)
    assert torch.allclose(method.loss(model, batch), ce, atol=1e-6)


def test_ntp_loop_runs_its_block_t_train_max_times():
    cfg = presets.load(None, ["method=ntp-loop", "task.name=multiplication", "task.train_max=5",
                             "model.n_layer=1", "model.d_model=32"])
    task, method = get_task("multiplication"), get_method("ntp-loop")
    model = method.build_model(cfg, task).eval()
    assert model.n_loops == steps_at(task, 5) == 10  # T = len(a) * n, a up to 2 bits
    batch = mixed_batch("multiplication", torch.tensor([1, 3, 5]))
    assert torch.allclose(method.logits(model, batch), model(batch.inputs, n_steps=10), atol=1e-6)


@pytest.mark.parametrize("name", ["ntp-loop", "ntp-pause", "looped-wo-injection"])
def test_baselines_loss_drops(name):
    cfg = presets.load(None, [f"method={name}", "task.name=copy", "task.train_max=4",
                             "model.n_layer=1", "model.d_model=32", "model.n_head=2"])
    task, method = get_task("copy"), get_method(name)
    torch.manual_seed(0)
    model = method.build_model(cfg, task)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    losses = []
    for _ in range(80):
        batch = task.sample(32, torch.randint(1, 5, (32,), generator=gen), gen)
        loss = method.loss(model, batch)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert sum(losses[-10:]) / 10 < 0.7 * sum(losses[:10]) / 10, losses


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
