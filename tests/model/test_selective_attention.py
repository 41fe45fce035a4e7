"""Selective attention (Leviathan et al., 2024), checked against its definition: every head's logits
are q.k / sqrt(Dh) - F, F_ij = sum over queries k < i of ReLU(head 0's logit_kj) for keys 0 < j < k."""
import math

import pytest
import torch

from lengthgen.config.schema import ModelConfig
from lengthgen.model.attention import masked_softmax, recording
from lengthgen.model.positions import build_scheme
from lengthgen.model.rotary import RoPE
from lengthgen.model.selective_attention import SelectiveAttention, forgetting
from lengthgen.model.transformer import Transformer
from fitting import trains_with_finite_gradients

pytestmark = pytest.mark.usefixtures("one_thread")
NEG = float("-inf")


def cfg(**kw) -> ModelConfig:
    base = dict(d_model=32, n_layer=2, n_head=4, max_positions=64, position="selective")
    base.update(kw)
    return ModelConfig(**base)


def plain_logits(q, k):
    T = q.shape[-2]
    return (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(torch.ones(T, T).triu(1).bool(), NEG)


def test_three_tokens_are_never_masked_the_first_selection_reaches_the_fourth():
    # query 2's selection of key 1 (S_21 = 5) is the only one 3 tokens allow (key 0 is the first token,
    # and no token masks itself); F counts earlier queries only, so it first acts on query 3
    L = torch.tensor([[[9.0, NEG, NEG], [9.0, 9.0, NEG], [9.0, 5.0, 9.0]]])
    assert torch.equal(forgetting(L), torch.zeros(1, 3, 3))
    L4 = torch.tensor([[[9.0, NEG, NEG, NEG], [9.0, 9.0, NEG, NEG], [9.0, 5.0, 9.0, NEG], [9.0, 9.0, 9.0, 9.0]]])
    want = torch.zeros(1, 4, 4)
    want[0, 3, 1] = 5.0
    assert torch.equal(forgetting(L4), want)


def test_hand_worked_five_tokens():
    L = torch.tensor([[[1.0, 0, 0, 0, 0],
                       [2.0, 3.0, 0, 0, 0],
                       [4.0, 0.5, 6.0, 0, 0],
                       [7.0, -2.0, 1.5, 8.0, 0],
                       [9.0, 2.5, 3.5, 4.5, 10.0]]]).masked_fill(torch.ones(5, 5).triu(1).bool(), NEG)
    # S keeps ReLU(L) at 0 < j < k: S_21 = 0.5, S_31 = 0 (ReLU of -2), S_32 = 1.5, S_41 = 2.5, S_42 = 3.5, S_43 = 4.5
    # F_ij sums S_kj over k < i: F_31 = S_21, F_41 = S_21 + S_31, F_42 = S_32; the rest 0 (S_4j reaches no query)
    want = torch.zeros(1, 5, 5)
    want[0, 3, 1], want[0, 4, 1], want[0, 4, 2] = 0.5, 0.5, 1.5
    assert torch.equal(forgetting(L), want)


def test_every_heads_logits_lose_head_zeros_forgetting():
    torch.manual_seed(0)
    s = SelectiveAttention(cfg())
    q, k, x = torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 8), torch.randn(2, 7, 32)
    plain = plain_logits(q, k)
    got = s.content_logits(q, k, x, 0)
    Fh = forgetting(plain[:, 0])[:, None]  # (B, 1, T, T)
    below = torch.ones(7, 7, dtype=torch.bool).tril()
    assert torch.allclose(got[..., below], (plain - Fh)[..., below], atol=1e-6)
    assert torch.isneginf(got[..., ~below]).all()  # the future is masked by the scheme itself
    assert (Fh[..., below] > 0).any()  # random logits do select something
    assert (got[..., 0] == plain[..., 0]).all()  # the first token is never masked
    assert (torch.diagonal(got, dim1=-2, dim2=-1) == torch.diagonal(plain, dim1=-2, dim2=-1)).all()  # nor masks itself


