"""Positional schemes, hook by hook, checked against independent formulas."""
import math

import pytest
import torch

from lengthgen.config.schema import ModelConfig
from lengthgen.model.positions import (ALiBi, LearnedPositions, PositionalScheme, RoPE, SCHEMES, SinusoidalPositions,
                                       build_scheme)


def cfg(**kw) -> ModelConfig:
    base = dict(d_model=32, n_layer=2, n_head=2, max_positions=64)
    base.update(kw)
    return ModelConfig(**base)


def arange_ids(T, offset=0):
    return (torch.arange(T) + offset)[None]  # (1, T)


# ---------------------------------------------------------------- registry

def test_registry_is_exactly_the_seventeen_schemes():
    assert set(SCHEMES) == {"nope", "learned", "sinusoidal", "rope", "alibi", "fire", "t5", "cope", "fox", "tra", "relative",
                            "xpos", "stickbreaking", "selective", "fope", "path", "path-fox"}
    for name, cls in SCHEMES.items():
        scheme = build_scheme(cfg(position=name))
        assert type(scheme) is cls and isinstance(scheme, PositionalScheme)
    with pytest.raises(ValueError, match="model.position"):
        build_scheme(cfg(position="nosuch"))


def test_nope_hooks_do_nothing():
    s = build_scheme(cfg(position="nope"))
    x, q, k = torch.randn(2, 5, 32), torch.randn(2, 2, 5, 16), torch.randn(2, 2, 5, 16)
    ids = arange_ids(5)
    assert torch.equal(s.embed(x, ids), x)
    q2, k2 = s.rotate(q, k, ids)
    assert torch.equal(q2, q) and torch.equal(k2, k)
    assert s.bias(ids) is None and s.content_logits(q, k, x, 0) is None
    assert not s.has_bias and not s.has_content


# ---------------------------------------------------------------- RoPE

def rope_scores(scheme, qv, kv, ids):
    """Scores S[i, j] = rot(q)_i . rot(k)_j with the same q, k vector at every position."""
    T = ids.shape[1]
    q = qv.expand(1, 1, T, -1).clone()  # (1, 1, T, Dh)
    k = kv.expand(1, 1, T, -1).clone()
    rq, rk = scheme.rotate(q, k, ids)
    return (rq @ rk.transpose(-2, -1))[0, 0]  # (T, T)


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_rope_scores_depend_only_on_offset(style):
    torch.manual_seed(0)
    s = RoPE(cfg(), theta=100.0, style=style)
    qv, kv = torch.randn(16), torch.randn(16)
    S = rope_scores(s, qv, kv, arange_ids(12))
    for off in range(-11, 12):  # every diagonal is constant
        d = torch.diagonal(S, offset=-off)
        assert torch.allclose(d, d[0].expand_as(d), atol=1e-5), off
    # ... and different offsets give different scores (it is not the identity)
    diag_values = torch.stack([torch.diagonal(S, offset=-off)[0] for off in range(6)])
    assert (diag_values[:, None] - diag_values[None]).abs().add(torch.eye(6)).min() > 1e-3
    # explicit, shifted and gapped IDs: the score is still a function of pos_i - pos_j
    ids = torch.tensor([[3, 10, 11, 40, 47]])
    S2 = rope_scores(s, qv, kv, ids)
    for i in range(5):
        for j in range(5):
            off = int(ids[0, i] - ids[0, j])
            ref = rope_scores(s, qv, kv, torch.tensor([[0, abs(off)]]))
            assert torch.allclose(S2[i, j], ref[1, 0] if off >= 0 else ref[0, 1], atol=1e-4)


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_rope_matches_complex_rotation_and_preserves_norm(style):
    """Independent formula: pair (a, b) -> (a + ib) * exp(i * pos * theta^(-2m/Dh))."""
    torch.manual_seed(1)
    theta, Dh = 500.0, 16
    s = RoPE(cfg(), theta=theta, style=style)
    q, k = torch.randn(2, 2, 7, Dh), torch.randn(2, 2, 7, Dh)
    ids = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [5, 9, 9, 20, 21, 22, 100]])  # (B, T), rows differ
    rq, rk = s.rotate(q, k, ids)
    freqs = theta ** (-torch.arange(0, Dh, 2, dtype=torch.float64) / Dh)  # (Dh/2,)
    phase = torch.polar(torch.ones(2, 1, 7, Dh // 2, dtype=torch.float64),
                        ids[:, None, :, None].double() * freqs)
    for x, rx in ((q, rq), (k, rk)):
        x = x.double()
        if style == "half":
            z = torch.complex(x[..., : Dh // 2], x[..., Dh // 2:]) * phase
            expected = torch.cat((z.real, z.imag), dim=-1)
        else:
            z = torch.complex(x[..., 0::2], x[..., 1::2]) * phase
            expected = torch.stack((z.real, z.imag), dim=-1).flatten(-2)
        assert torch.allclose(rx.double(), expected, atol=1e-4)
        assert torch.allclose(rx.norm(dim=-1), x.float().norm(dim=-1), atol=1e-5)


def test_rope_rejects_odd_head_width():
    with pytest.raises(ValueError):
        RoPE(cfg(d_model=30, n_head=2))


# ---------------------------------------------------------------- ALiBi

def paper_slopes(n):
    """The ALiBi rule, written from the paper: for n a power of two the slopes
    are 2^(-8/n), 2^(-16/n), ..., 2^(-8); otherwise take the slopes of the
    closest power of two below n, then every other slope of 2x that many heads."""
    if n & (n - 1) == 0:
        return [2.0 ** (-8.0 * (i + 1) / n) for i in range(n)]
    p = 1 << (n.bit_length() - 1)
    return paper_slopes(p) + paper_slopes(2 * p)[0::2][: n - p]


def test_alibi_slopes_8_heads():
    s = ALiBi(cfg(d_model=32, n_head=8))
    assert torch.allclose(s.slopes.double(), torch.tensor([1 / 2 ** i for i in range(1, 9)], dtype=torch.float64))


@pytest.mark.parametrize("n_head", [12, 6, 5, 16])
def test_alibi_slopes_match_paper_rule(n_head):
    s = ALiBi(cfg(d_model=n_head * 4, n_head=n_head))
    assert torch.allclose(s.slopes.double(), torch.tensor(paper_slopes(n_head), dtype=torch.float64))
    if n_head == 12:  # spelled out: 2^-1..2^-8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5
        expected = [2.0 ** -(i + 1) for i in range(8)] + [2.0 ** -(i + 0.5) for i in range(4)]
        assert torch.allclose(s.slopes.double(), torch.tensor(expected, dtype=torch.float64))


def test_alibi_bias_is_minus_slope_times_position_distance():
    s = ALiBi(cfg(d_model=32, n_head=4))
    slopes = paper_slopes(4)
    ids = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 12, 13, 30]])  # (B, T), second row shifted with gaps
    b = s.bias(ids)
    assert b.shape == (2, 4, 5, 5)
    for bi in range(2):
        for h in range(4):
            for i in range(5):
                for j in range(5):
                    want = -slopes[h] * float(ids[bi, i] - ids[bi, j])
                    assert math.isclose(float(b[bi, h, i, j]), want, rel_tol=1e-5, abs_tol=1e-6)
    assert s.bias(arange_ids(5)).shape == (1, 4, 5, 5)  # one row broadcasts over the batch


