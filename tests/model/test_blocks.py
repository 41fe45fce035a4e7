"""Block variants as config, each against a reference written by hand from its formula."""
import math

import pytest
import torch
import torch.nn.functional as F

from lengthgen.config.schema import ModelConfig
from lengthgen.accel import narrow_attention
from lengthgen.model.attention import AttentionDropout, CausalSelfAttention
from lengthgen.model.content_attention import tra_attention
from lengthgen.model.positions import PositionalScheme, default_position_ids
from lengthgen.model.transformer import Block, Transformer

D, H = 16, 2


pytestmark = pytest.mark.usefixtures("one_thread")


def cfg(**kw) -> ModelConfig:
    return ModelConfig(**{"d_model": D, "n_layer": 2, "n_head": H, "mlp_ratio": 2, **kw})


def x(B=2, T=5, seed=0):
    return torch.randn(B, T, D, generator=torch.Generator().manual_seed(seed))


def randomise(module, seed=1):
    """Non-trivial weights everywhere (norm gains and biases included), so no term hides."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if p.dim() == 1 else 0.0))
    return module.eval()


def attention_by_hand(attn, h):
    """Causal multi-head attention from its weights: softmax(q k^T / sqrt(Dh)) v, then c_proj."""
    B, T, _ = h.shape
    W, b = attn.c_attn.weight, attn.c_attn.bias
    qkv = h @ W.T + (b if b is not None else 0)
    q, k, v = (t.view(B, T, H, D // H).transpose(1, 2) for t in qkv.split(D, -1))
    scores = q @ k.transpose(-2, -1) / math.sqrt(D // H)
    scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)
    return y @ attn.c_proj.weight.T + (attn.c_proj.bias if attn.c_proj.bias is not None else 0)


def rms_by_hand(norm, h):
    return h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + torch.finfo(h.dtype).eps) * norm.weight


def layer_by_hand(norm, h):
    mean, var = h.mean(-1, keepdim=True), h.var(-1, unbiased=False, keepdim=True)
    return (h - mean) / torch.sqrt(var + 1e-5) * norm.weight + norm.bias


def mlp_by_hand(mlp, h, kind):
    lin = lambda layer, t: t @ layer.weight.T + (layer.bias if layer.bias is not None else 0)  # noqa: E731
    if kind == "swiglu":  # Shazeer 2020: (silu(x W_gate) * (x W_fc)) W_proj
        hidden = lin(mlp.c_gate, h) * torch.sigmoid(lin(mlp.c_gate, h)) * lin(mlp.c_fc, h)
    else:  # GPT-2's tanh-free GELU: x * Phi(x)
        pre = lin(mlp.c_fc, h)
        hidden = pre * 0.5 * (1 + torch.erf(pre / math.sqrt(2)))
    return lin(mlp.c_proj, hidden)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
@pytest.mark.parametrize("residual", ["pre-norm", "norm-before-add"])
@pytest.mark.parametrize("bias", [True, False])
@torch.no_grad()
def test_block_equals_its_formula(norm, mlp, residual, bias):
    c = cfg(norm=norm, mlp=mlp, residual=residual, bias=bias)
    block = randomise(Block(c, 0))
    h = x()
    by_norm = rms_by_hand if norm == "rmsnorm" else layer_by_hand
    ln1 = lambda t: by_norm(block.ln_1, t)  # noqa: E731
    ln2 = lambda t: by_norm(block.ln_2, t)  # noqa: E731
    attn = lambda t: attention_by_hand(block.attn, t)  # noqa: E731
    ff = lambda t: mlp_by_hand(block.mlp, t, mlp)  # noqa: E731
    if residual == "pre-norm":  # x = x + attn(ln1(x)); x = x + mlp(ln2(x))
        h1 = h + attn(ln1(h))
        want = h1 + ff(ln2(h1))
    else:  # the TRA notebook: x = ln1(x); x = x + attn(x); x = ln2(x); x = x + mlp(x)
        h1 = ln1(h)
        h2 = ln2(h1 + attn(h1))
        want = h2 + ff(h2)
    got = block(h, PositionalScheme(c), default_position_ids(h.shape[1]))
    error, scale = float((got - want).abs().max()), float(want.abs().max())
    assert error <= 1e-6 * scale + 1e-6, (error, scale)  # float32 rounding of values up to ~100


def test_bias_false_removes_every_bias_of_the_blocks_linear_layers():
    for mlp in ("gelu", "swiglu"):
        model = Transformer(cfg(bias=False, mlp=mlp), 11)
        linears = [m for name, m in model.blocks.named_modules() if isinstance(m, torch.nn.Linear)]
        assert len(linears) == 2 * (2 + (3 if mlp == "swiglu" else 2)) and all(m.bias is None for m in linears)
        # the per-layer parameter count: q/k/v + out, and 2 or 3 MLP matrices, plus two norms
        hidden, matrices = 2 * D, (3 if mlp == "swiglu" else 2)
        norms = sum(p.numel() for name, p in model.blocks[0].named_parameters() if name.startswith("ln_"))
        assert sum(p.numel() for p in model.blocks[0].parameters()) == 4 * D * D + matrices * D * hidden + norms


@torch.no_grad()
def test_rmsnorm_reaches_the_final_norm_and_the_read_out():
    model = randomise(Transformer(cfg(norm="rmsnorm"), 11))
    assert isinstance(model.ln_f, torch.nn.RMSNorm) and all(isinstance(b.ln_1, torch.nn.RMSNorm) for b in model.blocks)
    h = x()
    assert torch.allclose(model.head(h), rms_by_hand(model.ln_f, h) @ model.lm_head.weight.T, atol=1e-5)


def test_attention_mlp_and_residual_dropout_are_separate(monkeypatch):
    """SDPA gets model.attn_dropout as dropout_p; the MLP hidden units model.mlp_dropout; the
    residual dropouts model.dropout."""
    seen = []
    sdpa = F.scaled_dot_product_attention

    def record(*args, dropout_p=0.0, **kw):
        seen.append(dropout_p)
        return sdpa(*args, dropout_p=dropout_p, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", record)
    monkeypatch.setattr(narrow_attention, "enabled", False)  # its narrow heads would take the eval pass
    model = Transformer(cfg(dropout=0.1, attn_dropout=0.3, mlp_dropout=0.2), 11).train()
    drops = {name: m.p for name, m in model.named_modules() if isinstance(m, torch.nn.Dropout)}
    assert {m.dropout for m in model.modules() if isinstance(m, CausalSelfAttention)} == {AttentionDropout(0.3)}
    assert {p for name, p in drops.items() if name.endswith("hidden_drop")} == {0.2}
    assert {p for name, p in drops.items() if not name.endswith("hidden_drop")} == {0.1}
    model(torch.randint(0, 11, (2, 5)))
    assert seen == [0.3, 0.3]
    model.eval()(torch.randint(0, 11, (2, 5)))
    assert seen[2:] == [0.0, 0.0]


def test_the_tra_block_learns_a_fixed_batch():
    """RMSNorm, SwiGLU 2x, no biases, norm-before-add, attention dropout: a tiny model still fits."""
    torch.manual_seed(0)
    model = Transformer(cfg(norm="rmsnorm", mlp="swiglu", bias=False, residual="norm-before-add",
                            attn_dropout=0.01, position="rope"), 11)
    tokens = torch.randint(0, 11, (8, 12), generator=torch.Generator().manual_seed(1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(150):
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.3 * losses[0], losses[::30]


class FixedLogitMask(AttentionDropout):
    """Dropout on the logits with a mask chosen by the test: the kept logits scaled by 1 / (1 - p)."""

    def __init__(self, mask: torch.Tensor, p: float):
        super().__init__(p, "logits")
        object.__setattr__(self, "mask", mask)

    def logits(self, x):
        return x * self.mask[..., : x.shape[-1]] / (1 - self.p)


def test_tra_logit_dropout_keeps_the_support_and_matches_the_notebooks_formula():
    """A = dropout(S + D), then the mask (dropped keys and the future stay out), then the softmax:
    a dropped kept key's logit is 0 and it stays in the softmax."""
    g = torch.Generator().manual_seed(3)
    B, Hh, T, Dh = 2, 2, 7, 4
    q, k, v = (torch.randn(B, Hh, T, Dh, generator=g) for _ in range(3))
    gate = torch.randn(B, Hh, T, generator=g)
    mask = (torch.rand(B, Hh, T, T, generator=g) > 0.3).float()
    p = 0.3
    kept_weights = []
    got = tra_attention(q, k, v, gate, dropout=FixedLogitMask(mask, p), keep=kept_weights)
    qn, kn = F.rms_norm(q, (Dh,)), F.rms_norm(k, (Dh,))
    raw = qn @ kn.transpose(-2, -1) / math.sqrt(Dh)
    causal = torch.ones(T, T).tril().bool()
    kept = (raw > 0) & causal
    n = torch.flip(torch.cumsum(torch.flip(kept.float(), [-1]), -1), [-1])  # kept keys in [j, i] (per row, j <= i)
    logits = (raw + n * F.logsigmoid(gate)[..., None]) * mask / (1 - p)
    weights = torch.softmax(logits.masked_fill(~kept, float("-inf")), -1)
    dead = ~kept.any(-1, keepdim=True)
    weights = weights.nan_to_num(0.0).masked_fill(dead, 0.0)
    assert torch.allclose(got, weights @ v, atol=1e-5)
    support = kept_weights[0] > 0
    assert torch.equal(support, kept & ~dead)  # the dropped kept keys are still attended: only the mask removes keys
    assert ((mask == 0) & kept).any()  # the case that tells the two apart is in the test


