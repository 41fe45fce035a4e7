"""Position-ID transforms: between sampling and the model, in training and, where the
method's authors do so, in evaluation.

A transform rewrites `Batch.position_ids` (B, L) of a training batch, drawing
from the training data stream. Each one declares what evaluation reads
(`at_evaluation`), as its authors evaluate: `randomized` draws fresh random
IDs for every test sequence too (from the evaluation seed, so an evaluation is
reproducible); `pose` and `random_offset` leave the task's own IDs (its coupled
IDs, or 0..L-1). It starts from those same IDs, so it composes with
task-supplied IDs, and works per sample on the columns that matter
(`Batch.widths`; padding after them gets ID 0). Each class states the largest
ID it can produce (`largest_id`), so config validation sizes a learned table
before step 1.

- `random_offset` (Cho et al. 2024; random-start absolute positions): every ID
  of a sample shifted by one offset drawn uniformly from 0 .. max_position - hi
  (hi = the sample's largest ID), so every ID up to `max_position` is trained.
  `keep_zero` leaves ID 0 where it is: coupled layouts reserve it for BOS,
  EOS and padding. `levels` > 1 reads packed multi-level IDs
  (lengthgen.tasks.coupled_levels, Cho et al. 2025) and shifts each level by
  its own offset, up to its own `max_position` (one integer, or one per level).
- `pose` (Zhu et al., ICLR 2024): the sample cut at chunks - 1 uniform random
  columns into `chunks` pieces; piece i keeps its consecutive IDs shifted by a
  skip u_i, u_0 = 0 and u_i uniform in u_(i-1) .. target_length - 1 - hi, so a
  short sample sees the distances of one of `target_length` tokens.
- `randomized` (Ruoss et al., ACL 2023): ID p of a sample becomes the p-th
  smallest of a uniform random subset of 0 .. max_position - 1 (ordered, one
  subset per sample), so test-time IDs up to max_position - 1 are all trained.
  Evaluation draws the same way: the authors' range evaluation applies the
  model with a fresh random key per batch, and their encodings draw a new
  subset per sequence whether training or not.
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from lengthgen import register
from lengthgen.tasks import IGNORE, Batch
from lengthgen.tasks.base import uniform_below  # the draw the tasks use: one stream, one algorithm
from lengthgen.tasks.coupled_levels import pack, unpack


def base_ids(batch: Batch) -> Tensor:
    """(B, L) the IDs the model would read: the task's own, or 0..L-1."""
    B, L = batch.inputs.shape
    if batch.position_ids is not None:
        return batch.position_ids.expand(B, L)
    return torch.arange(L, device=batch.inputs.device).expand(B, L)


def real_columns(batch: Batch) -> Tensor:
    """(B, L) bool: the columns each sample needs (before its padding)."""
    return torch.arange(batch.inputs.shape[1], device=batch.inputs.device)[None, :] < batch.widths[:, None]


def refuse_targets(transform: str, batch: Batch) -> None:
    """Transforms that move IDs column by column cannot say where a next token's ID goes."""
    if batch.target_ids is not None:
        raise ValueError(f"{transform} cannot move the predicted position IDs of Predictive Position Coupling; "
                         "use random_offset")


def whole(transform: str, key: str, value, least: int = 1) -> int:
    """`value` if it is an integer >= least, else a ValueError naming the option."""
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ValueError(f"{transform}: {key} must be an integer >= {least}, got {value!r}")
    return value


