"""The dense attention path's fast kernels (lengthgen.accel.backends): each equals the model's own
definition (`sdpa_attention`) in values and gradients where it takes a call, and declines the calls
it was not built for, so `dense_attention` gives the same attention with or without them."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lengthgen.accel import backends, narrow_attention
from lengthgen.accel.backends import math_causal_attention
from lengthgen.model.attention import BACKENDS, AttentionDropout, NO_DROPOUT, dense_attention, sdpa_attention


def qkv(width: int = 4, seed: int = 0, T: int = 7):
    torch.manual_seed(seed)
    return [torch.randn(2, 3, T, width, requires_grad=True) for _ in range(3)]


def values_and_grads(fn, q, k, v):
    out = fn(q, k, v)
    return (out, *torch.autograd.grad(out.square().sum(), (q, k, v)))


def test_math_attention_equals_sdpa_in_values_and_gradients():
    """The bf16 CPU path (baddbmm with the mask and scale folded in, float32
    softmax) computes SDPA's causal attention; in fp32 the two agree exactly
    up to rounding, in bf16 up to bf16 rounding."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 4, 7, 8, requires_grad=True) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    got = math_causal_attention(q, k, v)
    assert torch.allclose(got, ref, atol=1e-5)
    g_ref = torch.autograd.grad(ref.square().sum(), (q, k, v))
    g_got = torch.autograd.grad(got.square().sum(), (q, k, v))
    for a, b in zip(g_got, g_ref):
        assert torch.allclose(a, b, atol=1e-4)
    low = math_causal_attention(*(t.detach().bfloat16() for t in (q, k, v)))
    assert low.dtype == torch.bfloat16 and torch.allclose(low.float(), ref, atol=0.05)
    assert not torch.allclose(got[:, :, 1:], v[:, :, 1:], atol=1e-2)  # really mixes keys (not a copy of v)
    assert torch.allclose(got[:, :, 0], v[:, :, 0], atol=1e-6)  # the first query sees only the first key


def test_importing_the_fast_paths_installs_each_kernel_once():
    backends.install()
    assert BACKENDS.count(backends.narrow_heads) == 1 and backends.low_precision_cpu in BACKENDS


def test_the_narrow_kernel_takes_narrow_heads_on_one_thread_and_equals_sdpa():
    if narrow_attention.library() is None:
        pytest.skip("no C compiler here")
    q, k, v = qkv(width=4)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert backends.narrow_heads(q, k, v, None, NO_DROPOUT, True) is not None
        got = values_and_grads(lambda *t: dense_attention(*t, None, NO_DROPOUT), q, k, v)
    finally:
        torch.set_num_threads(threads)
    ref = values_and_grads(lambda *t: sdpa_attention(*t, None, NO_DROPOUT), q, k, v)
    for a, b in zip(got, ref):
        assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("case", ["bias", "bidirectional", "logit dropout", "stacked", "wide"])
def test_the_narrow_kernel_declines_what_it_does_not_compute(case):
    q, k, v = qkv(width=16 if case == "wide" else 4)
    bias = torch.zeros(1, 3, 7, 7) if case == "bias" else None
    dropout = AttentionDropout(0.1, "logits") if case == "logit dropout" else NO_DROPOUT
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if case == "stacked":
            with backends.stacked_seeds():
                assert backends.narrow_heads(q, k, v, bias, dropout, True) is None
        else:
            assert backends.narrow_heads(q, k, v, bias, dropout, case != "bidirectional") is None
    finally:
        torch.set_num_threads(threads)


def test_a_bias_while_stacked_equals_sdpa_with_its_mask():
    q, k, v = qkv()
    bias = torch.randn(1, 3, 7, 7)
    assert backends.stacked_bias(q, k, v, bias, NO_DROPOUT, True) is None  # not stacked: SDPA's
    with backends.stacked_seeds():
        got = values_and_grads(lambda *t: backends.stacked_bias(*t, bias, NO_DROPOUT, True), q, k, v)
    assert not backends.stacking
    ref = values_and_grads(lambda *t: sdpa_attention(*t, bias, NO_DROPOUT), q, k, v)
    for a, b in zip(got, ref):
        assert torch.allclose(a, b, atol=1e-5)


def test_low_precision_on_cpu_takes_bf16_only_and_keeps_the_dropout_on_logits_to_the_model():
    q, k, v = qkv()
    assert backends.low_precision_cpu(q, k, v, None, NO_DROPOUT, True) is None  # fp32: SDPA is faster
    low = [t.detach().bfloat16() for t in (q, k, v)]
    assert backends.low_precision_cpu(*low, None, NO_DROPOUT, True) is not None
    assert backends.low_precision_cpu(*low, None, AttentionDropout(0.1, "logits"), True) is None
    assert backends.low_precision_cpu(*low, torch.zeros(1, 3, 7, 7), NO_DROPOUT, True) is None


def test_the_model_without_the_fast_paths_gives_the_same_attention():
    q, k, v = qkv(width=4)
    with_them = dense_attention(q, k, v, None, NO_DROPOUT)
    kept = list(BACKENDS)
    BACKENDS.clear()
    try:
        without = dense_attention(q, k, v, None, NO_DROPOUT)
    finally:
        BACKENDS.extend(kept)
    assert torch.allclose(with_them, without, atol=1e-5)
    assert torch.allclose(without, F.scaled_dot_product_attention(q, k, v, is_causal=True))
