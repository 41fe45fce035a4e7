"""The dense attention path's faster kernels (lengthgen.model.attention.BACKENDS), installed
when lengthgen.accel is imported. Each takes a call only where it was measured faster and equals
SDPA to float tolerance; elsewhere it returns None and the next one, or SDPA, runs.

- `stacked_bias`: a bias (ALiBi) while seeds are stacked under vmap (lengthgen.accel.stacked):
  SDPA's CPU kernel then refuses a gradient for its mask, so the logits are formed by hand.
- `low_precision_cpu`: bf16/fp16 on CPU, where torch's CPU flash kernel was 1.5-14x slower
  (forward + backward) than two batched matmuls and a float32 softmax at the looped models'
  shapes, while in fp32 it was 3-11x faster than them (docs/benchmarks.md, "Attention path on CPU").
  GPU paths are unchanged.
- `narrow_heads`: fp32 heads <= 8 wide on one CPU thread: narrow_attention.py's C kernel, 2-4x
  faster than SDPA there (its docstring says why).

And the content schemes' whole attention fused for training on CUDA (`fuse_attention`, installed
as lengthgen.model.content_attention.FUSER).
"""
from __future__ import annotations

import contextlib

import torch
from torch import Tensor

from lengthgen.accel import narrow_attention
from lengthgen.model import content_attention
from lengthgen.model.attention import BACKENDS, NO_DROPOUT, AttentionDropout, mask_of

stacking = False  # True while lengthgen.accel.stacked runs its seeds under vmap (`stacked_seeds`)


@contextlib.contextmanager
def stacked_seeds():
    """Inside: the model runs under vmap over stacked seeds, where a C kernel cannot see its
    inputs' storage and SDPA's CPU kernel gives no gradient for a float mask."""
    global stacking
    before, stacking = stacking, True
    try:
        yield
    finally:
        stacking = before


def math_causal_attention(q: Tensor, k: Tensor, v: Tensor, dropout: AttentionDropout = NO_DROPOUT,
                          causal: bool = True) -> Tensor:
    """Causal softmax(q k^T / sqrt(Dh)) v for (B, H, T, Dh) inputs, as SDPA
    with is_causal=True, but with plain batched matmuls and a float32 softmax.

    The scale and the causal mask ride along in the logits matmul (baddbmm:
    mask + scale * q k^T), and the softmax casts inside its own kernel: three
    separate passes over the (B, H, T, T) logits (scale, mask, cast) cost a
    Parity bf16 step about as much as its attention matmuls. `causal` false: no mask (an encoder).

    Precision: in bf16 the scores leave the matmul rounded to bf16 (8 bits of
    mantissa) before the float32 softmax, where SDPA keeps them in float32.
    With sharp attention (scores of 10 and more) the output is then 10-45x
    less accurate than SDPA's on the same bf16 inputs; the Parity accuracy in
    bf16 was unchanged (docs/results/looped.md, "Parity in bf16"). torch has no
    bf16-in, float32-out batched matmul on CPU to avoid it at no cost."""
    B, H, T, Dh = q.shape
    mask = mask_of(causal)(T, q.device, q.dtype)  # (T, T), broadcast over B * H
    if dropout.p and dropout.on == "logits":  # dropped before the mask is added: scores first
        logits = dropout.logits(torch.bmm(q.reshape(B * H, T, Dh), k.reshape(B * H, T, Dh).transpose(1, 2))
                                * Dh ** -0.5) + mask
    else:
        logits = torch.baddbmm(mask, q.reshape(B * H, T, Dh), k.reshape(B * H, T, Dh).transpose(1, 2),
                               alpha=Dh ** -0.5)  # (B * H, T, T), in q's dtype as before the cast
    att = dropout.weights(torch.softmax(logits, dim=-1, dtype=torch.float32))
    return (att.to(v.dtype) @ v.reshape(B * H, T, Dh)).view(B, H, T, Dh)


def logit_dropout(dropout: AttentionDropout) -> bool:
    return bool(dropout.p) and dropout.on == "logits"


def stacked_bias(q, k, v, bias, dropout, causal):
    if not (stacking and bias is not None) or logit_dropout(dropout):
        return None
    logits = (q @ k.transpose(-2, -1)).float() * q.shape[-1] ** -0.5 + bias
    return dropout.weights(torch.softmax(logits + mask_of(causal)(q.shape[2], q.device), -1)).to(v.dtype) @ v


def low_precision_cpu(q, k, v, bias, dropout, causal):
    if bias is not None or logit_dropout(dropout):
        return None
    if q.device.type == "cpu" and q.dtype in (torch.bfloat16, torch.float16):
        return math_causal_attention(q, k, v, dropout, causal)
    return None


def narrow_heads(q, k, v, bias, dropout, causal):
    if bias is not None or not causal or stacking or not narrow_attention.applies(q, dropout.p):
        return None
    return narrow_attention.attend(q, k, v)  # (B, H, T, Dh)


def fuse_attention(attention):
    """A content scheme's attention compiled by inductor: its chain of elementwise passes over
    (B, H, T, T) scores (TRA: nine, and a scan) becomes a few kernels, where on CUDA each pass costs
    a launch and a trip through memory (TRA's eager step was 2.9x RoPE's on an H200;
    docs/benchmarks.md). Equal to the eager function to float rounding
    (tests/accel/test_fused_attention.py, on CPU, where inductor compiles C++). A shape that
    changes becomes dynamic at its first recompile."""
    return torch.compile(attention)


def install() -> None:
    """Put the kernels in the model's list, and the fuser in its content attention, once per process."""
    for backend in (stacked_bias, low_precision_cpu, narrow_heads):
        if backend not in BACKENDS:
            BACKENDS.append(backend)
    content_attention.FUSER = fuse_attention
