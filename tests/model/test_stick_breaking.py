"""Stick-breaking attention: the properties its definition implies, a 3-key example worked by
hand, the reference implementation's formula, and the scheme inside a model (chunks, recording,
training, the fused function)."""
import math

import pytest
import torch
import torch.nn.functional as F

from lengthgen.config.schema import ModelConfig
from lengthgen.model import content_attention as ca
from lengthgen.model.attention import AttentionDropout, recording
from lengthgen.model.content_attention import stick_breaking_attention
from lengthgen.model.positions import build_scheme
from lengthgen.model.transformer import Transformer
from fitting import trains_with_finite_gradients

pytestmark = pytest.mark.usefixtures("one_thread")


def rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def whole(chunks):
    """Recorded chunks (B, H, c, keys up to the chunk's last query) as one (B, H, T, T)."""
    T = chunks[-1].shape[-1]
    return torch.cat([F.pad(c, (0, T - c.shape[-1])) for c in chunks], 2)


def weights_of(q, k, chunk=0, dropout=ca.NO_DROPOUT):
    """The recorded weights (B, H, T, T) of one call: the stick on the earlier keys, the remainder
    on the diagonal."""
    kept = []
    stick_breaking_attention(q, k, torch.zeros_like(k), chunk, dropout, kept)
    return whole(kept)


def keys_scoring(z):
    """q, k of width 4 whose last query scores z[j] for key j: q_last . k_j / sqrt(4) = z[j]."""
    T = len(z) + 1
    q, k = torch.zeros(1, 1, T, 4), torch.zeros(1, 1, T, 4)
    q[..., -1, 0] = 2.0
    k[0, 0, :-1, 0] = torch.tensor(z, dtype=torch.float32)
    return q, k


def test_the_stick_is_nonnegative_sums_to_at_most_one_and_the_rest_is_the_query_own():
    w = weights_of(rand(2, 3, 17, 8), rand(2, 3, 17, 8, seed=1))
    stick = w.tril(-1)
    assert float(w.min()) >= 0
    assert torch.all(stick.sum(-1) <= 1 + 1e-6)
    torch.testing.assert_close(w.diagonal(dim1=-2, dim2=-1), 1 - stick.sum(-1), atol=1e-6, rtol=0)
    assert float(w.diagonal(dim1=-2, dim2=-1)[..., 0].min()) == 1.0  # the first query has no key: all its own


def test_future_keys_get_nothing_and_change_nothing():
    q, k, v = rand(1, 2, 12, 4), rand(1, 2, 12, 4, seed=1), rand(1, 2, 12, 4, seed=2)
    assert float(weights_of(q, k).triu(1).abs().max()) == 0
    base = stick_breaking_attention(q, k, v)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, 7:] += 5.0
    v2[:, :, 7:] -= 3.0
    torch.testing.assert_close(stick_breaking_attention(q, k2, v2)[:, :, :7], base[:, :, :7], atol=0, rtol=0)


def test_the_nearest_key_breaks_the_stick_first():
    """With every z equal (beta = sigmoid(0.7)), each key further back gets (1 - beta) times the one after it."""
    beta = torch.sigmoid(torch.tensor(0.7))
    w = weights_of(*keys_scoring([0.7] * 8))[0, 0, -1]  # the last query: keys 0..7, its own at 8
    for j in range(8):
        assert w[j] == pytest.approx(float(beta * (1 - beta) ** (7 - j)), rel=1e-5)
    assert torch.all(w[:7] < w[1:8])  # nearer, larger
    assert w[8] == pytest.approx(float((1 - beta) ** 8), rel=1e-5)


def test_three_keys_worked_by_hand():
    """z = (-log 3, 0, log 3) for keys 0, 1, 2: betas 1/4, 1/2, 3/4. Key 2 (nearest) takes 3/4; key 1
    half of the 1/4 left, 1/8; key 0 a quarter of the 1/8 left, 1/32; the query keeps 1/4 * 1/2 * 3/4 = 3/32."""
    q, k = keys_scoring([-math.log(3), 0.0, math.log(3)])
    v = torch.eye(4)[None, None] * torch.tensor([1.0, 10.0, 100.0, 1000.0])  # v_j picks out weight j
    out = stick_breaking_attention(q, k, v)[0, 0, -1]
    torch.testing.assert_close(out, torch.tensor([1 / 32, 10 / 8, 100 * 3 / 4, 1000 * 3 / 32]))