# ---------------------------------------------------------------- learned / sinusoidal

def test_sinusoidal_table_is_vaswani():
    s = SinusoidalPositions(cfg(d_model=10))
    for pos in (0, 1, 7, 63):
        for i in range(5):
            angle = pos / 10000 ** (2 * i / 10)
            assert math.isclose(float(s.table[pos, 2 * i]), math.sin(angle), abs_tol=1e-5)
            assert math.isclose(float(s.table[pos, 2 * i + 1]), math.cos(angle), abs_tol=1e-5)
    assert not list(s.parameters())  # fixed, nothing to learn


@pytest.mark.parametrize("cls", [LearnedPositions, SinusoidalPositions])
def test_table_schemes_use_the_given_ids(cls):
    torch.manual_seed(0)
    s = cls(cfg())
    x = torch.randn(2, 6, 32)
    a = s.embed(x, arange_ids(6))
    b = s.embed(x, arange_ids(6, offset=5))
    assert not torch.allclose(a, b)
    # (B, T) IDs: each row uses its own IDs
    both = s.embed(x, torch.cat([arange_ids(6), arange_ids(6, offset=5)]))
    assert torch.allclose(both[0], a[0]) and torch.allclose(both[1], b[1])


@pytest.mark.parametrize("cls", [LearnedPositions, SinusoidalPositions])
def test_table_schemes_reject_ids_past_max_positions(cls):
    s = cls(cfg(max_positions=16))
    x = torch.randn(1, 4, 32)
    s.embed(x, arange_ids(4, offset=12))  # last ID 15 is fine
    with pytest.raises(ValueError, match="max_positions"):
        s.embed(x, arange_ids(4, offset=13))


# ---------------------------------------------------------------- FIRE and T5's bias

def t5_bucket_by_hand(n: int, buckets: int = 32, max_distance: int = 128) -> int:
    """T5's causal bucket of distance n >= 0, written from its definition one number at a time."""
    exact = buckets // 2
    if n < exact:
        return n
    return min(buckets - 1, exact + int(math.log(n / exact) / math.log(max_distance / exact) * (buckets - exact)))


