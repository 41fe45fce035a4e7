"""Attention paths and the Transformer: equivalences, invariances, causality, training.

The two test doubles for hook 4 (`content_logits`) are the evidence that
content-dependent schemes (CoPE, TRA) slot in without touching the model.
"""
import math

import pytest
import torch
import torch.nn.functional as F

from lengthgen.config.schema import ModelConfig
from lengthgen.methods.looped.block import LoopedTransformer
from lengthgen.model.attention import CausalSelfAttention
from lengthgen.model.positions import SCHEMES, ALiBi, PositionalScheme, build_scheme
from lengthgen.model.transformer import Transformer

V = 11
# The tensors here are tiny: thread start-up costs more than it saves,
# and on a busy machine many threads make these tests 10x slower.
pytestmark = pytest.mark.usefixtures("one_thread")


def cfg(position="nope", **kw) -> ModelConfig:
    base = dict(d_model=32, n_layer=2, n_head=4, max_positions=64, position=position)
    base.update(kw)
    return ModelConfig(**base)


def model(position="nope", seed=0, **kw) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg(position, **kw), V).eval()


def tokens(B=3, T=10, seed=0):
    return torch.randint(0, V, (B, T), generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- test doubles for hook 4

class ScaledDotContent(PositionalScheme):
    """Hook 4 doing what plain attention does: q.k / sqrt(Dh), future keys -inf.
    Also records what it was called with, to show `x` and `layer` arrive."""

    has_content = True

    def __init__(self, cfg):
        super().__init__(cfg)
        self.calls = []

    def content_logits(self, q, k, x, layer):
        self.calls.append((layer, tuple(x.shape)))
        T = q.shape[-2]
        logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, T, T)
        future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        return logits.masked_fill(future, float("-inf"))


class DropEveryKey(PositionalScheme):
    """Hook 4 that keeps no key at all (as TRA does when every score is <= 0)."""

    has_content = True

    def content_logits(self, q, k, x, layer):
        T = q.shape[-2]
        # An additive mask, as CoPE's code writes it: unlike masked_fill it lets
        # a NaN from the softmax flow back into q and k, so the test can catch one.
        return q @ k.transpose(-2, -1) + torch.full((T, T), float("-inf"))


def test_content_double_equals_nope_model():
    ref = model("nope")
    double = ScaledDotContent(cfg("nope"))
    twin = Transformer(cfg("nope"), V, scheme=double).eval()
    twin.load_state_dict(ref.state_dict())
    x = tokens()
    assert torch.allclose(twin(x), ref(x), atol=1e-5)
    assert [c[0] for c in double.calls] == [0, 1]  # each block passes its own layer index
    assert all(shape == (3, 10, 32) for _, shape in double.calls)  # and the block input x (B, T, D)


def test_content_hook_composes_with_a_bias_hook():
    """Hooks 3 and 4 together: the content double plus ALiBi's bias equals ALiBi."""

    class ContentPlusALiBi(ScaledDotContent, ALiBi):  # has_content from one, has_bias from the other
        pass

    ref = model("alibi")
    twin = Transformer(cfg("alibi"), V, scheme=ContentPlusALiBi(cfg("alibi"))).eval()
    twin.load_state_dict(ref.state_dict())
    x = tokens()
    assert torch.allclose(twin(x), ref(x), atol=1e-5)


def test_content_double_that_drops_every_key_gives_zero_output_without_nan():
    torch.manual_seed(0)
    c = cfg("nope")
    attn = CausalSelfAttention(c, layer=0)
    torch.nn.init.normal_(attn.c_proj.bias)  # so "zero heads" is distinguishable from a zero output
    x = torch.randn(2, 6, 32, requires_grad=True)
    y = attn(x, DropEveryKey(c), torch.arange(6)[None])
    # every head outputs 0, so the block output is the projection of 0: its bias
    assert torch.allclose(y, attn.c_proj.bias.expand_as(y))
    y.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters() if p.grad is not None)
    assert torch.isfinite(x.grad).all()
    # whole model: finite logits and gradients too
    m = Transformer(c, V, scheme=DropEveryKey(c))
    out = m(tokens())
    out.sum().backward()
    assert torch.isfinite(out).all() and all(torch.isfinite(p.grad).all() for p in m.parameters())