def reference(q, k, v):
    """shawntan/stickbreaking-attention at 3147a3841b025a31d271fc8f873120ff6fa0461b:
    stickbreaking_attention/sb_ref.py `stickbreaking` with tests/test_attn.py's `ref_fwd`
    (attend_current=False: the diagonal masked; the remainder added to the query's own value),
    transcribed; float64 here, so the -1e5 fill gives exactly 0."""
    length = q.shape[-2]
    cum_weight = torch.ones(length, length).tril(-1).to(q)
    mask = torch.ones(length, length).triu(0).bool()
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    log_z = F.logsigmoid(logits).masked_fill(mask, -1e5)
    log_beta = F.logsigmoid(-logits).masked_fill(mask, 0)
    re_cum_log_beta = torch.einsum("bhij,jk->bhik", log_beta, cum_weight)
    att = (log_z + re_cum_log_beta).exp()
    o, rem = att @ v, 1 - att.sum(dim=-1)
    return o + rem[..., None] * v


@pytest.mark.parametrize("chunk", [0, 5])
def test_the_reference_formula_gives_the_same_output_and_gradients(chunk):
    tensors = [(2 * rand(2, 3, 23, 8, seed=s)).requires_grad_() for s in range(3)]
    doubles = [t.detach().double().requires_grad_() for t in tensors]
    got, want = stick_breaking_attention(*tensors, chunk), reference(*doubles)
    torch.testing.assert_close(got, want.float(), atol=1e-5, rtol=1e-5)
    upstream = rand(2, 3, 23, 8, seed=9)
    got.backward(upstream)
    want.backward(upstream.double())
    for a, b in zip(tensors, doubles):
        torch.testing.assert_close(a.grad, b.grad.float(), atol=1e-5, rtol=1e-5)


def test_the_nearest_weights_stay_exact_behind_a_long_broken_stick():
    """1000 far keys each leave e^-20 of the stick (the row's log sum near -2e4, where a float32
    step is 2e-3); nine near keys at z = 0 take 1/2, 1/4, ... exactly, as the sums run from the query."""
    w = weights_of(*keys_scoring([20.0] * 1000 + [0.0] * 9))[0, 0, -1]
    torch.testing.assert_close(w[-10:-1], 0.5 ** torch.arange(9, 0, -1.0), atol=0, rtol=1e-6)
    assert float(w[:-10].sum()) == pytest.approx(2.0 ** -9, rel=1e-5)  # the first far key takes what is left


def test_chunks_give_the_whole_result_and_never_the_whole_window():
    q, k, v = (rand(2, 2, 40, 4, seed=s).requires_grad_() for s in range(3))
    whole = stick_breaking_attention(q, k, v, 0)
    grads = torch.autograd.grad(whole.square().sum(), (q, k, v))
    sizes, original = [], torch.Tensor.__matmul__

    def spy(a, b):
        out = original(a, b)
        sizes.append(out.shape[-2] * out.shape[-1])
        return out

    torch.Tensor.__matmul__ = spy
    try:
        chunked = stick_breaking_attention(q, k, v, 6)
    finally:
        torch.Tensor.__matmul__ = original
    assert max(sizes) <= 6 * 40
    torch.testing.assert_close(chunked, whole, atol=1e-6, rtol=1e-6)
    for a, b in zip(torch.autograd.grad(chunked.square().sum(), (q, k, v)), grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights_of(q, k, 6), weights_of(q, k, 0))


