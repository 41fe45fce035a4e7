"""Looped transformer (Fan et al., ICLR 2025) and its step-dependent loss.

One stack of `n_layer` blocks is applied T times. With input injection
(the paper's method) h_0 = 0 and h_t = ln_f(blocks(h_{t-1} + e)); without it
h_0 = e and h_t = ln_f(blocks(h_{t-1})). The final LayerNorm sits inside the
loop, as in the authors' code, so the recurrent state is normalised and the
read-out after any iteration is lm_head(h_t) with no further norm.

Whole-answer prediction: the model reads `batch.blank_answers().inputs` and
predicts every scored target (answer + EOS) in one pass after T_i = n_steps[i]
iterations, each sample at its own T_i.

Two schemes compute that per-sample objective (identical loss and gradients):
- "max" (the authors'): every sample runs max_i T_i iterations and each one's
  state is picked at its own T_i; short samples pay for iterations they discard.
- "prefix" (default): samples are sorted by T_i descending, so at iteration t
  the samples still running (T_i >= t) are a prefix of the rows; the block runs
  on that prefix only. Each row is trimmed to its own scored region (attention
  is causal, so columns past a sample's last scored position never influence
  it) and the rows are packed into one token array (attention.Packed), so the
  per-token layers never compute padding. A sample's state is kept the
  iteration it finishes and read out once at the end.
"""
from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import Tensor

from lengthgen.config.schema import ModelConfig
from lengthgen.model.attention import Packed
from lengthgen.model.positions import PositionalScheme
from lengthgen.model.transformer import Transformer
from lengthgen.tasks import IGNORE, Batch

LOSS_SCHEMES = ("prefix", "prefix-padded", "max")  # prefix-padded: no packing, for the benchmark
TOKEN_MULTIPLE = 64  # packed token arrays are rounded up to this: few distinct shapes (attention.Packed)


def take_rows(pos: Tensor, index) -> Tensor:
    """Rows of position ids (B, L); (1, L) ids are shared by every row."""
    return pos if pos.shape[0] == 1 else pos[index]


def scored_width(batch: Batch) -> Tensor:
    """(B,) columns each sample needs: one past its last scored position."""
    return batch.widths


