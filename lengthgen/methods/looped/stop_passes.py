"""The passes of a looped model's stop rules, and the per-step record (lengthgen.methods.looped.stop_rules
holds the rules that call them).

Every pass reads `batch.blank_answers()` and returns (pred (B, L) argmax ids, steps (B,)
long: the iteration each sample was read out at). Only the scored positions of `pred`
count (as for `Method.predict`); the answer region is known from the batch in evaluation.
The model only needs the state API of LoopedTransformer: start / step / read (and
`halt_logits` for the halting rule).

Confidence loss of a step t: -log max softmax of the step-t logits, i.e. the
cross-entropy against their own argmax, averaged over answer (scored) positions.
Ties pick the earliest step (strict improvement only), like argmin.
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from lengthgen.methods.looped.block import oracle_logits, per_sample_steps, scored_width, take_rows
from lengthgen.tasks import Batch, Task, score


def confidence_dtype(device: torch.device) -> torch.dtype:
    """float64, except on MPS, which has none: float32 there, exact to a lead of ~87 nats."""
    return torch.float32 if device.type == "mps" else torch.float64


_PRECISION = contextvars.ContextVar("confidence_precision", default="float64")


@contextlib.contextmanager
def confidence_precision(name: str):
    """Confidence losses inside the block computed in `name` (eval.confidence_precision):
    "float64", lengthgen's, or "float32", the released code's cross-entropy of the logits
    against their argmax (`nn.CrossEntropyLoss` in float32), which rounds a sure read-out's
    loss to exactly 0."""
    token = _PRECISION.set(name)
    try:
        yield
    finally:
        _PRECISION.reset(token)


def token_confidence(logits: Tensor) -> Tensor:
    """(B, L, V) -> (B, L) in confidence_dtype: -log max softmax, >= 0 (0 = certain).

    Computed as log1p(sum over the other tokens of exp(logit - max)), in float64.
    A float32 log_softmax rounds the loss to exactly 0 once the argmax leads by
    about 17 nats: a well-trained model then ties at 0 on several iterations,
    and the argmin takes the earliest of them, right or not. This form stays
    exact until the lead passes about 700 nats. Non-finite logits (a broken
    model) give +inf, the least confident value, so every rule and `readout`
    treat them alike. Under confidence_precision("float32"): the released float32 values
    (held in confidence_dtype, which represents them exactly)."""
    if _PRECISION.get() == "float32":
        x = logits.float()
        loss = -x.log_softmax(-1).gather(-1, x.argmax(-1, keepdim=True))[..., 0]
        return loss.nan_to_num(nan=math.inf).to(confidence_dtype(logits.device))
    x = logits.to(confidence_dtype(logits.device))
    top = x.max(-1, keepdim=True)
    rest = (x - top.values).exp().scatter(-1, top.indices, 0.0)  # the argmax's own term removed
    return torch.log1p(rest.sum(-1)).nan_to_num(nan=math.inf)


def _confidences(logits: Tensor, scored: Tensor) -> tuple[Tensor, float]:
    """(per-sample mean confidence loss (B,), the batch's mean over all its scored
    positions). One function, so the rules and `trace` compare identical numbers."""
    sums = (token_confidence(logits) * scored).sum(1)
    counts = scored.sum(1)
    return sums / counts.clamp(min=1), float(sums.sum() / counts.sum())


def start_blanked(model, batch: Batch):
    """h_0, e, pos of the blanked batch trimmed to its widest scored region."""
    w = int(scored_width(batch).max())
    pos = batch.position_ids[:, :w] if batch.position_ids is not None else None
    return model.start(batch.blank_answers().inputs[:, :w], pos), w


def _full(pred: Tensor, L: int) -> Tensor:
    return torch.nn.functional.pad(pred, (0, L - pred.shape[1]))  # (B, L)


@torch.no_grad()
def oracle(model, batch: Batch) -> tuple[Tensor, Tensor]:
    """Each sample read out at its own T(n)."""
    return oracle_logits(model, batch).argmax(-1), per_sample_steps(batch)


@torch.no_grad()
def fixed(model, batch: Batch, n: int) -> tuple[Tensor, Tensor]:
    """Every sample read out after exactly n iterations."""
    (h, e, pos), _ = start_blanked(model, batch)
    for _ in range(n):
        h = model.step(h, e, pos)
    pred = _full(model.read(h).argmax(-1), batch.inputs.shape[1])
    return pred, torch.full((len(batch),), n, dtype=torch.long, device=pred.device)


@torch.no_grad()
def confidence(model, batch: Batch, t_max: int) -> tuple[Tensor, Tensor]:
    """Published rule: one step t* for the whole batch, the argmin over t <= t_max
    of the confidence loss averaged over all the batch's answer positions."""
    (h, e, pos), w = start_blanked(model, batch)
    scored = batch.scored[:, :w]
    best, pred, best_t = math.inf, None, 0
    for t in range(1, t_max + 1):
        h = model.step(h, e, pos)
        logits = model.read(h)  # (B, w, V)
        conf = _confidences(logits, scored)[1]
        if conf < best or pred is None:  # ties keep the earliest step, as in `readout`
            best, pred, best_t = conf, logits.argmax(-1), t
    pred = _full(pred, batch.inputs.shape[1])
    return pred, torch.full((len(batch),), best_t, dtype=torch.long, device=pred.device)


