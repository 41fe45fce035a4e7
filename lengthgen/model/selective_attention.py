"""Selective attention (Leviathan, Kalman and Matias, "Selective Attention Improves Transformer",
2024; arXiv 2410.02703), the scheme `selective`: each layer's head 0 also decides which earlier
tokens the later queries stop attending to. With L the head's scaled, causal logits q.k / sqrt(Dh):

    S_kj = ReLU(L_kj)  for 0 < j < k, else 0      (query k selects key j for masking; never the first
                                                   token, never itself, never a future key)
    F_ij = sum_{k < i} S_kj                         (what every earlier query selected, accumulated)
    logit_ij = q_i . k_j / sqrt(Dh) - F_ij          (every head of the layer, head 0 included)

F is exclusive of query i itself, so a selection takes effect from the next query on: with 3 tokens
F is zero (the only selection, S_21, first reaches query 3). It is parameter-free and, like FoX, a
data-dependent change to attention rather than a positional encoding, so by default positions are
NoPE (explicit position IDs are not read); `rope = true` rotates queries and keys as `rope` does
(base `theta`) before the logits, head 0's included.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from lengthgen.config.schema import ModelConfig
from lengthgen.model.rotary import RoPE
from lengthgen.model.scheme_base import PositionalScheme


def forgetting(selector_logits: Tensor) -> Tensor:
    """F (B, T, T) from the selecting head's logits (B, T, T): F_ij = sum over queries k < i of
    ReLU(logit_kj), counting only keys 0 < j < k. Entries above the diagonal are 0 (masked anyway)."""
    T = selector_logits.shape[-1]
    selectable = torch.ones(T, T, dtype=torch.bool, device=selector_logits.device).tril(-1)  # past keys, not itself
    selectable[:, 0] = False  # the first token is never masked
    S = F.relu(selector_logits).masked_fill(~selectable, 0.0)  # also turns any -inf into 0
    return F.pad(S[..., :-1, :], (0, 0, 1, 0)).cumsum(-2)  # shifted down one query: row i sums rows k < i


class SelectiveAttention(PositionalScheme):
    """Selective attention (see the module docstring); `rope` (false) adds rotary positions, `theta`
    (10000.0) their base."""

    has_content = True
    bidirectional = False  # selections accumulate along the past: defined for causal attention only

    def __init__(self, cfg: ModelConfig, rope: bool = False, theta: float = 10000.0):
        super().__init__(cfg)
        if not isinstance(rope, bool):
            raise ValueError(f"selective rope must be true or false, got {rope!r}")
        if not rope and theta != 10000.0:
            raise ValueError(f"selective theta is RoPE's base: it needs rope = true, got theta = {theta!r} alone")
        self.rotary = RoPE(cfg, theta=theta) if rope else None  # checks theta and the head width

    def rotate(self, q: Tensor, k: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        return (q, k) if self.rotary is None else self.rotary.rotate(q, k, position_ids)

    def content_logits(self, q, k, x, layer):
        T = q.shape[-2]
        logits = (q @ k.transpose(-2, -1)).float() / math.sqrt(q.shape[-1])  # (B, H, T, T)
        logits = logits - forgetting(logits[:, 0])[:, None]  # head 0 selects for every head
        future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        return logits.masked_fill(future, float("-inf"))