# ---------------------------------------------------------------- fast / bias path == manual softmax

def manual_attention(attn, x, slopes=None):
    """softmax(q k^T / sqrt(Dh) - slope (i - j), causal) v, written out by hand."""
    B, T, C = x.shape
    H = attn.n_head
    q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in attn.c_attn(x).split(C, dim=2))
    logits = q @ k.transpose(-2, -1) / math.sqrt(C // H)
    if slopes is not None:
        i = torch.arange(T)
        logits = logits - torch.tensor(slopes)[:, None, None] * (i[:, None] - i[None, :]).float()
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    att = torch.softmax(logits.masked_fill(~mask, float("-inf")), dim=-1)
    return attn.c_proj((att @ v).transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("position", ["nope", "alibi"])
def test_sdpa_paths_equal_manual_softmax(position):
    torch.manual_seed(0)
    c = cfg(position, n_head=8)
    attn = CausalSelfAttention(c, layer=0).eval()
    scheme = build_scheme(c)
    x = torch.randn(2, 9, 32)
    slopes = [2.0 ** -(h + 1) for h in range(8)] if position == "alibi" else None
    got = attn(x, scheme, torch.arange(9)[None])
    assert torch.allclose(got, manual_attention(attn, x, slopes), atol=1e-5)
    if position == "alibi":  # and the bias matters: without it the output differs
        assert not torch.allclose(got, manual_attention(attn, x, None), atol=1e-3)


# ---------------------------------------------------------------- invariances

def test_nope_is_permutation_invariant_over_the_prefix_and_learned_is_not():
    x = tokens(B=2, T=8)
    perm = torch.cat([torch.randperm(7, generator=torch.Generator().manual_seed(1)), torch.tensor([7])])
    assert not torch.equal(x[:, perm], x)
    for position, invariant in (("nope", True), ("learned", False), ("sinusoidal", False),
                                ("rope", False), ("alibi", False)):
        m = model(position, n_layer=1)
        with torch.no_grad():  # tokens as large as the sinusoidal table (|PE| ~ 1), as after training
            m.wte.weight.mul_(30)
        same = torch.allclose(m(x)[:, -1], m(x[:, perm])[:, -1], rtol=0, atol=1e-5)
        assert same == invariant, position


@pytest.mark.parametrize("position,invariant", [("rope", True), ("alibi", True), ("nope", True),
                                                ("learned", False), ("sinusoidal", False)])
def test_shifting_position_ids(position, invariant):
    m = model(position)
    x = tokens()
    base = m(x)
    shifted = m(x, torch.arange(10)[None] + 23)
    assert torch.allclose(base, shifted, atol=1e-4) == invariant


def test_explicit_position_ids_per_sample():
    m = model("learned")
    x = tokens(B=2)
    ids = torch.stack([torch.arange(10), torch.arange(10) * 2])  # (B, T), rows differ
    out = m(x, ids)
    assert torch.allclose(out[0], m(x)[0], atol=1e-6)  # row 0 is the default 0..T-1
    assert not torch.allclose(out[1], m(x)[1], atol=1e-4)
    assert torch.allclose(m(x, torch.arange(10).expand(2, 10)), m(x), atol=1e-6)


@pytest.mark.parametrize("position", ["learned", "sinusoidal"])
def test_model_rejects_positions_past_the_table(position):
    m = model(position, max_positions=12)
    m(tokens(T=12))
    with pytest.raises(ValueError, match="model.max_positions"):
        m(tokens(T=13))
    with pytest.raises(ValueError, match="model.max_positions"):
        m(tokens(T=4), torch.arange(4)[None] + 9)


def test_bad_position_id_shape_is_rejected():
    with pytest.raises(ValueError, match="position_ids"):
        model()(tokens(T=5), torch.arange(6)[None])


# ---------------------------------------------------------------- causality

@pytest.mark.parametrize("position", sorted(SCHEMES) + ["content-double"])
def test_changing_a_later_token_never_changes_earlier_logits(position):
    if position == "content-double":
        torch.manual_seed(0)
        m = Transformer(cfg(), V, scheme=ScaledDotContent(cfg())).eval()
    else:
        m = model(position)
    x = tokens(B=2, T=12)
    base = m(x)
    for t in (0, 5, 11):
        y = x.clone()
        y[:, t] = (y[:, t] + 1) % V
        out = m(y)
        assert torch.allclose(out[:, :t], base[:, :t], atol=1e-6), t
        assert not torch.allclose(out[:, t:], base[:, t:], atol=1e-4), t  # the change is seen


# ---------------------------------------------------------------- structure

def test_param_count_init_and_tying():
    c = cfg("learned", d_model=64, n_layer=3, n_head=4, max_positions=50)
    m = Transformer(c, V)
    D, L = 64, 3
    per_block = 2 * D + (3 * D * D + 3 * D) + (D * D + D) + 2 * D + (D * 4 * D + 4 * D) + (4 * D * D + D)
    expected = V * D + 50 * D + L * per_block + 2 * D  # tied lm_head counted once
    assert m.num_params() == expected
    assert m.num_params(non_embedding=True) == expected - 50 * D
    assert m.lm_head.weight is m.wte.weight
    assert m.flops_per_token(32) == 6 * (expected - 50 * D) + 12 * L * D * 32
    proj = torch.cat([b.attn.c_proj.weight.flatten() for b in m.blocks] + [b.mlp.c_proj.weight.flatten() for b in m.blocks])
    assert abs(proj.std().item() - 0.02 / math.sqrt(2 * L)) < 0.1 * 0.02 / math.sqrt(2 * L)
    assert abs(m.blocks[0].mlp.c_fc.weight.std().item() - 0.02) < 0.002
    assert all((b.attn.c_attn.bias == 0).all() for b in m.blocks)


def test_flops_count_an_untied_token_table_as_a_lookup():
    """Untying adds a (V, D) table that is only looked up: the matmul FLOPs stay those of the tied model."""
    tied, untied = (cfg("nope", d_model=64, n_layer=2, n_head=4, tie_embeddings=t) for t in (True, False))
    assert Transformer(untied, V).flops_per_token(32) == Transformer(tied, V).flops_per_token(32)
    assert LoopedTransformer(untied, V).flops_per_token(32, n_steps=10) == \
        LoopedTransformer(tied, V).flops_per_token(32, n_steps=10)


def test_torch_init_and_untied_head():
    m = Transformer(cfg("nope", d_model=64, n_layer=2, n_head=4, init="torch", tie_embeddings=False), V)
    assert m.lm_head.weight is not m.wte.weight
    assert m.num_params() == Transformer(cfg("nope", d_model=64, n_layer=2, n_head=4), V).num_params() + V * 64
    assert abs(m.wte.weight.std().item() - 1.0) < 0.1  # N(0, 1), not GPT-2's 0.02
    bound = 1 / math.sqrt(64)  # kaiming-uniform with a = sqrt(5): U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    w = m.blocks[0].mlp.c_fc.weight
    assert w.abs().max().item() <= bound and w.std().item() > 0.8 * bound / math.sqrt(3)


def test_looped_tf_init_the_released_mix():
    """GPT-2's init inside the blocks; the read-in an nn.Linear(V, D) of one-hot tokens (weight and
    bias uniform in +-1/sqrt(V)); the read-out nn.Linear(D, V) with its bias (+-1/sqrt(D))."""
    D, L, vocab = 256, 3, 7
    torch.manual_seed(0)
    m = Transformer(cfg("nope", d_model=D, n_layer=L, n_head=8, init="looped-tf", tie_embeddings=False,
                        embed_bias=True, head_bias=True), vocab)
    proj = torch.cat([b.attn.c_proj.weight.flatten() for b in m.blocks] + [b.mlp.c_proj.weight.flatten() for b in m.blocks])
    assert abs(proj.std().item() - 0.02 / math.sqrt(2 * L)) < 0.1 * 0.02 / math.sqrt(2 * L)
    assert abs(m.blocks[0].attn.c_attn.weight.std().item() - 0.02) < 0.002
    assert all((b.attn.c_attn.bias == 0).all() and (b.mlp.c_fc.bias == 0).all() for b in m.blocks)
    read_in, read_out = 1 / math.sqrt(vocab), 1 / math.sqrt(D)
    for w, bound in ((m.wte.weight, read_in), (m.wte_bias, read_in), (m.lm_head.weight, read_out)):
        assert w.abs().max().item() <= bound and w.std().item() > 0.8 * bound / math.sqrt(3)  # U(-b, b): std b/sqrt 3
    assert m.lm_head.bias.abs().max().item() <= read_out and m.lm_head.bias.abs().min().item() > 0
    table = Transformer(cfg("nope", d_model=D, n_layer=1, n_head=8, init="looped-tf", tie_embeddings=False), 60)
    assert abs(table.wte.weight.std().item() - 1.0) < 0.05 and table.wte_bias is None  # nn.Embedding: N(0, 1)
    assert table.lm_head.bias is None


def test_embed_bias_is_a_linear_read_in_of_one_hot_tokens():
    m = Transformer(cfg("nope", d_model=32, n_layer=1, n_head=2, embed_bias=True, head_bias=True), V)
    x = tokens()
    ids = torch.arange(x.shape[1])[None]
    one_hot = F.one_hot(x, V).float()
    assert torch.allclose(m.embed(x, ids), F.linear(one_hot, m.wte.weight.T, m.wte_bias), atol=1e-6)
    h = torch.randn(2, 3, 32)
    assert torch.allclose(m.lm_head(h), h @ m.wte.weight.T + m.lm_head.bias, atol=1e-5)  # tied weight, own bias


def test_gelu_tanh_is_gpt2s_gelu_new():
    m = Transformer(cfg("nope", d_model=32, n_layer=1, n_head=2, mlp="gelu-tanh"), V)
    x = torch.randn(4, 32)
    mlp = m.blocks[0].mlp
    u = mlp.c_fc(x)
    gelu_new = 0.5 * u * (1 + torch.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))  # GPT-2's formula
    assert torch.allclose(mlp(x), mlp.c_proj(gelu_new), atol=1e-6)
    assert not torch.allclose(mlp(x), mlp.c_proj(F.gelu(u)), atol=1e-7)


def test_pieces_compose_to_forward():
    m = model("rope")
    x = tokens()
    ids = torch.arange(10)[None]
    assert torch.allclose(m.head(m.run_blocks(m.embed(x, ids), ids)), m(x))


def test_dropout_is_active_in_training_only():
    m = model("alibi", dropout=0.3)
    x = tokens()
    assert torch.equal(m(x), m(x))  # eval: deterministic
    m.train()
    assert not torch.equal(m(x), m(x))


# ---------------------------------------------------------------- training

@pytest.mark.parametrize("position", sorted(SCHEMES))
def test_tiny_model_overfits_a_fixed_batch(position):
    torch.manual_seed(0)
    m = Transformer(cfg(position, n_layer=1), V).train()
    x = tokens(B=4, T=9, seed=3)
    inputs, targets = x[:, :-1], x[:, 1:]
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.0)
    losses = []
    for _ in range(60):
        loss = F.cross_entropy(m(inputs).flatten(0, 1), targets.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 2.0 and losses[-1] < 0.3 * losses[0], (losses[0], losses[-1])