def test_logit_dropout_in_the_plain_path_drops_before_the_causal_mask():
    torch.manual_seed(0)
    attn = CausalSelfAttention(cfg(attn_dropout=0.5, attn_dropout_on="logits"), 0).train()
    scheme = PositionalScheme(cfg())
    h = x(T=6)
    torch.manual_seed(1)
    got = attn(h, scheme, default_position_ids(6, h.device))
    torch.manual_seed(1)
    qkv = attn.c_attn(h)
    q, k, v = (t.view(2, 6, H, D // H).transpose(1, 2) for t in qkv.split(D, -1))
    logits = F.dropout(q @ k.transpose(-2, -1) / math.sqrt(D // H), 0.5)  # the same draws, in the same order
    att = torch.softmax(logits.masked_fill(~torch.ones(6, 6).tril().bool(), float("-inf")), -1)
    want = attn.c_proj((att @ v).transpose(1, 2).reshape(2, 6, D))
    assert torch.allclose(got, want, atol=1e-5)
    attn.eval()
    assert torch.allclose(attn(h, scheme, default_position_ids(6, h.device)), attention_by_hand(attn, h), atol=1e-5)


def test_logit_dropout_drops_about_p_of_the_logits():
    x_ = torch.ones(200_000)
    dropped = (AttentionDropout(0.1, "logits").logits(x_) == 0).float().mean()
    assert abs(float(dropped) - 0.1) < 0.005
    assert torch.equal(AttentionDropout(0.1, "weights").logits(x_), x_)  # the other placement leaves logits alone


def test_embedding_dropout_and_bias_free_qkv():
    model = Transformer(cfg(embed_dropout=0.5, bias=True, qkv_bias=False), 11).train()
    assert model.blocks[0].attn.c_attn.bias is None and model.blocks[0].attn.c_proj.bias is not None
    assert model.blocks[0].mlp.c_fc.bias is not None
    torch.manual_seed(0)
    e = model.embed(torch.randint(0, 11, (4, 50)), default_position_ids(50, None))
    assert 0.4 < float((e == 0).float().mean()) < 0.6  # half the embedding entries dropped
    assert not any(m.p for name, m in model.blocks.named_modules() if isinstance(m, torch.nn.Dropout))
