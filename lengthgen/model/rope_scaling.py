"""RoPE stretched at test time: the frequencies a model trained on short sequences is read with on
longer ones, as pure functions of the trained RoPE (theta, head width) and a factor s >= 1.

Each returns (inv_freq (Dh/2,), attention_factor); the rotation angle of pair i at position p is
p * inv_freq[i], and cos and sin are multiplied by attention_factor (so every query-key logit by
its square), as Hugging Face transformers applies it.

- `pi`   position interpolation (Chen et al., 2023): positions divided by s, i.e. inv_freq / s.
- `ntk`  NTK-aware scaling: the base theta multiplied by s^(Dh / (Dh - 2)), so the lowest frequency
         is divided by exactly s and the highest is unchanged.
- `yarn` YaRN (Peng et al., 2023): pairs whose wavelength fits beta_fast or more times in the
         training length keep their frequency, those that fit fewer than beta_slow times are
         interpolated (/ s), a linear ramp over the pair index between; attention factor
         0.1 ln(s) + 1. The ramp's ends are floored / ceiled to whole pairs (`truncate`), as the
         YaRN reference code and transformers do (the paper writes the ramp linear in the number
         of rotations; the code, followed here, is linear in the pair index between those ends).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

AS_TRAINED = "none"  # the scaling that leaves RoPE as trained (every scheme accepts it)
SCALINGS = (AS_TRAINED, "pi", "ntk", "yarn")


def rope_inv_freq(theta: float, head_dim: int) -> Tensor:
    """theta^(-2i/Dh) for the Dh/2 pairs, float32: the frequencies RoPE trains with."""
    return float(theta) ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)


def position_interpolation(theta: float, head_dim: int, factor: float, original_length: int) -> tuple[Tensor, float]:
    """Positions divided by `factor`: angle(p * s) afterwards = angle(p) before."""
    return rope_inv_freq(theta, head_dim) / factor, 1.0


def ntk_aware(theta: float, head_dim: int, factor: float, original_length: int) -> tuple[Tensor, float]:
    """The base theta * s^(Dh / (Dh - 2)): high frequencies (local order) kept, the lowest one / s."""
    return rope_inv_freq(theta * factor ** (head_dim / (head_dim - 2)), head_dim), 1.0


def yarn_attention_factor(factor: float) -> float:
    """YaRN's sqrt(1/t) = 0.1 ln(s) + 1 (1 where s <= 1), applied to both cos and sin."""
    return 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0


def yarn_ramp_ends(theta: float, head_dim: int, original_length: int, beta_fast: float = 32.0,
                   beta_slow: float = 1.0, truncate: bool = True) -> tuple[float, float]:
    """(low, high) pair indices: pair i makes L / wavelength_i = L * theta^(-2i/Dh) / 2 pi rotations over
    the training length L, so r rotations fall at i = Dh ln(L / (2 pi r)) / (2 ln theta)."""
    def pair_of(rotations: float) -> float:
        return head_dim * math.log(original_length / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = pair_of(beta_fast), pair_of(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, head_dim - 1)


def yarn(theta: float, head_dim: int, factor: float, original_length: int, beta_fast: float = 32.0,
         beta_slow: float = 1.0, truncate: bool = True) -> tuple[Tensor, float]:
    """Per-pair blend of the trained (extrapolated) and interpolated frequencies, and the attention factor."""
    low, high = yarn_ramp_ends(theta, head_dim, original_length, beta_fast, beta_slow, truncate)
    high = high + 0.001 if low == high else high  # one-pair ramp: avoid dividing by zero, as the reference does
    interpolated = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    trained = rope_inv_freq(theta, head_dim)
    inv_freq = trained / factor * interpolated + trained * (1 - interpolated)
    return inv_freq, yarn_attention_factor(factor)


STRETCHES = {"pi": position_interpolation, "ntk": ntk_aware, "yarn": yarn}


def stretched(scaling: str, theta: float, head_dim: int, factor: float, original_length: int) -> tuple[Tensor, float]:
    """(inv_freq, attention_factor) of `scaling` at `factor`; `none`, or a factor of 1 (a test sequence
    no longer than training), is RoPE as trained, bit for bit."""
    if scaling not in SCALINGS:
        raise ValueError(f"position.scaling must be one of {', '.join(SCALINGS)}, got {scaling!r}")
    if scaling == "none" or factor == 1:
        return rope_inv_freq(theta, head_dim), 1.0
    return STRETCHES[scaling](theta, head_dim, factor, original_length)


def dynamic_factor(test_length: int, train_length: int) -> float:
    """s = max(1, test sequence length / longest training sequence length)."""
    return max(1.0, test_length / train_length)