def test_t5_buckets_match_the_definition_and_its_bias_depends_only_on_distance():
    from lengthgen.model.positions import t5_bucket

    n = torch.arange(0, 400)
    assert t5_bucket(n, 32, 128).tolist() == [t5_bucket_by_hand(int(v)) for v in n]
    assert t5_bucket(n, 8, 20).tolist() == [t5_bucket_by_hand(int(v), 8, 20) for v in n]
    torch.manual_seed(0)
    s = build_scheme(cfg(position="t5", position_options={"buckets": 8, "max_distance": 20}))
    ids = torch.arange(40)[None]
    b = s.bias(ids)[0]  # (H, T, T)
    assert torch.equal(s.bias(ids + 57)[0], b)  # a shift of every ID changes nothing
    for i, j in ((10, 3), (30, 23), (39, 32)):  # the same distance, the same bias
        assert torch.equal(b[:, i, j], b[:, 10, 3])
    assert torch.equal(b[:, 39, 0], b[:, 25, 0]) and torch.equal(b[:, 39, 0], b[:, 20, 0])  # beyond max_distance: one bucket
    assert not torch.equal(b[:, 3, 0], b[:, 3, 1])  # distances 3 and 2: exact buckets of their own
    with pytest.raises(ValueError, match="max_distance"):
        build_scheme(cfg(position="t5", position_options={"buckets": 32, "max_distance": 10}))


def test_fire_is_its_mlp_on_the_log_distance_over_the_log_query_position():
    torch.manual_seed(0)
    s = build_scheme(cfg(position="fire", position_options={"c": 0.5, "threshold": 8.0}))
    ids = torch.arange(20)[None]
    b = s.bias(ids)[0]  # (H, T, T)
    psi = lambda x: math.log(0.5 * x + 1)  # noqa: E731
    for i, j in ((0, 0), (3, 1), (12, 2), (19, 19), (19, 0)):
        x = torch.tensor([[psi(i - j) / psi(max(8.0, i + 1))]])
        assert torch.allclose(b[:, i, j], s.mlp(x)[0], atol=1e-6), (i, j)
    # relative: while the normaliser is the threshold (queries at positions <= L), only i - j counts
    assert torch.allclose(b[:, 6, 2], b[:, 4, 0], atol=1e-6) and torch.allclose(b[:, 7, 7], b[:, 1, 1], atol=1e-6)
    # past it, the same distance reads smaller for a later query: FIRE's progressive interpolation
    far = s.mlp(torch.tensor([[psi(4) / psi(20)]]))[0]
    assert torch.allclose(b[:, 19, 15], far, atol=1e-6) and not torch.allclose(b[:, 19, 15], b[:, 6, 2], atol=1e-4)
    with pytest.raises(ValueError, match="fire c"):
        build_scheme(cfg(position="fire", position_options={"c": 0.0}))


def test_the_forget_gate_decays_with_distance_as_the_sum_of_its_log_gates():
    torch.manual_seed(0)
    s = build_scheme(cfg(position="fox", n_layer=2))
    x = torch.randn(2, 9, 32)
    D = s.decay(x, 1)  # (B, H, T, T)
    logf = torch.nn.functional.logsigmoid(s.gates[1](x)).transpose(1, 2)  # (B, H, T)
    for i, j in ((0, 0), (4, 1), (8, 0), (8, 7)):
        assert torch.allclose(D[:, :, i, j], logf[:, :, j + 1:i + 1].sum(-1), atol=1e-5), (i, j)
    below = torch.ones(9, 9, dtype=torch.bool).tril()
    assert (D[..., below] <= 1e-6).all()  # a decay: never a gain
    # one gate everywhere (the same token repeated): the decay is that gate's log times the distance,
    # strictly falling with distance
    same = s.decay(x[:, :1].expand(-1, 9, -1), 0)[0, :, 8, :]  # (H, keys) from the last query
    assert (same[:, 1:] > same[:, :-1]).all()
    assert torch.allclose(same[:, 0], 8 * (same[:, 7] - same[:, 8]), atol=1e-5)
    # its logits are q.k / sqrt(Dh) plus the decay, future keys -inf
    q, k = torch.randn(2, 2, 9, 16), torch.randn(2, 2, 9, 16)
    logits = s.content_logits(q, k, x, 1)
    assert torch.isinf(logits[..., 0, 1:]).all() and torch.allclose(
        logits[..., 5, 2], (q[..., 5, :] * k[..., 2, :]).sum(-1) / 4 + D[..., 5, 2], atol=1e-5)
