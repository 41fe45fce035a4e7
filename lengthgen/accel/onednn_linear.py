"""fp32 linear layers on oneDNN where torch's BLAS leaves the CPU's AVX-512 unused.

Why: torch's CPU wheels do fp32 matmuls with MKL, and MKL picks its code path by vendor: on an AMD
CPU it runs AVX2 even where the CPU has AVX-512. On a 2-core AMD EPYC of family 26 (Zen 5, full-width
AVX-512) torch's fp32 matmul reaches 86-95 GFLOP/s on one thread at every shape, from the blocks'
(1664 x 64 x 256) to 2048^3, where oneDNN (which torch ships, and which picks its path by
instruction set) reaches 184-203 and OpenBLAS forced onto its AVX-512 kernels 215
(`benchmarks/decisions/linear_paths.py`; docs/benchmarks.md, "Linear layers on oneDNN").
The blocks' linear layers are over half of a CPU preset's step, so they take oneDNN here, forward
and backward, through `torch.ops.mkldnn._linear_pointwise` (the op inductor uses for CPU linear
layers), wrapped in an autograd Function: dx = dy W and dW = dy^T x are two more oneDNN matmuls.

Where it applies: fp32 on CPU, not under autocast, torch.compile or a torch.func transform (vmap
over stacked seeds), and only for matmuls of at least MIN_MACS multiply-adds (four times as many
with several threads): below that oneDNN's per-call cost loses to MKL (a 64-row matmul: 0.5-0.75x;
a d_model x 3 read-out: 0.4-0.8x at any row count), and inside a training step more than alone. Where it is on: CPUs with AVX-512 that are not
Intel's (on Intel's, MKL runs AVX-512 itself); `LENGTHGEN_ONEDNN_LINEAR=1` turns it on anywhere
oneDNN is built in, `=0` off, and `enabled` (below) does the same in-process (benchmarks compare
both paths).

Same numbers to float rounding, not bit for bit: oneDNN sums in another order than MKL (relative
differences about 1e-6; tests/accel/test_onednn_linear.py).
"""
from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from lengthgen.model import linear as model_linear

# one thread (4x on more). Alone, a layer breaks even at 2-4M multiply-adds (8-32M on two threads,
# benchmarks/decisions/linear_paths.py); inside small training steps oneDNN lost below about 16M
# (a tiny looped Parity test: 1.2-1.4x slower at 3M), so only the large matmuls take it
MIN_MACS = 16 << 20


def cpu_info() -> tuple[str, set[str]]:
    """(vendor, instruction-set flags) of this CPU, from /proc/cpuinfo; ('', set()) where unreadable."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "", set()
    field = {line.split(":")[0].strip(): line.split(":", 1)[1].strip() for line in lines if ":" in line}
    return field.get("vendor_id", ""), set(field.get("flags", "").split())


def available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def pays() -> bool:
    """The machine rule: AVX-512 that MKL does not use (a CPU not made by Intel)."""
    vendor, flags = cpu_info()
    return "avx512f" in flags and vendor not in ("", "GenuineIntel")


def decide(setting: str | None) -> bool:
    if setting == "0":
        return False
    return available() and (setting == "1" or pays())


enabled = decide(os.environ.get("LENGTHGEN_ONEDNN_LINEAR"))


def applies(x: Tensor, weight: Tensor) -> bool:
    if torch.compiler.is_compiling():  # first: the checks below would break a traced graph
        return False
    if not (enabled and x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and weight.is_contiguous() and x.dim() >= 2 and x.shape[-1] == weight.shape[1]):
        return False
    if torch.is_autocast_enabled("cpu") or any(torch._C._functorch.is_functorch_wrapped_tensor(t) for t in (x, weight)):
        return False
    macs = x.numel() * weight.shape[0]  # rows x in x out
    return macs >= MIN_MACS * (1 if torch.get_num_threads() == 1 else 4)


def matmul_t(a: Tensor, b: Tensor) -> Tensor:
    """a b^T for 2-D a (M, K) and b (N, K), on oneDNN."""
    return torch.ops.mkldnn._linear_pointwise(a, b, None, "none", [], "")


def transposed(weight: Tensor) -> Tensor:
    """weight^T, contiguous, made once per version of the weight and kept on it: a looped block
    applies the same weights up to T(n) times a step, and a transposing copy of a 256 x 1024 matrix
    each time was 3 % of a looped paper step."""
    # the source is kept with it, so its storage's address cannot be reused by another tensor
    # (weight.data = ...) while the key below holds it; the version moves at every optimizer step
    cached = getattr(weight, "_lengthgen_transposed", None)
    if cached is None or cached[0].data_ptr() != weight.data_ptr() or cached[1] != weight._version:
        source = weight.detach()
        cached = (source, weight._version, source.t().contiguous())
        weight._lengthgen_transposed = cached
    return cached[2]


class OneDnnLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:  # x (M, K), weight (N, K)
        ctx.save_for_backward(x, transposed(weight) if ctx.needs_input_grad[0] else None)
        ctx.has_bias = bias is not None
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        x, weight_t = ctx.saved_tensors
        grad = grad.contiguous()
        dx = matmul_t(grad, weight_t) if ctx.needs_input_grad[0] else None  # dy W
        dw = matmul_t(grad.t(), x.t()) if ctx.needs_input_grad[1] else None  # dy^T x
        db = grad.sum(0) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return dx, dw, db


def kernel(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor | None:
    """lengthgen.model.linear's kernel: x weight^T + bias on oneDNN where `applies`, else None."""
    if not applies(x, weight):
        return None
    y = OneDnnLinear.apply(x.reshape(-1, x.shape[-1]), weight, bias)
    return y.view(*x.shape[:-1], weight.shape[0])


def install() -> None:
    if kernel not in model_linear.KERNELS:
        model_linear.KERNELS.append(kernel)