CONFIDENT = math.log(2)  # first-confident: a mean confidence loss below this (geometric-mean top probability > 1/2)


def _sample_confidence(model, h: Tensor, sc: Tensor) -> tuple[Tensor, Tensor]:
    logits = model.read(h)  # (k, w, V)
    return (token_confidence(logits) * sc).sum(1) / sc.sum(1).clamp(min=1), logits


def _judge_confidence(model, h, sc, t):  # the argmin rule: retire only at a loss of exactly 0
    conf, logits = _sample_confidence(model, h, sc)
    return conf, conf <= 0, logits


def _judge_first_confident(model, h, sc, t):
    conf, logits = _sample_confidence(model, h, sc)
    return conf, conf < CONFIDENT, logits


def _judge_halt(model, h, sc, t):
    z = model.halt_logits(h, sc, t).to(confidence_dtype(h.device))
    return -z, z > 0, model.read(h)


@torch.no_grad()
def per_sample_search(model, batch: Batch, t_max: int, judge, patience: int | None = None,
                      stats: dict | None = None) -> tuple[Tensor, Tensor]:
    """Each sample's read-out at the first iteration t <= t_max where `judge` fires, else at
    the argmin over t of its value. judge(model, h (k, w, D), scored (k, w), t) -> (value (k,),
    fires (k,) bool, logits (k, w, V)). A sample that fires stops iterating, the others go
    on with fewer rows, so the iterations run are the steps picked. With `patience` p a
    sample also stops once p iterations in a row have not lowered its best value. Ties keep
    the earliest step. `stats["sample_steps"]` (if a dict is given) gets the iterations run
    summed over samples."""
    B, L = batch.inputs.shape
    (h, e, pos), _ = start_blanked(model, batch)
    scored, width = batch.scored, scored_width(batch)
    best = torch.full((B,), math.inf, dtype=confidence_dtype(h.device), device=h.device)
    steps = torch.zeros(B, dtype=torch.long, device=h.device)
    stale = torch.zeros(B, dtype=torch.long, device=h.device)  # iterations since the last improvement
    pred = torch.zeros(B, L, dtype=torch.long, device=h.device)
    active = torch.arange(B, device=h.device)  # rows of h are these samples
    spent = 0
    for t in range(1, t_max + 1):
        w = int(width[active].max())  # trimming is exact: attention is causal
        h, e, pos = h[:, :w], e[:, :w], pos[:, :w]
        h = model.step(h, e, pos)  # (k, w, D)
        spent += len(active)
        value, fires, logits = judge(model, h, scored[active, :w], t)
        better = (value < best[active]) | (steps[active] == 0) | fires  # step 1 stands until beaten
        idx = active[better]
        best[idx], steps[idx] = value[better], t
        pred[idx, :w] = logits[better].argmax(-1)
        stale[active] = torch.where(better, 0, stale[active] + 1)
        retire = fires | (stale[active] >= patience) if patience is not None else fires
        if bool(retire.any()):
            keep = ~retire
            active, h, e, pos = active[keep], h[keep], e[keep], take_rows(pos, keep)
            if len(active) == 0:
                break
    if stats is not None:
        stats["sample_steps"] = spent
    return pred, steps


