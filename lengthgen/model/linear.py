"""The blocks' linear layers: nn.Linear (the same parameters, so the same checkpoints) whose matmul a
faster kernel may take. `KERNELS` holds them, tried in order before F.linear: each is
kernel(x, weight, bias) -> y, or None where it does not apply, and each must equal F.linear to float
tolerance. lengthgen.accel installs its own (model/ imports nothing from it)."""
from __future__ import annotations

import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

KERNELS: list = []


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """x weight^T + bias: the first of KERNELS that takes the call, else F.linear."""
    for kernel in KERNELS:
        if (y := kernel(x, weight, bias)) is not None:
            return y
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)