class LoopedTransformer(Transformer):
    """Transformer whose block stack is looped; read out after any iteration.

    State API (also used by the stop rules, which drop finished rows):
        h, e, pos = model.start(inputs, position_ids)   # h_0, injection e, ids
        h = model.step(h, e, pos)                        # one iteration
        logits = model.read(h)                           # (B, L, V)
    """

    def __init__(self, cfg: ModelConfig, vocab_size: int, injection: bool = True,
                 scheme: PositionalScheme | None = None):
        super().__init__(cfg, vocab_size, scheme)
        self.injection = injection

    def start(self, inputs: Tensor, position_ids: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        pos = self.position_ids_for(inputs, position_ids)  # (B|1, L)
        e = self.embed(inputs, pos)  # (B, L, D)
        return (torch.zeros_like(e) if self.injection else e), e, pos

    def step(self, h: Tensor, e: Tensor, pos: Tensor, packed: Packed | None = None) -> Tensor:
        """One iteration on (B, L, D) states, or on packed rows (N, D) laid out by `packed`."""
        return self.ln_f(self.run_blocks(h + e if self.injection else h, pos, packed))

    def read(self, h: Tensor) -> Tensor:
        return self.read_out(h)  # (B, L, V); h is already normalised by the loop

    def iterate(self, inputs: Tensor, position_ids: Tensor | None, n_steps: int):
        """Yield the logits (B, L, V) after iterations 1..n_steps."""
        h, e, pos = self.start(inputs, position_ids)
        for _ in range(n_steps):
            h = self.step(h, e, pos)
            yield self.read(h)

    def forward(self, inputs: Tensor, position_ids: Tensor | None = None, n_steps: int = 1) -> Tensor:
        """Logits (B, L, V) after `n_steps` iterations for every row."""
        h, e, pos = self.start(inputs, position_ids)
        for _ in range(n_steps):
            h = self.step(h, e, pos)
        return self.read(h)

    def flops_per_token(self, seq_len: int, n_steps: int = 1) -> int:
        """Forward + backward FLOPs per token of `n_steps` iterations: the block
        part of the plain count is paid once per iteration, lm_head once."""
        head = 6 * self.vocab_size * self.cfg.d_model  # the lm_head matmul, tied or not
        return n_steps * (super().flops_per_token(seq_len) - head) + head


def per_sample_steps(batch: Batch) -> Tensor:
    """(B,) T_i, at least 1 (a read-out of h_0 would skip the block entirely)."""
    return batch.n_steps.clamp(min=1)


def oracle_logits(model: LoopedTransformer, batch: Batch, scheme: str = "prefix") -> Tensor:
    """(B, L, V) logits of each sample after its own T_i iterations, reading the
    blanked inputs. `scheme`: one of LOSS_SCHEMES, all give the same values."""
    if scheme == "max":
        return _logits_max(model, batch)
    return _logits_prefix(model, batch, _packing(scheme))


def _packing(scheme: str) -> bool:
    """Whether a prefix scheme packs rows at their own widths."""
    if scheme not in LOSS_SCHEMES or scheme == "max":
        raise ValueError(f"unknown loss scheme {scheme!r}; choose from {', '.join(LOSS_SCHEMES)}")
    return scheme == "prefix"


def _logits_max(model: LoopedTransformer, batch: Batch, iterations: int | None = None,
                states: list | None = None) -> Tensor:
    """Every row run `iterations` times (default the batch's largest T_i), each read at its own T_i;
    `states`, if a list, gets the (B, L, D) states after every iteration."""
    inputs = batch.blank_answers().inputs
    steps = per_sample_steps(batch)
    h, e, pos = model.start(inputs, batch.position_ids)
    picked = torch.zeros_like(h)  # (B, L, D): state of each sample at its own T_i
    for t in range(1, (iterations or int(steps.max())) + 1):
        h = model.step(h, e, pos)
        picked = torch.where((steps == t)[:, None, None], h, picked)
        if states is not None:
            states.append(h)
    return model.read(picked)


def _prefix_states(model: LoopedTransformer, batch: Batch, pack: bool = True,
                   every_step: list | None = None) -> tuple[Tensor, Tensor, Packed]:
    """Each sample's state after its own T_i iterations, as packed tokens.

    Returns (h (N, D), order (B,), layout): rows in `order` (longest-running
    first), row r trimmed to its own scored width, laid out by `layout`.
    pack=False keeps every row at the batch's widest scored width (the
    unpacked variant, same values, for the benchmark). `every_step`, if a list,
    gets (h, done, k) after every iteration: h the packed tokens of rows 0..k-1,
    the rows still running, of which rows done..k-1 finish at this iteration
    (the states the trained stopping methods supervise, lengthgen.methods.looped.halting)."""
    steps = per_sample_steps(batch)
    width = scored_width(batch)
    widest = int(width.max())
    if not pack:
        width = torch.full_like(width, widest)
    # longest-running first; among equal T_i widest first, so equal widths sit together
    order = torch.argsort(steps * (widest + 1) + width, descending=True, stable=True)  # (B,)
    steps_sorted = steps[order].tolist()  # one host sync; the loop bounds need it anyway
    widths = width[order].tolist()
    layout = Packed(widths, TOKEN_MULTIPLE)
    inputs = batch.blank_answers().inputs[order, :layout.width]  # (B, W)
    pos_ids = batch.position_ids[order, :layout.width] if batch.position_ids is not None else None
    h, e, pos = model.start(inputs, pos_ids)
    h, e = layout.unpad(h), layout.unpad(e)  # (capacity, D): no padding inside rows from here on
    ends = [0, *itertools.accumulate(widths)]  # rows 0..k-1 are tokens [0, ends[k])
    out: list[Tensor] = []  # final states of finished groups, latest-finishing last
    k, running = len(widths), layout  # rows 0..k-1 are still running, laid out by `running`
    for t in range(1, steps_sorted[0] + 1):
        if steps_sorted[k - 1] < t:  # samples with T_i < t have finished
            while steps_sorted[k - 1] < t:
                k -= 1
            running = Packed(widths[:k], TOKEN_MULTIPLE)
            h, e = h[:running.capacity], e[:running.capacity]
        h = model.step(h, e, take_rows(pos, slice(0, k))[:, :running.width], running)  # (tokens, D)
        done = k
        while done > 0 and steps_sorted[done - 1] == t:
            done -= 1
        if every_step is not None:
            every_step.append((h, done, k))
        if done < k:  # rows done..k-1 finish at iteration t
            out.append(h[ends[done]:ends[k]])
    return torch.cat(out[::-1]), order, layout  # (N, D): groups finished shortest-first, i.e. from the end


def _logits_prefix(model: LoopedTransformer, batch: Batch, pack: bool = True) -> Tensor:
    h, order, layout = _prefix_states(model, batch, pack)
    logits = layout.pad(model.read(h))  # (B, W, V) in `order`, zeros past each row's width
    logits = F.pad(logits, (0, 0, 0, batch.inputs.shape[1] - layout.width))
    return logits[torch.argsort(order)]  # (B, L, V) in batch order


def fixed_shape_loss(model: LoopedTransformer, batch: Batch, iterations: int, step_loss=None) -> Tensor:
    """The "max" scheme's loss with every row run `iterations` (>= the batch's largest T_i) times:
    shapes and loop count fixed, no host sync, so a CUDA graph can hold it (lengthgen.accel.captured).
    `step_loss(model, batch, states)` adds a loss on the states of every iteration
    (lengthgen.methods.looped.fixed_steps)."""
    states = [] if step_loss is not None else None
    logits = _logits_max(model, batch, iterations, states)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), batch.targets.flatten(), ignore_index=IGNORE)
    return loss if step_loss is None else loss + step_loss(model, batch, states)


def looped_loss(model: LoopedTransformer, batch: Batch, scheme: str = "prefix", step_loss=None) -> Tensor:
    """Mean cross-entropy over every scored token of the batch, each sample
    read out at its own T_i. `step_loss(model, batch, every_step, order, layout)`
    adds a loss on the states of every iteration (see `_prefix_states`)."""
    if step_loss is not None and scheme == "max":
        raise ValueError("a loss on every iteration needs a prefix loss scheme")
    if scheme != "max":  # read out the packed tokens only: no padding reaches lm_head
        steps = [] if step_loss is not None else None
        h, order, layout = _prefix_states(model, batch, _packing(scheme), steps)
        targets = layout.unpad(batch.targets[order, :layout.width, None])[:layout.tokens, 0]  # (N,)
        loss = F.cross_entropy(model.read(h).float(), targets, ignore_index=IGNORE)
        return loss if step_loss is None else loss + step_loss(model, batch, steps, order, layout)
    logits = oracle_logits(model, batch, scheme)
    return F.cross_entropy(logits.flatten(0, 1).float(), batch.targets.flatten(), ignore_index=IGNORE)
