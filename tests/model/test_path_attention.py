"""PaTH attention (Yang et al., 2025), checked against its definition S_ij = q_i^T H_i ... H_{j+1} k_j,
H_t = I - beta_t w_t w_t^T: the chunked form equals the matrix products at every chunk size, a
hand-built three-token product is applied in the right order, beta = 0 is NoPE, beta = 2 makes each H
orthogonal, the KV cache's recurrence decodes what the full forward computes, and fla's kernel (on a
GPU with fla installed) agrees with the chunked form."""
import math

import pytest
import torch
import torch.nn.functional as F

from lengthgen.config.schema import ModelConfig
from lengthgen.model.attention import NO_DROPOUT, KVCache, recording
from lengthgen.model.generate import greedy
from lengthgen.model.path_attention import PaTH, PaTHFoX, fla_kernel, path_scores, reference_scores
from lengthgen.model.positions import build_scheme
from lengthgen.model.transformer import Transformer
from fitting import trains_with_finite_gradients

pytestmark = pytest.mark.usefixtures("one_thread")


def cfg(**kw) -> ModelConfig:
    base = dict(d_model=32, n_layer=2, n_head=4, max_positions=64, position="path", init="torch")
    base.update(kw)
    return ModelConfig(**base)


def inputs(T: int, seed: int = 0, D: int = 8):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 3, T, D, generator=g), torch.randn(2, 3, T, D, generator=g)
    w = F.normalize(torch.randn(2, 3, T, D, generator=g), dim=-1)
    beta = 2 * torch.rand(2, 3, T, generator=g)
    return q, k, w, beta


@pytest.mark.parametrize("chunk", [1, 3, 4, 11, 64])
def test_the_chunked_form_is_the_definition(chunk):
    q, k, w, beta = inputs(11)
    want = reference_scores(q, k, w, beta)
    got = path_scores(q, k, w, beta, chunk)
    assert torch.equal(torch.isinf(got), torch.isinf(want))  # the same future masked
    finite = torch.isfinite(want)
    assert torch.allclose(got[finite], want[finite], atol=1e-4), (got[finite] - want[finite]).abs().max()


def test_three_tokens_by_hand_the_product_runs_from_the_query_back_to_the_key():
    # 2-d, w_1 = e_x, w_2 = e_y, beta 2: H_1 flips x, H_2 flips y. The key k_0 = (1, 1) reaches query 2 as
    # H_2 H_1 k_0 = (-1, -1), query 1 as H_1 k_0 = (-1, 1); token 0's own H never touches anything.
    q = torch.tensor([[1.0, 0.0], [1.0, 2.0], [3.0, 5.0]])[None, None]
    k = torch.tensor([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])[None, None]
    w = torch.tensor([[0.6, 0.8], [1.0, 0.0], [0.0, 1.0]])[None, None]
    beta = torch.tensor([[[2.0, 2.0, 2.0]]])
    s = path_scores(q, k, w, beta)
    assert s[0, 0, 0, 0] == 1.0  # q_0 . k_0
    assert s[0, 0, 1, 0] == 1 * -1 + 2 * 1  # q_1 . H_1 k_0
    assert s[0, 0, 2, 0] == 3 * -1 + 5 * -1  # q_2 . H_2 H_1 k_0
    assert s[0, 0, 2, 1] == 3 * 1 + 5 * 0  # q_2 . H_2 k_1 = q_2 . (1, 0)
    # the other order (H_1 H_2 applied to k) differs where the transforms do not commute
    w2 = torch.tensor([[0.6, 0.8], [1.0, 0.0], [0.6, 0.8]])[None, None]
    H1, H2 = torch.eye(2) - 2 * torch.outer(w2[0, 0, 1], w2[0, 0, 1]), torch.eye(2) - 2 * torch.outer(w2[0, 0, 2], w2[0, 0, 2])
    right, wrong = q[0, 0, 2] @ H2 @ H1 @ k[0, 0, 0], q[0, 0, 2] @ H1 @ H2 @ k[0, 0, 0]
    assert not torch.isclose(right, wrong)
    assert torch.isclose(path_scores(q, k, w2, beta)[0, 0, 2, 0], right)


def test_beta_two_and_a_unit_w_make_each_transform_orthogonal_so_norms_are_kept():
    _, _, w, _ = inputs(5)
    H = torch.eye(8) - 2 * w[..., :, None] * w[..., None, :]
    assert torch.allclose(H @ H.transpose(-2, -1), torch.eye(8).expand_as(H), atol=1e-5)
    # so a key carried to any query keeps its length: with q = that key's direction, S_ij <= |k_j|
    q, k, w, _ = inputs(6)
    s = reference_scores(k / k.norm(dim=-1, keepdim=True), k, w, torch.full((2, 3, 6), 2.0))
    assert torch.allclose(s.diagonal(dim1=-2, dim2=-1), k.norm(dim=-1), atol=1e-5)
    assert (s.nan_to_num(neginf=0) <= k.norm(dim=-1)[..., None, :] + 1e-5).all()