def confidence_per_sample(model, batch: Batch, t_max: int, patience: int | None = None,
                          stats: dict | None = None) -> tuple[Tensor, Tensor]:
    """Per-sample argmin over t <= t_max of the sample's own confidence loss.

    Retirement (a sample stops iterating, the others go on with fewer rows):
    - always, once its best confidence loss is exactly 0: the loss is >= 0, so
      no later step can improve strictly; this never changes the result.
    - with `patience` p, once p iterations in a row have not improved its best.
      Exact when the loss is unimodal in t (falls to the right step, then
      rises); otherwise it may stop at a local minimum. patience=None is the
      plain argmin over all t <= t_max.
    """
    return per_sample_search(model, batch, t_max, _judge_confidence, patience, stats)


def first_confident(model, batch: Batch, t_max: int) -> tuple[Tensor, Tensor]:
    """Each sample at its first iteration whose mean confidence loss is below log 2
    (else its most confident one): the rule for a model trained by `looped-uncertain`."""
    return per_sample_search(model, batch, t_max, _judge_first_confident)


def halt(model, batch: Batch, t_max: int) -> tuple[Tensor, Tensor]:
    """Each sample at its first iteration whose halting logit is > 0 (else its largest):
    the rule for a model trained by `looped-halt`."""
    return per_sample_search(model, batch, t_max, _judge_halt)


@dataclass
class Trace:
    """Every read-out t = 1..T of one pass, per sample: exact match (T, B) bool, token
    accuracy (T, B), mean confidence loss (T, B), the task's own metrics {name: (T, B)};
    the batch's confidence (T,); the halting logit (T, B) of a model with a halting head."""
    exact: Tensor
    token: Tensor
    confidence: Tensor
    batch_confidence: list[float]
    extra: dict[str, Tensor] = field(default_factory=dict)
    halt: Tensor | None = None


@torch.no_grad()
def trace(model, batch: Batch, t_max: int, task: Task | None = None) -> Trace:
    """Run every sample t_max iterations and score each read-out: one pass from which
    `readout` takes any number of rules and `eval --per-step` its curve. Each read-out is scored
    as evaluation scores any prediction (`tasks.score`), and with `task` by the task's own
    metrics too (Task.metrics)."""
    (h, e, pos), w = start_blanked(model, batch)
    scored = batch.scored[:, :w]
    exact, token, conf, batch_conf, extra, halts = [], [], [], [], [], []
    for t in range(1, t_max + 1):
        h = model.step(h, e, pos)
        if hasattr(model, "halt_logits"):
            halts.append(model.halt_logits(h, scored, t).to(confidence_dtype(h.device)))
        logits = model.read(h)  # (B, w, V)
        pred = _full(logits.argmax(-1), batch.inputs.shape[1])  # no column past w is scored
        right, share = score(pred, batch)
        exact.append(right)
        token.append(share)
        per_sample, whole = _confidences(logits, scored)
        conf.append(per_sample)
        batch_conf.append(whole)
        if task is not None:
            extra.append(task.metrics(pred, batch))
    extra = {name: torch.stack([step[name] for step in extra]) for name in (extra[0] if extra else {})}
    return Trace(torch.stack(exact), torch.stack(token), torch.stack(conf), batch_conf, extra,
                 torch.stack(halts) if halts else None)
