"""Per-sample stopping of a looped model, trained for it (not in the paper).

The paper's confidence rule reads an objective that never looks at the wrong
iterations: the step-dependent loss supervises each sample at its own T(n)
only, so a read-out before or after it may be as confident as the right one
(docs/looped.md, "Trained stopping"). Three designs add a loss on the states of
every iteration t <= T_i, which the prefix scheme computes anyway
(`looped._prefix_states`), so they cost a read-out per iteration, not more
block passes:

- `looped-halt`: a halting head, one linear unit on the state at every answer
  position; a sample's halting logit is its mean over the sample's scored
  positions. Trained with binary cross-entropy, "done" at t = T_i and "not
  done" at every t < T_i, the two classes weighted equally (there are
  T_i - 1 negatives for one positive). Read out by the `halt` rule: the first
  iteration whose logit is > 0 (lengthgen.methods.looped.stop_rules).
- `looped-uncertain`: no new weights. At every t < T_i the read-out is pushed
  towards the uniform distribution (cross-entropy against it, minus its floor
  log V, averaged over the scored tokens), so an unfinished computation is
  unconfident and a finished one confident. Read out by `first-confident`: the
  first iteration whose mean confidence loss is below log 2.

- `looped-clock`: a clock, two linear units per answer position (averaged over
  them), trained by squared error towards (cos, sin) of the phase pi t / T_i at
  every t <= T_i: progress as a fraction of the sample's own computation, the
  same target at every length, where "done" / "not done" label a step count.
  Read out by `halt` through `clock_logit`.

The methods add `train.halt_loss_weight` times these losses to the answer loss;
the gradient reaches the block too, so the model can learn to represent "done".

- `looped-halt-probe`: the block trains as plain `looped` (bit for bit: the
  head has no loss during training), and a halting probe is fitted once
  training ends, on the frozen model's states (`fit_halt_probe`): an MLP on the
  mean state over the answer and over the question, "done" at every t >= T_i.
  The model keeps its oracle accuracy by construction; the probe finds
  whatever "done" the states already hold.
"""
from __future__ import annotations

import itertools
import math
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lengthgen.config.schema import ModelConfig
from lengthgen.methods.looped.block import LoopedTransformer, per_sample_steps
from lengthgen.methods.looped.stop_passes import start_blanked
from lengthgen.model.attention import Packed
from lengthgen.model.positions import PositionalScheme
from lengthgen.tasks import Batch


class HaltingLooped(LoopedTransformer):
    """A looped transformer with a halting head (`head`: LinearHalt for `looped-halt`, HaltProbe
    for `looped-halt-probe`, Clock for `looped-clock`). The head is built after the rest of the
    model, so the other weights start as those of a plain looped model of the same seed."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, injection: bool = True,
                 scheme: PositionalScheme | None = None, head: type | None = None):
        super().__init__(cfg, vocab_size, injection, scheme)
        self.halt_head = (head or LinearHalt)(cfg.d_model)

    def halt_logits(self, h: Tensor, scored: Tensor, t: int) -> Tensor:
        """(B, L, D) states after iteration t, (B, L) bool -> (B,) each sample's halting logit (> 0: done)."""
        return self.halt_head.logit(h, scored, t)


class LinearHalt(nn.Linear):
    """One linear unit per answer position, its mean over the scored positions the logit."""

    def __init__(self, d_model: int):
        super().__init__(d_model, 1)

    def logit(self, h: Tensor, scored: Tensor, t: int) -> Tensor:
        return masked_mean(self(h).float(), scored)[:, 0]


class Clock(nn.Linear):
    """Two linear units per answer position reading the phase pi t / T(n) as (cos, sin); the logit
    is the reading of their mean at t (`clock_logit`)."""

    def __init__(self, d_model: int):
        super().__init__(d_model, 2)

    def logit(self, h: Tensor, scored: Tensor, t: int) -> Tensor:
        return clock_logit(masked_mean(self(h).float(), scored), t)


