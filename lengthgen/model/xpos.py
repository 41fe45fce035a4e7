"""xPos (Sun et al., "A Length-Extrapolatable Transformer", ACL 2023), the scheme `xpos`: RoPE
whose rotation also scales. Rotary pair i of the query at position n is multiplied by
zeta_i^(n / gamma) and of the key at position m by zeta_i^(-m / gamma), with

    zeta_i = (2i / Dh + 0.4) / 1.4  in [2/7, 1),   gamma = `scale_base`,

so q_n . k_m keeps RoPE's dependence on n - m alone and each pair's term is damped by
zeta_i^((n - m) / gamma): the low-index (fast-rotating) pairs decay fastest with distance.
As a decay along the past only, it is causal only.

The exponents are the position IDs as given, not centred. x-transformers centres them on the middle
of each call's positions to keep the factors near 1; only n - m reaches q . k, so any constant shift
gives the same scores, but a centre computed per call would not be constant under a KV cache (keys
cached in one pass, queries in the next, different centres). Uncentred, the factors stay inside
float32's and bfloat16's range for |ID| < 69 gamma (35,000 at gamma = 512); float16 would
overflow past 8 gamma.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from lengthgen.config.schema import ModelConfig
from lengthgen.model.rotary import RoPE


class XPos(RoPE):
    """RoPE (theta and style as `rope`'s) times the xPos scale; `scale_base` gamma (512, the paper's
    and x-transformers' default); gamma = inf turns the scale off, leaving RoPE exactly."""

    bidirectional = False  # a decay towards the past: the future side would grow instead

    def __init__(self, cfg: ModelConfig, theta: float = 10000.0, style: str = "half", scale_base: float = 512.0):
        super().__init__(cfg, theta=theta, style=style)
        if isinstance(scale_base, bool) or not isinstance(scale_base, (int, float)) or not scale_base > 0:
            raise ValueError(f"xpos scale_base must be a number > 0 (inf: no scaling), got {scale_base!r}")
        self.scale_base = float(scale_base)
        zeta = (torch.arange(0, self.head_dim, 2, dtype=torch.float32) + 0.4 * self.head_dim) / (1.4 * self.head_dim)
        self.register_buffer("log_zeta", zeta.log(), persistent=False)  # (Dh/2,), each < 0

    def scales(self, position_ids: Tensor) -> Tensor:
        """zeta^(ID / gamma) per position and head dimension, in float32: (B|1, 1, T, Dh), laid out
        as `cos_sin` lays out the pairs. The key's scale is its reciprocal."""
        exponent = position_ids.float()[..., None] / self.scale_base * self.log_zeta  # (B|1, T, Dh/2)
        if self.style == "half":
            exponent = torch.cat((exponent, exponent), dim=-1)
        else:
            exponent = exponent.repeat_interleave(2, dim=-1)
        return exponent.exp()[:, None]

    def rotate(self, q: Tensor, k: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        # Scaling a pair by one number commutes with rotating it: rotate as RoPE, then scale.
        q, k = super().rotate(q, k, position_ids)
        if math.isinf(self.scale_base):
            return q, k
        scale = self.scales(position_ids)
        return q * scale.to(q.dtype), k * scale.reciprocal().to(k.dtype)  # (B, H, T, Dh) each
