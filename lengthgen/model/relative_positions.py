"""Transformer-XL relative positions (Dai et al., ACL 2019), as Delétang et al.'s and Ruoss et al.'s
encoders compute them (`compute_attention_with_relative_encodings` in their positional_encodings.py).

Per layer, with learned per-head vectors u, v (H, Dh) and a bias-free linear map W_r (D -> D):

    logit_ij = [ (q_i + u) . k_j  +  (q_i + v) . (W_r R(p_j - p_i))_h ] / sqrt(Dh)

where R(d) = [sin(d w_0..w_{D/2-1}), cos(d w_0..)] is the sinusoid of the *relative* position, with
its sin and cos halves side by side and w_k = max_time^(-2k/D), as their `sinusoid_position_encoding`
lays it out. Their code builds R for every distance -T..T-1 and aligns it by the Transformer-XL
"shift" trick, which assumes positions 0..T-1. Here positions are the IDs given (randomized,
shifted or coupled ones too), so the relative term is computed exactly for any IDs by the angle
difference identities: with g = W_r,h^T (q_i + v) split into its sin and cos halves g_s, g_c,

    g . R(p_j - p_i) = Q_i . K_j,  Q_i = [g_s cos(p_i w) + g_c sin(p_i w), -g_s sin(p_i w) + g_c cos(p_i w)],
                                   K_j = [sin(p_j w), cos(p_j w)],

one (B, H, T, D) x (B, 1, D, T) matmul, the same for every ID layout (tests/model/test_relative_positions.py
checks it against R(p_j - p_i) built pair by pair). The trigonometry runs in float64.

Causal (model.causal = true) masks the future keys; bidirectional uses both sides of R, as their
encoder does (causal = False there). One difference of sign convention: their causal variant reads
R(i - j) from a one-sided table, here R(p_j - p_i) always; R(-d) is R(d) with its sin half negated, a
fixed linear map that W_r absorbs. Init: u, v ~ N(0, 0.02^2) as theirs; W_r torch's Linear default
(theirs: Haiku's truncated normal of std fan_in^-1/2, about the same scale).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
from torch import Tensor

from lengthgen.config.schema import ModelConfig
from lengthgen.model.scheme_base import PositionalScheme


def relative_sinusoid(distance: Tensor, dim: int, max_time: float = 10000.0) -> Tensor:
    """R(d) for distances (...) -> (..., dim): [sin(d w), cos(d w)], w_k = max_time^(-2k/dim)."""
    inv = max_time ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=distance.device) / dim)  # (dim/2,)
    angles = distance.double()[..., None] * inv
    return torch.cat([angles.sin(), angles.cos()], -1)


class RelativePositions(PositionalScheme):
    """Transformer-XL relative attention logits (see the module docstring). `max_time`: the
    sinusoid's longest wavelength scale (their `max_time`, 10,000)."""

    has_content = True
    content_reads_ids = True  # content_logits takes the position IDs (attention passes them)

    @classmethod
    def check(cls, model: ModelConfig) -> None:
        super().check(model)
        if model.d_model % 2:
            raise ValueError(f"model.position {model.position} needs an even model.d_model (sin and cos halves)")

    def __init__(self, cfg: ModelConfig, max_time: float = 10000.0):
        super().__init__(cfg)
        if isinstance(max_time, bool) or not isinstance(max_time, (int, float)) or not 1 < max_time < math.inf:
            raise ValueError(f"relative max_time must be a finite number > 1, got {max_time!r}")
        if cfg.d_model % 2:
            raise ValueError(f"relative needs an even d_model, got {cfg.d_model}")
        self.max_time = float(max_time)
        H, Dh = self.n_head, self.head_dim
        self.relative_keys = nn.ModuleList(nn.Linear(cfg.d_model, cfg.d_model, bias=False) for _ in range(cfg.n_layer))
        self.content_bias = nn.Parameter(torch.randn(cfg.n_layer, H, Dh) * 0.02)  # u, per layer
        self.position_bias = nn.Parameter(torch.randn(cfg.n_layer, H, Dh) * 0.02)  # v, per layer

    def relative_logits(self, q: Tensor, position_ids: Tensor, layer: int) -> Tensor:
        """(q_i + v) . (W_r R(p_j - p_i)) per head: q (B, H, T, Dh), IDs (B|1, T) -> (B, H, T, T), unscaled.
        IDs shared by the batch with few distinct distances (0..T-1: 2T - 1 of them) take `by_distance`,
        H times cheaper than the identity's (B, H, T, D) x (D, T) matmul."""
        if position_ids.shape[0] == 1:
            distance = position_ids[0][None, :] - position_ids[0][:, None]  # (T, T): p_j - p_i
            values, index = torch.unique(distance, return_inverse=True)
            if len(values) <= 2 * q.shape[-2]:
                return self.by_distance(q, values, index, layer)
        H, Dh, D = self.n_head, self.head_dim, self.d_model
        weight = self.relative_keys[layer].weight.view(H, Dh, D)  # (H, Dh, D): head h's rows of W_r
        g = torch.einsum("bhtd,hdD->bhtD", q + self.position_bias[layer][None, :, None, :], weight)  # (B, H, T, D)
        g_sin, g_cos = g.split(D // 2, dim=-1)  # (B, H, T, D/2) each
        inv = self.max_time ** (-torch.arange(0, D, 2, dtype=torch.float64, device=q.device) / D)
        angles = position_ids.double()[..., None] * inv  # (B|1, T, D/2)
        sin, cos = angles.sin().to(q.dtype)[:, None], angles.cos().to(q.dtype)[:, None]  # (B|1, 1, T, D/2)
        query = torch.cat([g_sin * cos + g_cos * sin, g_cos * cos - g_sin * sin], -1)  # (B, H, T, D)
        key = torch.cat([sin, cos], -1)  # (B|1, 1, T, D)
        return query @ key.transpose(-2, -1)  # (B, H, T, T)

    def by_distance(self, q: Tensor, values: Tensor, index: Tensor, layer: int) -> Tensor:
        """The relative logits from the U distinct distances `values` (U,) and each pair's `index` (T, T)
        into them: W_r R(d) per distance (U, H, Dh), then one (B, H, T, Dh) x (Dh, U) matmul and a gather."""
        B, H, T, Dh = q.shape
        keys = self.relative_keys[layer](relative_sinusoid(values, self.d_model, self.max_time).to(q.dtype))  # (U, D)
        keys = keys.view(-1, H, Dh).transpose(0, 1)  # (H, U, Dh)
        per_distance = (q + self.position_bias[layer][None, :, None, :]) @ keys.transpose(-2, -1)[None]  # (B, H, T, U)
        return per_distance.gather(-1, index[None, None].expand(B, H, T, T))

    def content_logits(self, q: Tensor, k: Tensor, x: Tensor, layer: int, position_ids: Tensor | None = None) -> Tensor:
        if position_ids is None:
            position_ids = torch.arange(q.shape[-2], device=q.device)[None, :]
        content = (q + self.content_bias[layer][None, :, None, :]) @ k.transpose(-2, -1)  # (B, H, T, T)
        logits = (content + self.relative_logits(q, position_ids, layer)).float() * self.head_dim ** -0.5
        if self.causal:
            T = q.shape[-2]
            logits = logits.masked_fill(torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        return logits