def masked_mean(z: Tensor, mask: Tensor) -> Tensor:
    """(B, L, C), (B, L) bool -> (B, C): the mean over each sample's masked positions."""
    return (z * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp(min=1)


def clock_phase(z: Tensor) -> Tensor:
    """(..., 2) clock read-out (cos, sin) -> its angle in [-pi/2, 3pi/2): a phase near 0
    (early) or near pi (done) never wraps."""
    angle = torch.atan2(z[..., 1], z[..., 0])
    return torch.where(angle < -math.pi / 2, angle + 2 * math.pi, angle)


def clock_logit(z: Tensor, t: int) -> Tensor:
    """(B, 2) clock read-out after iteration t -> (B,) > 0 once t has reached the T the clock
    implies. The clock is trained to read the phase pi t / T; its progress p = phase / pi
    gives T' = t / p, and the sample is done once t >= T' - 1/2, i.e. p >= 2t / (2t + 1):
    at t = T - 1 and t = T the margins are about half a step (1 / 2T) either side."""
    return clock_phase(z) / math.pi - 2 * t / (2 * t + 1)


class HaltProbe(nn.Module):
    """An MLP (one hidden layer of 128) on pooled states (2D,), standardised by the
    statistics of the states it was fitted on."""

    def __init__(self, d_model: int, hidden: int = 128):
        super().__init__()
        self.register_buffer("mean", torch.zeros(2 * d_model))
        self.register_buffer("std", torch.ones(2 * d_model))
        self.net = nn.Sequential(nn.Linear(2 * d_model, hidden), nn.GELU(), nn.Linear(hidden, 1))

    def forward(self, x: Tensor) -> Tensor:  # (..., 2D) -> (...,)
        return self.net((x.float() - self.mean) / self.std)[..., 0]

    def logit(self, h: Tensor, scored: Tensor, t: int) -> Tensor:
        """The probe on each sample's pooled states."""
        return self(pooled_states(h, scored)).float()


def pooled_states(h: Tensor, scored: Tensor) -> Tensor:
    """(B, L, D), (B, L) bool -> (B, 2D): the mean state over the answer (scored positions)
    and over the question up to and including its '=', the first scored position. The '='
    matters: with NoPE every token of "000" has the state of "0", and only the '=' state,
    weighted 1/(n + 1) in the mean, makes the question's mean depend on its length."""
    L = scored.shape[1]
    first = torch.where(scored.any(1), scored.float().argmax(1), L)
    question = torch.arange(L, device=scored.device)[None] <= first[:, None]
    return torch.cat([masked_mean(h, m) for m in (scored, question)], -1)


PROBE_EXTRA = 4  # iterations past T(n) in the probe's data: "done" must hold after the right step too


@torch.no_grad()
def probe_data(model: LoopedTransformer, batch: Batch, extra: int = PROBE_EXTRA) -> tuple[Tensor, Tensor]:
    """(T, B, 2D) pooled states after iterations 1 .. max T_i + extra, and (T, B) bool: t >= T_i."""
    (h, e, pos), w = start_blanked(model, batch)
    scored, steps, feats = batch.scored[:, :w], per_sample_steps(batch), []
    for _ in range(int(steps.max()) + extra):
        h = model.step(h, e, pos)
        feats.append(pooled_states(h, scored).float())
    t = torch.arange(1, len(feats) + 1, device=steps.device)[:, None]
    return torch.stack(feats), t >= steps[None]


PROBE_SAMPLES = 256  # samples per training length the probe is fitted on


def fit_probe_on_lengths(model: LoopedTransformer, task, lengths: range, device: torch.device,
                         steps: int = 1000) -> HaltProbe:
    """fit_halt_probe on PROBE_SAMPLES fresh samples of each length (seeded by the length:
    not the test seed's samples)."""
    return fit_halt_probe(model, [task.sample(PROBE_SAMPLES, n, torch.Generator().manual_seed(n)).to(device)
                                  for n in lengths], steps)


def fit_halt_probe(model: LoopedTransformer, batches: Iterable[Batch], steps: int = 1000, lr: float = 1e-2,
                   seed: int = 0) -> HaltProbe:
    """A HaltProbe fitted on a frozen model's states: full-batch Adam on the balanced binary
    cross-entropy of "done" (t >= T_i) over every iteration up to T_i + PROBE_EXTRA of the
    samples given (the training lengths). A sample drawn k times is run once and weighs k:
    the same loss, and at short lengths (Parity has 2^n inputs of length n) far fewer rows."""
    xs, ys, ws = [], [], []
    for batch in batches:
        distinct, counts = distinct_samples(batch)
        x, done = probe_data(model, distinct)
        xs.append(x.flatten(0, 1))
        ys.append(done.flatten())
        ws.append(counts.expand_as(done).flatten())
    x, w = torch.cat(xs), torch.cat(ws)
    with torch.random.fork_rng(devices=[]):  # the caller's random stream is left as it was
        torch.manual_seed(seed)
        probe = HaltProbe(x.shape[1] // 2).to(x.device)
    mean = (w[:, None] * x).sum(0) / w.sum()
    probe.mean.copy_(mean)
    probe.std.copy_(((w[:, None] * (x - mean) ** 2).sum(0) / (w.sum() - 1)).sqrt() + 1e-6)
    train_probe(lambda: [probe(x)], [torch.cat(ys)], probe.parameters(), steps, lr, [w])
    return probe.requires_grad_(False)


def distinct_samples(batch: Batch) -> tuple[Batch, Tensor]:
    """(the batch's distinct samples in the order first drawn, (B',) float how many times each was drawn)."""
    parts = [batch.inputs, batch.targets] + [p for p in (batch.position_ids, batch.target_ids) if p is not None]
    _, inverse, counts = torch.unique(torch.cat(parts, 1), dim=0, return_inverse=True, return_counts=True)
    rows = torch.arange(len(batch), device=inverse.device)
    first = torch.full_like(counts, len(batch)).scatter_reduce(0, inverse, rows, "amin")
    first, order = first.sort()  # in the order they were first drawn: a batch of distinct samples stays as it is
    return batch.select(first), counts[order].float()


def train_probe(logits, labels: list[Tensor], params, steps: int = 1000, lr: float = 1e-2,
                weights: list[Tensor] | None = None) -> None:
    """Full-batch Adam on the balanced binary cross-entropy of `logits()` (a list of tensors,
    one per group of samples) against `labels` (bool, the same shapes), each sample weighing
    its `weights` (default 1): "done" and "not done" weigh the same however many of each."""
    y = torch.cat([a.flatten() for a in labels]).float()
    w = torch.ones_like(y) if weights is None else torch.cat([a.flatten() for a in weights]).float()
    pos_weight = (w * (1 - y)).sum() / (w * y).sum().clamp(min=1)
    optimizer = torch.optim.Adam(params, lr)
    with torch.enable_grad():
        for _ in range(steps):
            z = torch.cat([a.flatten() for a in logits()])
            loss = F.binary_cross_entropy_with_logits(z, y, w, pos_weight=pos_weight, reduction="sum") / w.sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()


def _token_rows(batch: Batch, order: Tensor, layout: Packed) -> tuple[Tensor, Tensor]:
    """(scored (capacity,) bool, row (capacity,) long) of each packed token; padding rows
    past the last token are unscored and belong to a row index past the last row."""
    scored = layout.unpad(batch.scored[order, :layout.width, None].float())[:, 0] > 0
    widths = torch.tensor(layout.widths, device=scored.device)
    row = torch.repeat_interleave(torch.arange(layout.rows, device=scored.device), widths)
    row = F.pad(row, (0, layout.capacity - layout.tokens), value=layout.rows)
    return scored, row


def packed_row_mean(z: Tensor, scored: Tensor, row: Tensor, k: int) -> Tensor:
    """(N, C) per-token head outputs of packed rows 0..k-1, their scored (N,) and row (N,) ->
    (k, C): each row's mean over its scored tokens (masked_mean for packed rows)."""
    s = scored.float()[:, None]
    return z.new_zeros(k, z.shape[1]).index_add(0, row, z * s) / s.new_zeros(k, 1).index_add(0, row, s).clamp(min=1)


def _row_ends(layout: Packed) -> list[int]:
    """ends[r]: one past the last token of row r - 1 (ends[0] = 0)."""
    return [0, *itertools.accumulate(layout.widths)]


def halt_loss(model: HaltingLooped, batch: Batch, every_step: list, order: Tensor, layout: Packed) -> Tensor:
    """Balanced binary cross-entropy of the halting logit: "done" at t = T_i, "not done" at t < T_i."""
    scored, row = _token_rows(batch, order, layout)
    ends = _row_ends(layout)
    sums = {True: [], False: []}  # per-row losses of the done and the not-done pairs
    for h, done, k in every_step:
        z = model.halt_head(h[:ends[k]]).float()  # (tokens of rows 0..k-1, 1)
        logit = packed_row_mean(z, scored[:ends[k]], row[:ends[k]], k)[:, 0]
        label = (torch.arange(k, device=z.device) >= done).float()
        loss = F.binary_cross_entropy_with_logits(logit, label, reduction="none")
        sums[True].append(loss[done:])
        sums[False].append(loss[:done])
    positive, negative = torch.cat(sums[True]), torch.cat(sums[False])
    total = positive.mean()
    if len(negative):
        total = total + negative.mean()
    return total


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
    return total / count


def clock_loss(model: HaltingLooped, batch: Batch, every_step: list, order: Tensor, layout: Packed) -> Tensor:
    """Squared error of the clock (two units, averaged over each sample's scored positions)
    against (cos, sin) of the phase pi t / T_i, at every iteration t <= T_i, averaged over
    the (sample, t) pairs: the phase is a fraction of the sample's own computation, the
    same at every length, where "done" and "not done" label a step count."""
    scored, row = _token_rows(batch, order, layout)
    ends = _row_ends(layout)
    steps = per_sample_steps(batch)[order].float()
    total, count = 0.0, 0
    for t, (h, _, k) in enumerate(every_step, start=1):
        mean = packed_row_mean(model.halt_head(h[:ends[k]]).float(), scored[:ends[k]], row[:ends[k]], k)  # (k, 2)
        phase = math.pi * t / steps[:k]
        total = total + (mean - torch.stack([phase.cos(), phase.sin()], -1)).pow(2).sum()
        count += k
    return total / count


def zero_loss(model: nn.Module) -> Tensor:
    """A zero loss on the model's device that still reaches the graph."""
    return next(model.parameters()).sum() * 0.0
