"""Looped transformer, its step-dependent loss and the baselines (stop rules: test_stop_rules.py)."""

import pytest
import torch
import torch.nn.functional as F

from lengthgen.assembly.runs import new_run_config
from lengthgen.methods.base import steps_at
from lengthgen.methods.looped import methods  # the module whose oracle_logits the looped methods call
from lengthgen.methods.looped.block import LoopedTransformer, looped_loss, oracle_logits
from lengthgen.methods.next_token import pause_batch
from lengthgen.methods.registry import METHODS, get_method
from lengthgen.model.attention import Packed
from lengthgen.model.positions import SCHEMES
from lengthgen.tasks import BLANK, IGNORE, PAD, Batch, get_task

MIXED = torch.tensor([1, 5, 3, 8, 2, 5, 1])  # mixed lengths, repeats and ties in T(n)


def tiny(injection=True, seed=0, **model):
    torch.manual_seed(seed)
    cfg = new_run_config(None, ["model.n_layer=1", "model.d_model=32", "model.n_head=2"]
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
    """benchmarks/speed/looped_speed.py times looped_loss; training must run it too,
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


def test_rows_of_one_width_are_views_with_the_values_of_the_general_path():
    layout = Packed([4, 4, 4])  # one length per batch, as every CPU preset trains
    tokens = torch.randn(12, 6)
    rows = layout.pad(tokens)
    assert layout.uniform and rows.data_ptr() == tokens.data_ptr()  # no copy, and no graph break when compiled
    assert torch.equal(rows, layout.pad_runs(tokens)) and torch.equal(layout.unpad(rows), layout.unpad_runs(rows))
    assert not Packed([4, 4, 3]).uniform and not Packed([4, 4, 4], multiple=8).uniform  # 12 tokens in 16 rows


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
    cfg = new_run_config(None, ["method=looped", "model.n_layer=1", "model.d_model=32"])
    task = get_task("copy")
    batch = mixed_batch()
    for name, injection in (("looped", True), ("looped-wo-injection", False)):
        method = get_method(name)
        model = method.build_model(cfg, task)
        assert model.injection is injection
        assert method.predict(model, batch).shape == batch.inputs.shape


# test_looped_learns_parity: tests/methods/test_looped_learns.py (it shares a run with the probe's test)


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
    cfg = new_run_config(None, ["method=ntp-pause", "model.n_layer=1", "model.d_model=32"])
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
    cfg = new_run_config(None, ["method=ntp-loop", "task.name=multiplication", "task.train_max=5",
                             "model.n_layer=1", "model.d_model=32"])
    task, method = get_task("multiplication"), get_method("ntp-loop")
    model = method.build_model(cfg, task).eval()
    assert method.n_loops == steps_at(task, 5) == 10  # T = len(a) * n, a up to 2 bits
    batch = mixed_batch("multiplication", torch.tensor([1, 3, 5]))
    assert torch.allclose(method.logits(model, batch), model(batch.inputs, n_steps=10), atol=1e-6)


@pytest.mark.parametrize("name", ["ntp-loop", "ntp-pause", "looped-wo-injection"])
def test_baselines_loss_drops(name):
    cfg = new_run_config(None, [f"method={name}", "task.name=copy", "task.train_max=4",
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
