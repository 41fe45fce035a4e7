"""The device a run uses and its precision: which device train.device names, whether it runs
bf16 natively, and the autocast context of train.precision."""
from __future__ import annotations

import torch

from lengthgen.errors import UserError


def pick_device(name: str = "auto") -> torch.device:
    """The device of train.device (whose spelling config validated), refused unless this machine has it."""
    if name != "auto":
        device = torch.device(name)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise UserError(f"train.device {name!r} requested but CUDA is not available")
        if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
            raise UserError(f"train.device {name!r} requested but this machine has "
                            f"{torch.cuda.device_count()} CUDA device(s)")
        if device.type == "mps" and not torch.backends.mps.is_available():
            raise UserError(f"train.device {name!r} requested but MPS is not available")
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def native_bf16(device: torch.device) -> bool:
    """Whether `device` runs bf16 matmuls natively. A CPU without AVX-512 (AVX2
    only) has oneDNN fall back to a reference kernel: on such a machine a 256^3 bf16
    matmul ran at 1.4 GFLOP/s, where fp32 reached 175 at 2048^2 (docs/benchmarks.md)."""
    if device.type == "cuda":  # compute capability 8.0 (Ampere) or newer; emulation does not count
        return torch.cuda.is_bf16_supported(including_emulation=False)
    if device.type == "cpu":
        try:
            return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
        except (AttributeError, RuntimeError):  # a build without oneDNN's probe: do not block
            return True
    return True


def check_precision(device: torch.device, precision: str) -> None:
    """Refuse bf16 training where it would run far slower than fp32 (hundreds of times on an AVX2-only CPU)."""
    if precision == "bf16" and not native_bf16(device):
        raise UserError(f"train.precision 'bf16' needs native bf16 support, which this {device.type} lacks "
                        "(bf16 would run far slower than fp32); use train.precision=fp32")


def autocast(device: torch.device, precision: str):
    """bf16 autocast on any device for precision = bf16; a no-op context for fp32."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")
