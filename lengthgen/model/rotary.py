"""Rotary position embeddings (Su et al.), the scheme `rope`: the rotation of queries and keys
that the schemes built on it (xPos, lengthgen.model.xpos) share, and its stretching at test time
(`stretched_rope`: lengthgen.model.rope_scaling)."""
from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import Tensor, nn

from lengthgen.config.schema import ModelConfig
from lengthgen.model.rope_scaling import rope_inv_freq, stretched
from lengthgen.model.scheme_base import PositionalScheme


def _rotate_half(x: Tensor) -> Tensor:
    x1, x2 = x.chunk(2, dim=-1)  # pairs are (x[i], x[i + Dh/2])
    return torch.cat((-x2, x1), dim=-1)


def _rotate_interleaved(x: Tensor) -> Tensor:
    x1, x2 = x[..., 0::2], x[..., 1::2]  # pairs are (x[2i], x[2i+1])
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


class RoPE(PositionalScheme):
    """Rotary embeddings (Su et al.): rotate each pair of q/k dimensions by
    angle pos * theta^(-2i/Dh), so q_i . k_j depends only on pos_i - pos_j.

    style "half" pairs dim i with i + Dh/2 (GPT-NeoX / Llama layout);
    "interleaved" pairs 2i with 2i+1 (the paper's and GPT-J's layout). Both are
    the same function up to a fixed permutation of the head dimensions.
    """

    @classmethod
    def check(cls, model: ModelConfig) -> None:
        super().check(model)
        if (model.d_model // model.n_head) % 2:
            raise ValueError(f"model.position {model.position} needs an even head width (d_model / n_head)")

    def __init__(self, cfg: ModelConfig, theta: float = 10000.0, style: str = "half"):
        super().__init__(cfg)
        if self.head_dim % 2:
            raise ValueError(f"rope needs an even head width, got d_model/n_head = {self.head_dim}")
        if style not in ("half", "interleaved"):
            raise ValueError(f"rope style must be half or interleaved, got {style!r}")
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < float("inf"):
            raise ValueError(f"rope theta must be a finite number > 0, got {theta!r}")
        self.style, self.theta = style, float(theta)
        self.register_buffer("inv_freq", rope_inv_freq(theta, self.head_dim), persistent=False)  # (Dh/2,)
        self.stretch: tuple[Tensor, float] | None = None  # (inv_freq, attention factor) set by `stretched_rope`

    def stretch_to(self, scaling: str, factor: float, original_length: int) -> None:
        """Read positions with `scaling` at `factor` (lengthgen.model.rope_scaling); `none` is as trained."""
        if scaling == "none":
            self.stretch = None
            return
        inv_freq, attention_factor = stretched(scaling, self.theta, self.head_dim, factor, original_length)
        self.stretch = inv_freq.to(self.inv_freq.device), attention_factor

    def cos_sin(self, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        # Computed from the IDs on every call (no arange cache): it is a
        # (B, T, Dh/2) outer product, cheap next to attention, and it is
        # correct for shifted, skipped or coupled IDs by construction.
        inv_freq, attention_factor = self.stretch if self.stretch is not None else (self.inv_freq, 1.0)
        angles = position_ids.float()[..., None] * inv_freq  # (B|1, T, Dh/2)
        if self.style == "half":
            angles = torch.cat((angles, angles), dim=-1)  # (B|1, T, Dh)
        else:
            angles = angles.repeat_interleave(2, dim=-1)  # (B|1, T, Dh)
        cos, sin = angles.cos(), angles.sin()
        if attention_factor != 1.0:  # YaRN's temperature, on q and k alike as transformers applies it
            cos, sin = cos * attention_factor, sin * attention_factor
        return cos[:, None], sin[:, None]  # (B|1, 1, T, Dh): broadcast over heads

    def rotate(self, q: Tensor, k: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self.cos_sin(position_ids)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        turn = _rotate_half if self.style == "half" else _rotate_interleaved
        return q * cos + turn(q) * sin, k * cos + turn(k) * sin  # (B, H, T, Dh) each


@contextmanager
def stretched_rope(model: nn.Module, scaling: str, factor: float, original_length: int):
    """Every RoPE module of `model` reads positions stretched by `scaling` at `factor` for the duration
    (evaluation only: training never enters this), and as before afterwards, even on an error."""
    modules = [m for m in model.modules() if isinstance(m, RoPE)]
    if scaling != "none" and not modules:
        raise ValueError(f"position.scaling {scaling} stretches rotary positions; this model has no RoPE")
    before = [m.stretch for m in modules]
    try:
        for m in modules:
            m.stretch_to(scaling, factor, original_length)
        yield model
    finally:
        for m, stretch in zip(modules, before):
            m.stretch = stretch