def test_logits_dropout_drops_z_and_weights_dropout_drops_the_weights():
    """Every z dropped (p = 1) makes every beta 1/2: key i-1-n gets 2^-(n+1), the query 2^-i."""
    q, k = rand(1, 1, 6, 4), rand(1, 1, 6, 4, seed=1)
    w = weights_of(q, k, dropout=AttentionDropout(1.0, "logits"))[0, 0]
    i, j = torch.arange(6)[:, None], torch.arange(6)[None, :]
    want = torch.where(j < i, 0.5 ** (i - j).float(), torch.where(j == i, 0.5 ** i.float(), 0.0))
    torch.testing.assert_close(w, want, atol=0, rtol=0)
    out = stick_breaking_attention(q, k, rand(1, 1, 6, 4, seed=2), dropout=AttentionDropout(1.0, "weights"))
    assert float(out.abs().max()) == 0


def test_the_chunk_option_is_checked():
    for bad in (-1, True, 2.0, "8"):
        with pytest.raises(ValueError, match="stickbreaking chunk"):
            build_scheme(ModelConfig(position="stickbreaking", position_options={"chunk": bad}))
    assert build_scheme(ModelConfig(position="stickbreaking", position_options={"chunk": 0})).chunk == 0


def tiny(seed=0, options=None, **settings):
    torch.manual_seed(seed)
    cfg = ModelConfig(d_model=16, n_layer=2, n_head=2, position="stickbreaking", position_options=options or {},
                      **settings)
    return Transformer(cfg, 13)


def test_recording_leaves_the_output_and_records_the_definition():
    model, T = tiny(seed=3, options={"chunk": 4}).eval(), 9
    inputs, ids = torch.randint(0, 13, (2, T), generator=torch.Generator().manual_seed(4)), torch.arange(T)[None]
    with torch.no_grad():
        plain = model(inputs)
        with recording(model) as recorder:
            recorded = model(inputs)
        with recording(model, last_only=True) as last:
            model(inputs)
        block = model.blocks[0]
        q, k, _ = block.attn.c_attn(block.ln_1(model.embed(inputs, ids))).split(16, dim=2)
        q, k = (t.view(2, T, 2, 8).transpose(1, 2) for t in (q, k))
    torch.testing.assert_close(recorded, plain)
    got = whole(recorder.weights[0])
    beta = torch.sigmoid(q @ k.transpose(-2, -1) / math.sqrt(8))
    for i in range(T):  # the definition, key by key from the query back
        left = torch.ones(2, 2)
        for j in range(i - 1, -1, -1):
            torch.testing.assert_close(got[:, :, i, j], beta[:, :, i, j] * left)
            left = left * (1 - beta[:, :, i, j])
        torch.testing.assert_close(got[:, :, i, i], left)
    torch.testing.assert_close(last.weights[0][-1], got[:, :, -1:])
    assert len(last.weights[0]) == 1


@pytest.mark.parametrize("on", ["weights", "logits"])
def test_a_tiny_model_trains_with_finite_gradients(on):
    model = tiny(attn_dropout=0.1, attn_dropout_on=on).train()
    x = torch.randint(0, 13, (4, 10), generator=torch.Generator().manual_seed(1))
    trains_with_finite_gradients(model, x)


@pytest.mark.slow  # compiles the function (inductor's CPU path)
def test_the_fused_attention_is_the_eager_attention():
    import lengthgen.accel  # noqa: F401 (installs the fuser: without it, fused is the eager function again)
    assert ca.fused("stickbreaking") is not stick_breaking_attention
    results = []
    for attention in (stick_breaking_attention, ca.fused("stickbreaking")):
        # chunks of 4 (then 3): the loop is compiled too; the shapes of tests/accel/test_fused_attention.py,
        # whose compiled graphs this then reuses
        tensors = [rand(2, 3, 7, 8, seed=s).requires_grad_() for s in range(3)]
        out = attention(*tensors, 4, ca.NO_DROPOUT)
        (out * torch.linspace(-1, 1, 8)).sum().backward()
        results.append((out.detach(), [t.grad for t in tensors]))
    (eager, eager_grads), (fused, fused_grads) = results
    torch.testing.assert_close(fused, eager, atol=1e-5, rtol=1e-4)
    for a, b in zip(fused_grads, eager_grads):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
