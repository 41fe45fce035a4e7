"""xPos (Sun et al., 2023), checked against its definition: q_n . k_m after the scheme equals
sum over rotary pairs i of zeta_i^((n - m) / gamma) times RoPE's pair term, zeta_i = (2i/Dh + 0.4) / 1.4."""
import math

import pytest
import torch

from lengthgen.config.schema import ModelConfig
from lengthgen.model.attention import KVCache
from lengthgen.model.positions import build_scheme
from lengthgen.model.rotary import RoPE
from lengthgen.model.transformer import Transformer
from lengthgen.model.xpos import XPos
from fitting import trains_with_finite_gradients

pytestmark = pytest.mark.usefixtures("one_thread")


def cfg(**kw) -> ModelConfig:
    base = dict(d_model=32, n_layer=2, n_head=2, max_positions=64, position="xpos")
    base.update(kw)
    return ModelConfig(**base)


def scores(scheme, q, k, ids):
    """q . k after the scheme: q, k (B, H, T, Dh), ids (B|1, T) -> (B, H, T, T)."""
    rq, rk = scheme.rotate(q, k, ids)
    return rq.double() @ rk.double().transpose(-2, -1)


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_scores_depend_only_on_the_offset(style):
    torch.manual_seed(0)
    s = XPos(cfg(), theta=100.0, style=style, scale_base=8.0)  # a short gamma: the scale matters
    q, k = torch.randn(1, 2, 9, 16), torch.randn(1, 2, 9, 16)
    ids = torch.tensor([[0, 1, 2, 5, 6, 9, 20, 21, 22]])  # gapped
    base = scores(s, q, k, ids)
    for shift in (7, 300, -4):  # every ID moved by one constant: the same scores, to float32's rounding
        # of the angles and exponents (at ID 300 the factors are 1e-22 and 1e22), a few 1e-6 of the largest
        assert (scores(s, q, k, ids + shift) - base).abs().max() < 2e-5 * base.abs().max(), shift
    # the scaled queries and keys themselves do move (it is not RoPE)
    assert not torch.allclose(s.rotate(q, k, ids + 7)[0], s.rotate(q, k, ids)[0], atol=1e-3)


def test_aligned_vectors_decay_with_distance_as_zeta_to_the_offset_over_gamma():
    # theta 1e9: the last pair turns by 1e9^(-14/16) < 2e-8 rad per position, so q and k stay
    # aligned there and the score is the scale alone, zeta^((n - m) / gamma)
    s = XPos(cfg(), theta=1e9, scale_base=16.0)
    q = torch.zeros(1, 1, 1, 16)
    q[..., 7] = q[..., 15] = 1.0  # pair 7 in the half layout: dims 7 and 7 + 8
    zeta = (14 / 16 + 0.4) / 1.4
    got = [scores(s, q, q, torch.tensor([[0, d]]))[0, 0, 1, 0].item() for d in range(0, 200, 10)]
    want = [2 * zeta ** (d / 16) for d in range(0, 200, 10)]
    assert got == pytest.approx(want, rel=1e-5)
    assert all(a > b for a, b in zip(got, got[1:]))
    # the fastest-rotating pair decays fastest: the bound |q||k| zeta_0^(d/gamma) is far below
    zeta_0 = 0.4 / 1.4
    assert zeta_0 ** (100 / 16) < 1e-3 < zeta ** (100 / 16)