class PositionTransform:
    """`none`: the IDs stay as the task gives them.

    A transform sets `top`, the largest ID it produces, and `bound`, the option
    that sets it (for messages)."""

    name = "none"
    top: int | None = None  # None: the task's own largest ID
    bound = ""
    at_evaluation = "the task's own IDs"  # what evaluation reads (docs/positions.md)
    random_at_evaluation = False  # evaluation draws IDs (from the evaluation seed): see `evaluation`
    changes_ids = False  # False: training reads the task's own IDs (the transform is a no-op)
    shifts_all_ids = True  # every ID of a sequence moves by the same amount, a next token's ID with the rest
    random_start = False  # the first ID is drawn: only a scheme that adds IDs to the input shows where it starts

    def evaluation(self, batch: Batch, generator: torch.Generator) -> Batch:
        """The test batch as the model reads it; the task's own IDs unless the transform's
        authors evaluate with transformed ones."""
        return batch

    def largest_id(self, base: int) -> int:
        """The largest ID produced when the untransformed IDs reach `base`; ValueError if
        they do not fit the transform's range."""
        if self.top is not None and base > self.top:
            raise ValueError(f"{self.name}: {self.bound} allows position IDs up to {self.top}, below the "
                             f"largest ID of the training sequences ({base})")
        return base if self.top is None else self.top

    def __call__(self, batch: Batch, generator: torch.Generator) -> Batch:
        return batch

    def _fit(self, ids: Tensor, real: Tensor) -> Tensor:
        """(B,) each sample's largest ID; ValueError when one exceeds `top`."""
        hi = ids.masked_fill(~real, 0).amax(1)
        self.largest_id(int(hi.max()))
        return hi


