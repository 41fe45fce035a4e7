"""A fixed, finite training set (data.dataset_size), as Cho et al. train their coupling models.

By default lengthgen draws fresh samples every step. With data.dataset_size = N the task's
law (`Task.sample_range` over task.train_min..train_max) draws N samples once, from a
generator of their own seeded by data.seed; every epoch then visits each of them
exactly once, in a fresh order, batch_size at a time, the last batch of an epoch holding
what is left (a DataLoader with shuffle and without drop_last, as their code uses).
Position-ID transforms still draw per step from the data stream, as Cho et al. draw a
sample's random start each time it is read.

The batch of step s depends only on (data.seed, s): the order of epoch e comes from a
generator seeded by (data.seed, e), so a resumed run reads the very batches the
uninterrupted one would, with nothing in the checkpoint but the step.
"""
from __future__ import annotations

from dataclasses import fields, replace

import torch

from lengthgen.tasks import Batch, Task
from lengthgen.training.distributed import shard_seed

CHUNK = 10_000  # samples drawn per task call: the set's intermediates stay small


def compact(t: torch.Tensor) -> torch.Tensor:
    """A long tensor in the narrowest integer type that holds it (tokens, IDs and -100 fit
    int16): a million stored samples of 90 columns take 0.7 GB instead of 2.9."""
    for dtype in (torch.int16, torch.int32):
        info = torch.iinfo(dtype)
        if t.numel() == 0 or (int(t.min()) >= info.min and int(t.max()) <= info.max):
            return t.to(dtype)
    return t


class FiniteSet:
    """`size` samples of `task` over lengths low..high, served `batch_size` per step."""

    def __init__(self, task: Task, size: int, batch_size: int, low: int, high: int, seed: int):
        draw = torch.Generator().manual_seed(shard_seed("dataset", seed, 0, 0))
        parts = [task.sample_range(min(CHUNK, size - start), low, high, draw) for start in range(0, size, CHUNK)]
        every = Batch.concat(parts)
        self.samples = replace(every, **{f.name: compact(getattr(every, f.name)) for f in fields(every)
                                         if getattr(every, f.name) is not None})
        self.size, self.batch_size, self.seed = size, batch_size, seed
        self.steps_per_epoch = -(-size // batch_size)
        self._epoch, self._order = -1, None

    def order(self, epoch: int) -> torch.Tensor:
        """(size,) the sample indices of `epoch`, in the order they are read."""
        if epoch != self._epoch:
            shuffle = torch.Generator().manual_seed(shard_seed("epoch", self.seed, epoch, 0))
            self._epoch, self._order = epoch, torch.randperm(self.size, generator=shuffle)
        return self._order

    def batch(self, step: int) -> Batch:
        """The batch of optimizer step `step` (0-based), as long tensors."""
        epoch, k = divmod(step, self.steps_per_epoch)
        index = self.order(epoch)[k * self.batch_size:(k + 1) * self.batch_size]
        picked = self.samples.select(index)
        return replace(picked, **{f.name: getattr(picked, f.name).long() for f in fields(picked)
                                  if getattr(picked, f.name) is not None})


def training_set(cfg, task: Task) -> FiniteSet | None:
    """The run's finite training set, or None when it draws fresh samples (dataset_size 0)."""
    d = cfg.data
    if not d.dataset_size:
        return None
    return FiniteSet(task, d.dataset_size, cfg.train.batch_size, cfg.task.train_min, cfg.task.train_max, d.seed)
