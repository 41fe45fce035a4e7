"""Fourier Position Embedding (Hua et al., ICML 2025), the scheme `fope`: RoPE whose every rotary
dimension is a Fourier series over several frequencies, with the frequencies too low to complete
one period inside the training window clipped to zero.

For the query or key at position p, RoPE multiplies pair i by cos(p w_i) and sin(p w_i). FoPE keeps
the F frequencies w_D >= 2 pi / window ("the clipping floor"; the rest are zero frequencies:
cos 0 = 1, sin 0 = 0, so those pairs pass through unrotated) and gives each of its first `dims`
pairs d the series

    cos_d(p) = sum_D C_cos[h, D, d] cos(p w_D),   sin_d(p) = sum_D C_sin[h, D, d] sin(p w_D),

per head h, then rotates as RoPE's "half" layout does: q cos + rotate_half(q) sin. The coefficients
are fixed at initialisation, as in the paper's code: the identity (pair d keeps its own frequency)
plus Xavier-normal noise of gain `gain` (drawn from the option `seed`, not the model's seed), each
column divided by its sum so that the series starts
at 1 at p = 0. They are buffers saved with the weights, so a checkpoint reads the same positions.

Where this follows vLLM's FourierRotaryEmbedding (the formula the tests transcribe) rather than the
paper's appendix: the pairs past the Fourier ones get cos 1 and sin 0 (the appendix pads both with
1, a fixed 45-degree turn that vLLM's comment calls a bug), and the rotation adds the sine term
(the appendix subtracts it: the same family of maps with the angle's sign flipped)."""
from __future__ import annotations

import math

import torch
from torch import Tensor

from lengthgen.config.schema import ModelConfig
from lengthgen.model.rope_scaling import rope_inv_freq
from lengthgen.model.rotary import _rotate_half
from lengthgen.model.scheme_base import PositionalScheme


def kept_frequencies(theta: float, head_dim: int, window: int) -> Tensor:
    """RoPE's frequencies theta^(-2i/Dh) that complete a period within `window` positions (all of
    them with window 0): the clipping floor is 2 pi / window."""
    inv_freq = rope_inv_freq(theta, head_dim)  # decreasing: the kept ones are a prefix
    kept = len(inv_freq) if window == 0 else sum(float(theta) ** (-i / head_dim) >= 2 * math.pi / window
                                                  for i in range(0, head_dim, 2))  # counted in Python: meta tensors too
    return inv_freq[:kept]


def fourier_coefficients(heads: int, kept: int, dims: int, gain: float, generator=None) -> Tensor:
    """(heads, kept, dims): the identity (a strided one where dims < kept, as the paper's
    get_step_eye) plus Xavier-normal noise of `gain`, each column scaled to sum to 1."""
    fan_in, fan_out = kept * dims, heads * dims  # torch's Xavier fans of a (heads, kept, dims) tensor
    std = gain * math.sqrt(2.0 / (fan_in + fan_out))
    coef = torch.randn(heads, kept, dims, generator=generator) * std
    step = math.ceil(kept / dims)
    for d in range(dims):
        if d * step < kept:  # the paper's get_step_eye leaves a column without its own frequency here
            coef[:, d * step, d] += 1.0
    return coef / coef.sum(dim=-2, keepdim=True)


class FoPE(PositionalScheme):
    """`theta`: RoPE's base. `window`: the positions trained, whose too-low frequencies are clipped
    (0: model.max_positions; a run assembled from a preset gets the largest training position ID + 1
    unless the preset sets it: `window_option`). `dims`: pairs that become Fourier series (0: the paper's
    min(kept frequencies, Dh / 4)). `gain`: the coefficients' noise (0.3, the paper's). `seed`: the
    noise's own seed (0), apart from train.model_seed, so that seeds trained as one stacked model
    (whose steps carry each seed's parameters, not its buffers) read the same series as alone."""

    window_option = "window"  # a new run fills it from the task (lengthgen.assembly.runs._training_window_option)

    @classmethod
    def check(cls, model: ModelConfig) -> None:
        super().check(model)
        if (model.d_model // model.n_head) % 2:
            raise ValueError(f"model.position {model.position} needs an even head width (d_model / n_head)")

    def __init__(self, cfg: ModelConfig, theta: float = 10000.0, window: int = 0, dims: int = 0, gain: float = 0.3,
                 seed: int = 0):
        super().__init__(cfg)
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < float("inf"):
            raise ValueError(f"fope theta must be a finite number > 0, got {theta!r}")
        for key, value in (("window", window), ("dims", dims)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"fope {key} must be an integer >= 0, got {value!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"fope seed must be an integer, got {seed!r}")
        if isinstance(gain, bool) or not isinstance(gain, (int, float)) or not 0 <= gain < float("inf"):
            raise ValueError(f"fope gain must be a finite number >= 0, got {gain!r}")
        if self.head_dim % 2:
            raise ValueError(f"fope needs an even head width, got d_model/n_head = {self.head_dim}")
        self.window = window or cfg.max_positions
        freqs = kept_frequencies(theta, self.head_dim, self.window)
        if len(freqs) == 0:
            raise ValueError(f"fope window {self.window} clips every frequency of theta {theta}; raise the window")
        pairs = self.head_dim // 2
        self.dims = dims or min(len(freqs), max(1, self.head_dim // 4))
        if self.dims > min(pairs, len(freqs)):
            raise ValueError(f"fope dims must be at most the {len(freqs)} frequencies kept under window "
                             f"{self.window} (and the head's {pairs} rotary pairs), got {dims}")
        self.register_buffer("inv_freq", freqs, persistent=False)  # (F,)
        draw = torch.Generator().manual_seed(seed)  # not the model's seed: stacked seeds share one buffer
        self.register_buffer("cos_coef", fourier_coefficients(cfg.n_head, len(freqs), self.dims, gain, draw))
        self.register_buffer("sin_coef", fourier_coefficients(cfg.n_head, len(freqs), self.dims, gain, draw))

    def cos_sin(self, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        """(B|1, T) IDs -> cos, sin (B|1, H, T, Dh) in float32, each pair's series, laid out as RoPE's halves."""
        angles = position_ids.float()[..., None] * self.inv_freq  # (B|1, T, F)
        cos = torch.einsum("btf,hfd->bhtd", angles.cos(), self.cos_coef)  # (B|1, H, T, dims)
        sin = torch.einsum("btf,hfd->bhtd", angles.sin(), self.sin_coef)
        rest = self.head_dim // 2 - self.dims  # zero-frequency pairs: unrotated
        cos = torch.nn.functional.pad(cos, (0, rest), value=1.0)
        sin = torch.nn.functional.pad(sin, (0, rest), value=0.0)
        return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)

    def rotate(self, q: Tensor, k: Tensor, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        cos, sin = self.cos_sin(position_ids)
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin  # (B, H, T, Dh) each