class RandomOffset(PositionTransform):
    name = "random_offset"
    changes_ids = True
    random_start = True
    # Cho et al.'s evaluation sets are built with randomize = False: the first coupled ID is 1,
    # unshifted, as the task lays it out (HanseulJo/position-coupling, configs/task/*_coupled.yaml)
    at_evaluation = "the task's own IDs, unshifted (Cho et al.'s evaluation sets: randomize = false)"

    def __init__(self, *, max_position: int | list, keep_zero: bool = False, levels: int = 1):
        if not isinstance(keep_zero, bool):
            raise ValueError(f"random_offset: keep_zero must be true or false, got {keep_zero!r}")
        self.levels = whole(self.name, "levels", levels)
        tops = max_position if isinstance(max_position, list) else [max_position]
        if isinstance(max_position, list) and len(tops) != self.levels:
            raise ValueError(f"random_offset: max_position must be one integer or a list of one per level "
                             f"({self.levels}), got {max_position!r}")
        self.tops = [whole(self.name, "max_position", top) for top in tops] * (self.levels // len(tops))
        if self.levels > 1 and not keep_zero:  # a level's 0 means the token is outside that level
            raise ValueError("random_offset: levels > 1 keeps each level's ID 0 (BOS, EOS, tokens outside the level); "
                             "set keep_zero = true")
        self.top = max(self.tops)
        self.bound, self.keep_zero = f"max_position {max_position}", keep_zero

    def __call__(self, batch, generator):
        if self.levels > 1:
            return self.shift_levels(batch, generator)
        ids, real = base_ids(batch), real_columns(batch)
        targets = batch.target_ids  # the next tokens' IDs (PPC): shifted with the rest
        with_targets = ids if targets is None else torch.cat([ids, targets], 1)
        hi = self._fit(with_targets, real if targets is None else torch.cat([real, targets != IGNORE], 1))
        offset = uniform_below(self.top - hi + 1, generator)[:, None]  # (B, 1) in 0 .. max_position - hi
        moved = torch.where(ids == 0, ids, ids + offset) if self.keep_zero else ids + offset
        if targets is not None:
            fixed = (targets == IGNORE) | (targets == 0) if self.keep_zero else targets == IGNORE
            targets = torch.where(fixed, targets, targets + offset)
        return replace(batch, position_ids=torch.where(real, moved, 0), target_ids=targets)

    def shift_levels(self, batch: Batch, generator: torch.Generator) -> Batch:
        """Packed IDs of `levels` levels (lengthgen.tasks.coupled_levels), each level's nonzero IDs
        shifted by its own offset, uniform in 0 .. its max_position - the sample's largest ID there
        (Cho et al. 2025 draw one start per level)."""
        refuse_targets(f"{self.name} with levels", batch)
        real = real_columns(batch)
        moved = []
        for level, top in zip(unpack(base_ids(batch), self.levels), self.tops):
            hi = level.masked_fill(~real, 0).amax(1)
            if int(hi.max()) > top:
                raise ValueError(f"{self.name}: max_position {top} of level {len(moved)} is below the largest ID "
                                 f"of that level in the training sequences ({int(hi.max())})")
            offset = uniform_below(top - hi + 1, generator)[:, None]
            moved.append(torch.where((level == 0) | ~real, 0, level + offset))
        return replace(batch, position_ids=pack(moved))


class PoSE(PositionTransform):
    name = "pose"
    changes_ids = True
    shifts_all_ids = False  # skips between chunks
    at_evaluation = "0..L-1, no skips (Zhu et al. evaluate a long window as it is)"

    def __init__(self, *, target_length: int, chunks: int = 2):
        self.top = whole(self.name, "target_length", target_length) - 1
        self.chunks = whole(self.name, "chunks", chunks)
        self.bound = f"target_length {target_length}"

    def __call__(self, batch, generator):
        refuse_targets(self.name, batch)
        ids, real = base_ids(batch), real_columns(batch)
        B, L = ids.shape
        room = self.top - self._fit(ids, real)  # (B,) the largest total skip
        widths = batch.widths
        # chunks - 1 cut columns, each uniform in 1 .. width - 1 (a sample of width 1 is one chunk)
        cuts = torch.stack([1 + uniform_below((widths - 1).clamp(min=1), generator)
                            for _ in range(self.chunks - 1)], 1) if self.chunks > 1 else widths[:, None]
        cuts = cuts.sort(1).values  # (B, chunks - 1)
        column = torch.arange(L, device=ids.device)
        chunk = (column[None, :, None] >= cuts[:, None, :]).sum(-1)  # (B, L): the chunk of each column
        skips = [torch.zeros(B, dtype=torch.long, device=ids.device)]
        for _ in range(self.chunks - 1):  # non-decreasing: u_i uniform in u_(i-1) .. room
            skips.append(skips[-1] + uniform_below(room - skips[-1] + 1, generator))
        skip = torch.stack(skips, 1).gather(1, chunk.clamp(max=self.chunks - 1))  # (B, L)
        return replace(batch, position_ids=torch.where(real, ids + skip, 0))


class Randomized(PositionTransform):
    name = "randomized"
    changes_ids = True
    shifts_all_ids = False  # a random ordered subset
    at_evaluation = "a fresh ordered random subset of 0..max_position-1 per sequence, as in training"
    random_at_evaluation = True

    def __init__(self, *, max_position: int):
        self.top = whole(self.name, "max_position", max_position) - 1
        self.bound = f"max_position {max_position}"

    def __call__(self, batch, generator):
        refuse_targets(self.name, batch)
        ids, real = base_ids(batch), real_columns(batch)
        M = self.top + 1
        need = self._fit(ids, real) + 1  # (B,) IDs each sample uses
        keys = torch.rand(ids.shape[0], M, generator=generator).to(ids.device)
        chosen = keys.argsort(1).argsort(1) < need[:, None]  # (B, M): a uniform subset of need[b] IDs
        column = torch.arange(M, device=ids.device).expand_as(chosen)
        subset = torch.where(chosen, column, M).sort(1).values  # (B, M): the subset in order, first
        moved = subset.gather(1, ids.clamp(max=M - 1))
        return replace(batch, position_ids=torch.where(real, moved, 0))

    def evaluation(self, batch, generator):
        return self(batch, generator)


# The built-ins, registered as plugins are (lengthgen.register), in the order listings show them
TRANSFORMS = register.TRANSFORMS
TRANSFORMS.base = PositionTransform
for _cls in (PositionTransform, RandomOffset, PoSE, Randomized):
    TRANSFORMS.add(_cls.name, _cls)


def build_transform(name: str, options: dict) -> PositionTransform:
    """The transform `name` with its options (TypeError / ValueError on bad ones)."""
    return TRANSFORMS[name](**options)