def test_each_pair_is_ropes_term_times_its_scale():
    torch.manual_seed(1)
    s, rope = XPos(cfg(), scale_base=32.0), RoPE(cfg())
    q, k = torch.randn(2, 2, 6, 16), torch.randn(2, 2, 6, 16)
    ids = torch.tensor([[3, 4, 8, 9, 15, 40], [0, 2, 4, 6, 8, 10]])  # rows differ
    zeta = (torch.arange(0, 16, 2).double() / 16 + 0.4) / 1.4  # (8,)
    offset = (ids[:, :, None] - ids[:, None, :]).double()[:, None]  # (B, 1, T, T): n - m
    want = 0
    for i in range(8):  # pair i: dims i and i + 8 (half layout)
        mask = torch.zeros(16)
        mask[[i, i + 8]] = 1
        want = want + zeta[i] ** (offset / 32) * scores(rope, q * mask, k * mask, ids)
    assert torch.allclose(scores(s, q, k, ids), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("style", ["half", "interleaved"])
def test_infinite_scale_base_is_rope_exactly(style):
    torch.manual_seed(2)
    q, k, ids = torch.randn(2, 2, 7, 16), torch.randn(2, 2, 7, 16), torch.tensor([[0, 3, 4, 9, 10, 11, 50]])
    got = XPos(cfg(), theta=500.0, style=style, scale_base=math.inf).rotate(q, k, ids)
    want = RoPE(cfg(), theta=500.0, style=style).rotate(q, k, ids)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    # a finite gamma is not RoPE, and a large one tends to it
    assert not torch.allclose(XPos(cfg(), scale_base=512.0).rotate(q, k, ids)[1], RoPE(cfg()).rotate(q, k, ids)[1])
    assert torch.allclose(XPos(cfg(), scale_base=1e9).rotate(q, k, ids)[1], RoPE(cfg()).rotate(q, k, ids)[1],
                          atol=1e-5)


def test_hand_worked_single_pair():
    # Dh = 2: one pair, zeta = 0.4 / 1.4 = 2/7, angle = ID radians (inv_freq 1). gamma = 1.
    s = XPos(cfg(d_model=4, n_head=2), scale_base=1.0)
    q = torch.tensor([1.0, 0.0]).expand(1, 1, 2, 2)
    k = torch.tensor([0.0, 1.0]).expand(1, 1, 2, 2)
    rq, rk = s.rotate(q, k, torch.tensor([[0, 1]]))
    # query at 1: (1, 0) turned by 1 rad, times (2/7)^1; key at 1: (0, 1) turned by 1 rad, times (2/7)^-1
    assert torch.allclose(rq[0, 0, 1], torch.tensor([math.cos(1), math.sin(1)]) * 2 / 7, atol=1e-6)
    assert torch.allclose(rk[0, 0, 1], torch.tensor([-math.sin(1), math.cos(1)]) * 7 / 2, atol=1e-6)
    # at 0 nothing happens; q_1 . k_0 = (2/7) (cos 1 * 0 + sin 1 * 1) = (2/7) sin 1
    assert torch.allclose(rq[0, 0, 0], q[0, 0, 0]) and torch.allclose(rk[0, 0, 0], k[0, 0, 0])
    assert (rq[0, 0, 1] @ rk[0, 0, 0]).item() == pytest.approx(2 / 7 * math.sin(1), rel=1e-6)


def test_options_are_checked_and_the_scheme_is_causal_only():
    for bad in (0, -1.0, "512", True, float("nan")):
        with pytest.raises(ValueError, match="xpos scale_base"):
            build_scheme(cfg(position_options={"scale_base": bad}))
    with pytest.raises(ValueError, match="theta"):
        build_scheme(cfg(position_options={"theta": 0.0}))
    assert type(build_scheme(cfg(position_options={"scale_base": 64, "style": "interleaved"}))) is XPos
    assert XPos.bidirectional is False and not XPos.has_bias and not XPos.has_content


def test_kv_cache_gives_the_full_passs_logits_far_from_zero():
    """A per-call centre of the IDs would break this: the cached keys' scale came from another call."""
    torch.manual_seed(3)
    model = Transformer(cfg(n_head=4, position_options={"scale_base": 16.0}), 11).eval()
    x, ids = torch.randint(0, 11, (2, 9)), torch.arange(9)[None] + 100
    with torch.no_grad():
        full = model.head(model.run_blocks(model.embed(x, ids), ids))
        cache, parts = KVCache(), []
        for lo, hi in ((0, 5), (5, 6), (6, 9)):
            parts.append(model.head(model.run_blocks(model.embed(x[:, lo:hi], ids[:, lo:hi]), ids[:, lo:hi],
                                                     cache=cache)))
    assert torch.allclose(torch.cat(parts, 1), full, atol=1e-5)


def test_tiny_model_trains_with_finite_grads():
    torch.manual_seed(4)
    model = Transformer(cfg(n_layer=1, position_options={"scale_base": 32.0}), 11).train()
    x = torch.randint(0, 11, (4, 12), generator=torch.Generator().manual_seed(5))
    trains_with_finite_gradients(model, x)


def test_matches_x_transformers_rotary_xpos():
    """The same q, k through x-transformers' RotaryEmbedding(use_xpos=True): the same scores. Its
    pairs are interleaved and its exponents centred on the middle ID (max ID + 1) // 2, so its
    rotated q, k are this scheme's times zeta^(-centre/gamma) and zeta^(+centre/gamma)."""
    xt = pytest.importorskip("x_transformers.x_transformers")
    torch.manual_seed(6)
    gamma, Dh = 64, 16
    s = XPos(cfg(), style="interleaved", scale_base=gamma)
    rotary = xt.RotaryEmbedding(Dh, use_xpos=True, scale_base=gamma)
    q, k = torch.randn(2, 2, 10, Dh), torch.randn(2, 2, 10, Dh)
    ids = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [4, 5, 9, 10, 30, 31, 32, 60, 61, 90]])
    freqs, scale = rotary(ids)
    xq, xk = xt.apply_rotary_pos_emb(q, freqs, scale), xt.apply_rotary_pos_emb(k, freqs, scale ** -1.0)
    assert torch.allclose(scores(s, q, k, ids), xq.double() @ xk.double().transpose(-2, -1), rtol=1e-5, atol=1e-5)
    centre = (ids.max() + 1) // 2
    shift = ((torch.arange(0, Dh, 2) + 0.4 * Dh) / (1.4 * Dh)) ** (-centre / gamma)
    rq, rk = s.rotate(q, k, ids)
    assert torch.allclose(rq * shift.repeat_interleave(2), xq, rtol=1e-5, atol=1e-6)
    assert torch.allclose(rk / shift.repeat_interleave(2), xk, rtol=1e-5, atol=1e-6)
