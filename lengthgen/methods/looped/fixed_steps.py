"""The trained stops' losses on every iteration, at fixed shapes: what a captured step records
(lengthgen.accel.captured) for `looped-halt`, `looped-clock` and `looped-uncertain`.

The packed losses (lengthgen.methods.looped.halting) follow the prefix scheme: at iteration t
only the rows still running are computed, and which rows those are is read on the host. Here
every row runs every iteration on states (B, W, D), and masks say which (sample, t) pairs count:
the same pairs, the same means, so the same values to float rounding
(tests/accel/test_captured.py walks every capturable method). Iterations past a sample's
T_i, which a bucket's loop count adds, count for nothing.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from lengthgen.methods.looped.block import LoopedTransformer, per_sample_steps
from lengthgen.tasks import Batch


def row_mean(z: Tensor, scored: Tensor) -> Tensor:
    """(B, W, C) per-token outputs, (B, W) scored -> (B, C): each row's mean over its scored tokens."""
    weights = scored.to(z.dtype)[..., None]
    return (z * weights).sum(1) / weights.sum(1).clamp(min=1)


def halt_loss(model, batch: Batch, states: list[Tensor]) -> Tensor:
    """Balanced binary cross-entropy of the halting logit, "done" at t = T_i, "not done" at t < T_i
    (halting.halt_loss): the mean over the done pairs (one a sample) plus the mean over the others."""
    steps, scored = per_sample_steps(batch), batch.scored
    done = not_done = count = 0.0
    for t, h in enumerate(states, start=1):
        logit = row_mean(model.halt_head(h).float(), scored)[:, 0]
        loss = F.binary_cross_entropy_with_logits(logit, (steps == t).float(), reduction="none")
        done = done + (loss * (steps == t)).sum()
        not_done = not_done + (loss * (steps > t)).sum()
        count = count + (steps > t).sum()
    count = torch.as_tensor(count, device=steps.device)
    return done / len(steps) + torch.where(count > 0, not_done / count.clamp(min=1), 0.0)


def uncertain_loss(model: LoopedTransformer, batch: Batch, states: list[Tensor]) -> Tensor:
    """Cross-entropy of the read-out against the uniform distribution, minus log V, over the
    scored tokens of every t < T_i (halting.uncertain_loss); 0 where every T_i is 1."""
    steps, scored = per_sample_steps(batch), batch.scored
    total = count = 0.0
    for t, h in enumerate(states, start=1):
        z = model.read(h).float()  # (B, W, V)
        keep = (scored & (steps > t)[:, None]).to(z.dtype)
        total = total + ((z.logsumexp(-1) - z.mean(-1) - math.log(z.shape[-1])) * keep).sum()
        count = count + keep.sum()
    return torch.where(count > 0, total / count.clamp(min=1), total * 0.0)


def clock_loss(model, batch: Batch, states: list[Tensor]) -> Tensor:
    """Squared error of the clock against (cos, sin) of pi t / T_i at every t <= T_i, averaged
    over the (sample, t) pairs (halting.clock_loss)."""
    steps, scored = per_sample_steps(batch), batch.scored
    total = count = 0.0
    for t, h in enumerate(states, start=1):
        mean = row_mean(model.halt_head(h).float(), scored)  # (B, 2)
        phase = math.pi * t / steps.float()
        running = (steps >= t).float()
        total = total + ((mean - torch.stack([phase.cos(), phase.sin()], -1)).pow(2).sum(-1) * running).sum()
        count = count + running.sum()
    return total / count
