"""Transformer-XL relative positions (lengthgen.model.relative_positions): the relative term equals
(q_i + v) . W_r R(p_j - p_i) built pair by pair, for any IDs and on both of its code paths; it sees
only differences of IDs; it matches the authors' shift-trick layout on 0..T-1; it masks the future
only when causal."""
from __future__ import annotations

import pytest
import torch

from lengthgen.config.schema import ModelConfig
from lengthgen.model.relative_positions import RelativePositions, relative_sinusoid
from lengthgen.model.transformer import Transformer


def scheme(causal: bool = False, **options) -> RelativePositions:
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=16, n_head=4, n_layer=2, position="relative", causal=causal)
    return RelativePositions(cfg, **options)


def by_pairs(s: RelativePositions, q: torch.Tensor, ids: torch.Tensor, layer: int) -> torch.Tensor:
    """(q_i + v) . (W_r R(p_j - p_i))_h, every pair's relative key built on its own."""
    B, H, T, Dh = q.shape
    ids = ids.expand(B, T)
    distance = ids[:, None, :] - ids[:, :, None]  # (B, T, T): p_j - p_i
    keys = s.relative_keys[layer](relative_sinusoid(distance, s.d_model, s.max_time).float())  # (B, T, T, D)
    keys = keys.view(B, T, T, H, Dh)
    return torch.einsum("bhid,bijhd->bhij", q + s.position_bias[layer][None, :, None, :], keys)


@pytest.mark.parametrize("ids", [torch.arange(7)[None], torch.tensor([[0, 3, 4, 10, 11, 40, 41]]),
                                 torch.sort(torch.randperm(2048)[:14].view(2, 7), dim=1).values])
def test_the_relative_term_is_the_sinusoid_of_the_id_difference_through_w_r(ids):
    s = scheme()
    q = torch.randn(2, 4, 7, 4)
    assert torch.allclose(s.relative_logits(q, ids, 1), by_pairs(s, q, ids, 1), atol=1e-4)


def test_only_differences_of_ids_matter():
    s = scheme()
    q, k = torch.randn(2, 4, 6, 4), torch.randn(2, 4, 6, 4)
    ids = torch.tensor([[0, 2, 5, 9, 20, 21], [1, 3, 4, 7, 8, 30]])
    base = s.content_logits(q, k, None, 0, ids)
    assert torch.allclose(s.content_logits(q, k, None, 0, ids + 1000), base, atol=1e-3)
    assert not torch.allclose(s.content_logits(q, k, None, 0, ids * 2), base, atol=1e-3)


def test_on_consecutive_ids_it_is_the_authors_shifted_table():
    """Their non-causal layout: R for positions -T..T-1, logits against it, then `_rel_shift_inner`
    (reshape (T, 2T) -> (2T, T), drop the first row, back to (T, 2T - 1), keep T columns)."""
    s = scheme()
    T, D = 5, 16
    q = torch.randn(1, 4, T, 4)
    table = relative_sinusoid(torch.arange(-T, T), D).float()  # (2T, D)
    keys = s.relative_keys[0](table).view(2 * T, 4, 4).transpose(0, 1)  # (H, 2T, Dh)
    logits = (q + s.position_bias[0][None, :, None, :]) @ keys.transpose(-2, -1)  # (1, H, T, 2T)
    shifted = logits.reshape(1, 4, 2 * T, T)[:, :, 1:].reshape(1, 4, T, 2 * T - 1)[..., :T]
    assert torch.allclose(s.relative_logits(q, torch.arange(T)[None], 0), shifted, atol=1e-5)


def test_logits_add_the_content_bias_and_scale_by_the_head_width():
    s = scheme()
    q, k, ids = torch.randn(1, 4, 3, 4), torch.randn(1, 4, 3, 4), torch.arange(3)[None]
    content = (q + s.content_bias[0][None, :, None, :]) @ k.transpose(-2, -1)
    want = (content + by_pairs(s, q, ids, 0)) / 2  # sqrt(head width 4)
    assert torch.allclose(s.content_logits(q, k, None, 0, ids), want, atol=1e-5)


def test_causal_masks_the_future_and_bidirectional_does_not():
    q, k, ids = torch.randn(1, 4, 4, 4), torch.randn(1, 4, 4, 4), torch.arange(4)[None]
    causal = scheme(causal=True).content_logits(q, k, None, 0, ids)
    assert torch.isneginf(causal[..., 0, 1:]).all() and torch.isfinite(causal.tril()).all()
    assert torch.isfinite(scheme(causal=False).content_logits(q, k, None, 0, ids)).all()


def test_a_model_with_relative_positions_trains_and_reads_random_ids():
    cfg = ModelConfig(d_model=16, n_head=2, n_layer=2, position="relative", causal=False)
    model = Transformer(cfg, 7)
    x = torch.randint(0, 7, (3, 9))
    ids = torch.sort(torch.randperm(100)[:27].view(3, 9), dim=1).values
    model(x, ids).sum().backward()
    assert all(p.grad is not None for p in model.scheme.parameters())


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="max_time"):
        scheme(max_time=0)
    with pytest.raises(ValueError, match="even"):
        RelativePositions.check(ModelConfig(d_model=15, n_head=3, position="relative"))
