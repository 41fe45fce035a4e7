"""The content schemes' fused attention (content_attention.fused with lengthgen.accel's fuser,
used for training on CUDA) equals the eager functions, forward and backward, compiled here by
inductor's CPU path."""

import pytest
import torch

import lengthgen.accel  # noqa: F401 (installs the fuser)
from lengthgen.model import content_attention as ca
from lengthgen.model.attention import NO_DROPOUT


def inputs(seed=0, B=2, H=3, T=11, Dh=8):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, Dh, generator=g, requires_grad=True) for _ in range(3))
    gate = torch.randn(B, H, T, generator=g, requires_grad=True)
    return q, k, v, gate


def arguments(name, q, k, v, gate):
    if name == "tra":
        return (q, k, v, gate, 4, NO_DROPOUT)  # chunks of 4 queries: the loop over chunks is compiled too
    if name == "stickbreaking":
        return (q, k, v, 4, NO_DROPOUT)  # chunks of 4 queries
    if name == "cope":
        return (q, k, v, gate.flatten()[:8, None].expand(8, 6).contiguous(), 0, NO_DROPOUT)  # (Dh, npos_max)
    return (q, k, v, gate, NO_DROPOUT)


@pytest.mark.slow  # compiles four functions
@pytest.mark.parametrize("name", sorted(ca.ATTENTIONS))
def test_fused_attention_is_the_eager_attention(name):
    assert ca.fused(name) is not ca.ATTENTIONS[name]  # compiled, not the eager function again
    results = []
    for attention in (ca.ATTENTIONS[name], ca.fused(name)):
        tensors = inputs(T=7)  # two chunks of queries, the last one short: every chunk a graph of its own
        out = attention(*arguments(name, *tensors))
        (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
        results.append((out.detach(), [t.grad for t in tensors if t.grad is not None]))
    (eager, eager_grads), (fused, fused_grads) = results
    assert torch.allclose(eager, fused, atol=1e-5, rtol=1e-4)
    assert len(eager_grads) == len(fused_grads) >= 3
    for a, b in zip(eager_grads, fused_grads):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_fox_attention_is_the_logits_path():
    """FoX's whole attention (what is fused) equals softmax(content_logits) @ v, the eager path."""
    from lengthgen.config.schema import ModelConfig
    from lengthgen.model.attention import masked_softmax
    from lengthgen.model.positions import FoX
    scheme = FoX(ModelConfig(d_model=24, n_head=3, n_layer=1, position="fox"))
    q, k, v, _ = inputs(H=3)
    x = torch.randn(2, 11, 24)
    expected = masked_softmax(scheme.content_logits(q, k, x, 0)) @ v
    got = ca.fox_attention(q, k, v, scheme.gates[0](x).transpose(1, 2))
    assert torch.allclose(expected, got, atol=1e-6)


def test_training_on_cuda_only_fuses():
    q = torch.zeros(1, 1, 2, 2)
    assert not ca.fuses(q, None)  # CPU: eager
