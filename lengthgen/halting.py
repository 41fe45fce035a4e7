"""Per-sample stopping of a looped model, trained for it (not in the paper).

The paper's confidence rule reads an objective that never looks at the wrong
iterations: the step-dependent loss supervises each sample at its own T(n)
only, so a read-out before or after it may be as confident as the right one
(docs/looped.md, "Trained stopping"). Two designs add a loss on the states of
every iteration t <= T_i, which the prefix scheme computes anyway
(`looped._prefix_states`), so they cost a read-out per iteration, not more
block passes:

- `looped-halt`: a halting head, one linear unit on the state at every answer
  position; a sample's halting logit is its mean over the sample's scored
  positions. Trained with binary cross-entropy, "done" at t = T_i and "not
  done" at every t < T_i, the two classes weighted equally (there are
  T_i - 1 negatives for one positive). Read out by the `halt` rule: the first
  iteration whose logit is > 0 (lengthgen.stopping).
- `looped-uncertain`: no new weights. At every t < T_i the read-out is pushed
  towards the uniform distribution (cross-entropy against it, minus its floor
  log V, averaged over the scored tokens), so an unfinished computation is
  unconfident and a finished one confident. Read out by `first-confident`: the
  first iteration whose mean confidence loss is below log 2.

Both add `train.halt_loss_weight` times their loss to the answer loss; the
halting head's gradient reaches the block too, so the model can learn to
represent "done" (a head fitted afterwards on a frozen model's states did not
extrapolate, docs/results.md).
"""
from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import Packed
from .config import ModelConfig
from .looped import LoopedTransformer
from .positions import PositionalScheme
from .tasks import Batch


class HaltingLooped(LoopedTransformer):
    """A looped transformer with a halting head. The head is built after the
    rest of the model, so the other weights start as those of a plain looped
    model of the same seed."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, injection: bool = True,
                 scheme: PositionalScheme | None = None):
        super().__init__(cfg, vocab_size, injection, scheme)
        self.halt_head = nn.Linear(cfg.d_model, 1)

    def halt_logits(self, h: Tensor, scored: Tensor) -> Tensor:
        """(B, L, D) states, (B, L) bool -> (B,) each sample's halting logit: the mean of the
        head over its scored positions (> 0: done)."""
        z = self.halt_head(h)[..., 0].float()
        return (z * scored).sum(1) / scored.sum(1).clamp(min=1)


def _token_rows(batch: Batch, order: Tensor, layout: Packed) -> tuple[Tensor, Tensor]:
    """(scored (capacity,) bool, row (capacity,) long) of each packed token; padding rows
    past the last token are unscored and belong to a row index past the last row."""
    scored = layout.unpad(batch.scored[order, :layout.width, None].float())[:, 0] > 0
    widths = torch.tensor(layout.widths, device=scored.device)
    row = torch.repeat_interleave(torch.arange(layout.rows, device=scored.device), widths)
    row = F.pad(row, (0, layout.capacity - layout.tokens), value=layout.rows)
    return scored, row


def _row_ends(layout: Packed) -> list[int]:
    """ends[r]: one past the last token of row r - 1 (ends[0] = 0)."""
    return [0, *itertools.accumulate(layout.widths)]


def halt_loss(model: HaltingLooped, batch: Batch, every_step: list, order: Tensor, layout: Packed) -> Tensor:
    """Balanced binary cross-entropy of the halting logit: "done" at t = T_i, "not done" at t < T_i."""
    scored, row = _token_rows(batch, order, layout)
    ends = _row_ends(layout)
    sums = {True: [], False: []}  # per-row losses of the done and the not-done pairs
    for h, done, k in every_step:
        z = model.halt_head(h[:ends[k]])[:, 0].float()  # (tokens of rows 0..k-1,)
        s = scored[:ends[k]].float()
        r = row[:ends[k]]
        logit = z.new_zeros(k).index_add(0, r, z * s) / s.new_zeros(k).index_add(0, r, s).clamp(min=1)
        label = (torch.arange(k, device=z.device) >= done).float()
        loss = F.binary_cross_entropy_with_logits(logit, label, reduction="none")
        sums[True].append(loss[done:])
        sums[False].append(loss[:done])
    positive, negative = torch.cat(sums[True]), torch.cat(sums[False])
    total = positive.mean()
    if len(negative):
        total = total + negative.mean()
    return model.halt_loss_weight * total


def uncertain_loss(model: LoopedTransformer, batch: Batch, every_step: list, order: Tensor, layout: Packed) -> Tensor:
    """Mean over the scored tokens of every t < T_i of the cross-entropy of the read-out
    against the uniform distribution, minus its minimum log V (0 = uniform)."""
    scored, _ = _token_rows(batch, order, layout)
    ends = _row_ends(layout)
    total, count = 0.0, 0
    for h, done, _ in every_step:
        if done == 0:
            continue
        keep = scored[:ends[done]]  # tokens of rows that go on after this iteration
        z = model.read(h[:ends[done]][keep]).float()  # (n, V)
        total = total + (z.logsumexp(-1) - z.mean(-1)).sum() - math.log(z.shape[-1]) * len(z)
        count += len(z)
    if count == 0:  # every sample has T_i = 1: nothing before the right step
        return zero_loss(model)
    return model.halt_loss_weight * total / count


def zero_loss(model: nn.Module) -> Tensor:
    """A zero loss on the model's device that still reaches the graph."""
    return next(model.parameters()).sum() * 0.0