def test_beta_zero_is_nope():
    torch.manual_seed(0)
    model = Transformer(cfg(), 11).eval()
    nope = Transformer(cfg(position="nope"), 11).eval()
    nope.load_state_dict({k: v for k, v in model.state_dict().items() if not k.startswith("scheme")})
    for layer in model.scheme.beta_proj:  # beta = 2 sigmoid(-inf) = 0: every H is I
        torch.nn.init.zeros_(layer.weight)
        torch.nn.init.constant_(layer.bias, -1e4)
    tokens = torch.randint(0, 11, (3, 13))
    assert torch.allclose(model(tokens), nope(tokens), atol=1e-5)


@pytest.mark.parametrize("position", ["path", "path-fox"])
def test_the_model_is_the_reference_softmax_and_packs_chunks_alike(position):
    torch.manual_seed(1)
    model = Transformer(cfg(position=position, n_layer=1), 11).eval()
    tokens = torch.randint(0, 11, (2, 9))
    scheme, attn = model.scheme, model.blocks[0].attn
    x = model.blocks[0].ln_1(model.embed(tokens, torch.arange(9)[None]))  # pre-norm: attention's input
    q, k, v = attn.c_attn(x).split(32, dim=2)
    q, k, v = (t.view(2, 9, 4, 8).transpose(1, 2) for t in (q, k, v))
    _, w = scheme.directions(x, 0)
    logits = reference_scores(q, k, w, scheme.betas(x, 0))
    if position == "path-fox":
        sums = scheme.log_forget(x, 0).cumsum(-1)
        logits = logits + (sums[..., :, None] - sums[..., None, :])
    want = torch.softmax(logits / math.sqrt(8), -1) @ v
    for chunk in (2, 64):
        scheme.chunk = chunk
        assert torch.allclose(scheme.attend(q, k, v, x, 0, NO_DROPOUT), want, atol=1e-5), chunk


@pytest.mark.parametrize("position", ["path", "path-fox"])
@pytest.mark.parametrize("conv", [0, 3])
def test_the_cache_decodes_what_the_full_forward_computes(position, conv):
    torch.manual_seed(2)
    model = Transformer(cfg(position=position, position_options={"conv": conv, "chunk": 4}), 11).eval()
    tokens = torch.randint(0, 11, (3, 10))
    full = model(tokens)
    cache = KVCache()
    ids = torch.arange(10)[None]
    parts = [model.head(model.run_blocks(model.embed(tokens[:, :4], ids[:, :4]), ids[:, :4], cache=cache))]
    for t in range(4, 10):  # a prompt of 4 at once, then one token at a time
        parts.append(model.head(model.run_blocks(model.embed(tokens[:, t:t + 1], ids[:, t:t + 1]), ids[:, t:t + 1],
                                                 cache=cache)))
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-4)
    prompt = tokens[:, :5]
    cached = greedy(model, prompt, ids[:, :5].expand(3, 5), 5)
    assert torch.equal(cached[0], greedy(model, prompt, ids[:, :5].expand(3, 5), 5, use_cache=False)[0])


def test_the_decay_of_path_fox_is_the_forget_gates_sum_inside_the_scale():
    torch.manual_seed(3)
    plain, fox = Transformer(cfg(n_layer=1), 11).eval(), Transformer(cfg(position="path-fox", n_layer=1), 11).eval()
    fox.load_state_dict(plain.state_dict(), strict=False)
    torch.nn.init.zeros_(fox.scheme.gates[0].weight)
    torch.nn.init.constant_(fox.scheme.gates[0].bias, 30.0)  # f = 1: no forgetting, PaTH exactly
    tokens = torch.randint(0, 11, (2, 7))
    assert torch.allclose(fox(tokens), plain(tokens), atol=1e-5)
    torch.nn.init.constant_(fox.scheme.gates[0].bias, -30.0)  # f ~ 0: each query sees itself alone
    with recording(fox) as rec:
        fox(tokens)
    att = torch.cat(rec.weights[0], dim=2)
    assert torch.allclose(att.diagonal(dim1=-2, dim2=-1), torch.ones(2, 4, 7), atol=1e-4)


def test_recording_returns_the_weights_and_the_same_output():
    torch.manual_seed(4)
    model = Transformer(cfg(position_options={"chunk": 3}), 11).eval()
    tokens = torch.randint(0, 11, (2, 8))
    with recording(model) as rec:
        recorded = model(tokens)
    assert torch.allclose(recorded, model(tokens))
    rows = rec.weights[0]
    assert [r.shape[2:] for r in rows] == [(3, 3), (3, 6), (2, 8)]
    for r in rows:
        assert torch.allclose(r.sum(-1), torch.ones(r.shape[:-1]), atol=1e-5)