def test_no_effect_when_head_zeros_logits_are_never_positive():
    torch.manual_seed(1)
    s = SelectiveAttention(cfg())
    q, k, x = torch.randn(2, 4, 9, 8), torch.randn(2, 4, 9, 8), torch.randn(2, 9, 32)
    q[:, 0], k[:, 0] = q[:, 0].abs() * 0.1, -k[:, 0].abs() * 0.1  # head 0: q.k <= 0 everywhere
    q[:, 0, :, 0] = k[:, 0, :, 0] = 0.0
    assert torch.equal(s.content_logits(q, k, x, 1), plain_logits(q, k).float())
    q[:, 0, 5, 0], k[:, 0, 2, 0] = 4.0, 4.0  # one positive logit, query 5's of key 2: it acts from query 6 on
    changed = s.content_logits(q, k, x, 1) != plain_logits(q, k)
    assert changed.any() and changed[..., 6:, 2].all() and not changed[..., :6, :].any() and changed.sum() == 4 * 3 * 2


def test_a_selection_lowers_later_queries_attention_to_that_key_in_every_head():
    torch.manual_seed(2)
    s = SelectiveAttention(cfg())
    q, k, x = torch.randn(1, 4, 6, 8) * 0.1, torch.randn(1, 4, 6, 8) * 0.1, torch.randn(1, 6, 32)
    before = masked_softmax(s.content_logits(q, k, x, 0))
    q[:, 0, 3, 0], k[:, 0, 1, 0] = 10.0, 10.0  # head 0's query 3 selects key 1 (logit 100 / sqrt(8))
    after = masked_softmax(s.content_logits(q, k, x, 0))
    assert (after[0, :, 4:, 1] < 1e-6).all() and (before[0, :, 4:, 1] > 0.1).all()


def test_causal_in_a_model_and_recorded():
    torch.manual_seed(3)
    model = Transformer(cfg(), 11).eval()
    x = torch.randint(0, 11, (2, 10), generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[:, 6:] = (y[:, 6:] + 1) % 11
    with torch.no_grad(), recording(model) as recorder:
        out_x, out_y = model(x), model(y)
    assert torch.allclose(out_x[:, :6], out_y[:, :6], atol=1e-6) and not torch.allclose(out_x[:, 6:], out_y[:, 6:])
    weights = recorder.weights[0][0]  # layer 0, the first pass: (B, H, T, T), rows summing to 1, none on the future
    assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 10)) and (weights.triu(1) == 0).all()


def test_rope_option_rotates_as_rope():
    torch.manual_seed(4)
    s, rope = SelectiveAttention(cfg(), rope=True, theta=500.0), RoPE(cfg(), theta=500.0)
    q, k, ids = torch.randn(1, 4, 5, 8), torch.randn(1, 4, 5, 8), torch.tensor([[0, 2, 3, 7, 9]])
    assert all(torch.equal(a, b) for a, b in zip(s.rotate(q, k, ids), rope.rotate(q, k, ids)))
    plain = SelectiveAttention(cfg())
    assert all(torch.equal(a, b) for a, b in zip(plain.rotate(q, k, ids), (q, k)))  # NoPE by default


def test_options_are_checked():
    for options, key in (({"rope": 1}, "selective rope"), ({"theta": 500.0}, "selective theta"),
                         ({"rope": True, "theta": -1.0}, "theta")):
        with pytest.raises(ValueError, match=key):
            build_scheme(cfg(position_options=options))
    with pytest.raises(ValueError, match="even head width"):
        build_scheme(cfg(d_model=12, n_head=4, position_options={"rope": True}))
    assert SelectiveAttention.bidirectional is False and SelectiveAttention.has_content


@pytest.mark.parametrize("options", [{}, {"rope": True}])
def test_tiny_model_trains_with_finite_grads(options):
    torch.manual_seed(5)
    model = Transformer(cfg(n_layer=1, position_options=options), 11).train()
    x = torch.randint(0, 11, (4, 12), generator=torch.Generator().manual_seed(6))
    trains_with_finite_gradients(model, x)


def test_matches_x_transformers_attend_selective():
    """The same q, k, v through x-transformers' Attend(causal=True, selective=True): the same
    logits below the diagonal and the same output."""
    attend = pytest.importorskip("x_transformers.attend")
    torch.manual_seed(7)
    q, k, v = torch.randn(2, 4, 12, 8), torch.randn(2, 4, 12, 8), torch.randn(2, 4, 12, 8)
    theirs, inter = attend.Attend(causal=True, selective=True)(q, k, v)
    logits = SelectiveAttention(cfg()).content_logits(q, k, torch.zeros(2, 12, 32), 0)
    below = torch.ones(12, 12, dtype=torch.bool).tril()
    assert torch.allclose(logits[..., below], inter.pre_softmax_attn[..., below], atol=1e-5)
    assert torch.allclose(masked_softmax(logits) @ v, theirs, atol=1e-5)