def test_options_are_checked_and_a_tiny_model_trains():
    for bad in ({"conv": -1}, {"chunk": 0}, {"chunk": 2.5}, {"conv": True}):
        with pytest.raises(ValueError, match="path (conv|chunk) must be an integer"):
            build_scheme(cfg(position_options=bad))
    assert PaTH.cacheable() and PaTHFoX.cacheable() and not PaTH.bidirectional
    torch.manual_seed(5)
    trains_with_finite_gradients(Transformer(cfg(position="path-fox"), 11), torch.randint(0, 11, (4, 12)))


@pytest.mark.skipif(not torch.cuda.is_available() or fla_kernel() is None, reason="needs a GPU and fla")
def test_flas_kernel_equals_the_chunked_form():
    torch.manual_seed(6)
    model = Transformer(cfg(position="path-fox", d_model=256, n_head=4), 11).cuda().bfloat16().eval()
    tokens = torch.randint(0, 11, (2, 100), device="cuda")
    fast = model(tokens)
    with recording(model):  # recording takes the chunked form
        slow = model(tokens)
    assert torch.allclose(fast, slow, atol=2e-2, rtol=2e-2)


def fla_naive(q, k, v, w, beta, g, scale, chunk=4):
    """flash-linear-attention's reference (fla/ops/path_attn/naive.py, naive_path_attn), transcribed
    for (B, H, T, D) inputs: the chunk's T matrix by forward substitution, queries carried back one
    chunk at a time, the gate's cumulative sum added before the scale. Returns (B, H, T, D)."""
    T = q.shape[2]
    g_sum = g.cumsum(-1)
    pad = (-T) % chunk
    q, k, w = (F.pad(t, (0, 0, 0, pad)) for t in (q, k, w))
    beta = F.pad(beta, (0, pad))
    n = q.shape[2]
    w_beta = w * beta[..., None]
    split = lambda t: t.view(*t.shape[:2], n // chunk, chunk, t.shape[-1])  # noqa: E731
    q, k, w, w_beta = map(split, (q, k, w, w_beta))
    upper = torch.ones(chunk, chunk, dtype=torch.bool).triu()
    t_mat = -(w_beta @ w.transpose(-1, -2)).masked_fill(upper, 0)
    for i in range(1, chunk):
        t_mat[..., i, :i] = t_mat[..., i, :i].clone() + (t_mat[..., i, :, None].clone() * t_mat[..., :, :i].clone()).sum(-2)
    t_mat = t_mat + torch.eye(chunk)
    twbk = t_mat @ (w_beta @ k.transpose(-1, -2)).masked_fill(upper, 0)
    qw = (q @ w.transpose(-1, -2)).tril()
    twb = t_mat @ w_beta
    a_local = (q @ k.transpose(-1, -2)).tril() - qw @ twbk
    q = q - qw @ twb
    k = k - twbk.transpose(-1, -2) @ w
    h_mat = w.transpose(-1, -2) @ twb
    a = torch.zeros(*q.shape[:2], n, n)
    q, k = (t.reshape(*t.shape[:2], n, t.shape[-1]) for t in (q, k))
    for i in range(0, n, chunk):
        q_i = q[:, :, i:i + chunk].clone()
        for j in range(i - chunk, -chunk, -chunk):
            a[:, :, i:i + chunk, j:j + chunk] = q_i @ k[:, :, j:j + chunk].transpose(-1, -2)
            q_i = q_i - q_i @ h_mat[:, :, j // chunk]
    for i in range(n // chunk):
        a[:, :, i * chunk:(i + 1) * chunk, i * chunk:(i + 1) * chunk] = a_local[:, :, i]
    a = a.masked_fill(~torch.ones(n, n, dtype=torch.bool).tril(), float("-inf"))[:, :, :T, :T]
    a = a + g_sum[..., None] - g_sum[..., None, :]
    return (a * scale).softmax(-1) @ v


def test_it_is_flas_reference_on_the_same_inputs():
    torch.manual_seed(7)
    model = Transformer(cfg(position="path-fox", n_layer=1, position_options={"chunk": 3}), 11).eval()
    tokens = torch.randint(0, 11, (2, 10))
    x = model.blocks[0].ln_1(model.embed(tokens, torch.arange(10)[None]))
    q, k, v = (t.view(2, 10, 4, 8).transpose(1, 2) for t in model.blocks[0].attn.c_attn(x).split(32, dim=2))
    scheme = model.scheme
    _, w = scheme.directions(x, 0)
    want = fla_naive(q, k, v, w, scheme.betas(x, 0), scheme.log_forget(x, 0), 8 ** -0.5, chunk=4)
    assert torch.allclose(scheme.attend(q, k, v, x, 0, NO_DROPOUT), want, atol=1e-5)
