"""Data-parallel training: `torchrun --nproc_per_node N -m lengthgen train PRESET ...`.

torchrun starts N processes and tells each its place (RANK, WORLD_SIZE, LOCAL_RANK). They
join one process group (gloo on CPU, nccl on CUDA, each process on cuda:LOCAL_RANK) and
train one model with DistributedDataParallel, which averages the gradients:

- **Data.** The batch of `train.batch_size` samples is drawn as `data.shards` shards
  of batch_size / data.shards samples; shard s at step t comes from a generator seeded by
  (data.seed, s, t) (`shard_seed`), dropout in it from one seeded by (model_seed, s, t).
  The loss is the mean of the shards' losses. The N processes split the shards, process r
  drawing shards r*k .. r*k+k-1 (k = data.shards / N), so the data, and the result up to
  the order of float reductions, depend on the config and not on N: a single process with
  `--set data.shards=N` (which accumulates the N shards' gradients) trains the same
  weights as N processes, and a run may resume on another number of processes. A config
  with one shard (the default: one stream seeded by data.seed, as before data-parallel
  runs existed) launched on N processes is given N shards, with a note; its config.toml
  records them.
- **Writing.** Only rank 0 writes the run folder (config.toml, metrics.jsonl, checkpoints,
  trackers); the others wait where it makes the folder and take its error if it fails, so
  every process stops with the same one-line message. Logged losses and sample rates are
  summed over the processes at log steps, the only extra synchronisation.
"""
from __future__ import annotations

import atexit
import hashlib
import inspect
import os
from contextlib import nullcontext
from dataclasses import dataclass, replace

import torch

from lengthgen.errors import UserError


def shard_seed(kind: str, seed: int, shard: int, step: int) -> int:
    """A 63-bit seed for shard `shard` at step `step`: the first 8 bytes of
    sha256("kind/seed/shard/step"). `kind` ("data", "dropout") keeps two streams of one
    seed apart (reproductions give data.seed and train.model_seed the same value)."""
    digest = hashlib.sha256(f"{kind}/{seed}/{shard}/{step}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class MethodLoss(torch.nn.Module):
    """A method's loss as a module's forward, so that DistributedDataParallel sees the whole
    computation however the method drives the model (looped methods call its parts)."""

    def __init__(self, method, model: torch.nn.Module):
        super().__init__()
        self.method, self.model = method, model

    def forward(self, batch):
        return self.method.loss(self.model, batch)


@dataclass
class Ranks:
    """This process's place in a data-parallel run; one process is rank 0 of 1."""

    rank: int = 0
    world: int = 1
    local: int = 0

    @classmethod
    def from_env(cls) -> "Ranks":
        """From torchrun's variables (absent: a single process)."""
        try:
            ranks = cls(int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)),
                        int(os.environ.get("LOCAL_RANK", 0)))
        except ValueError:
            raise UserError("RANK, WORLD_SIZE and LOCAL_RANK must be integers (torchrun sets them)") from None
        if not 0 <= ranks.rank < ranks.world:
            raise UserError(f"RANK {ranks.rank} is outside WORLD_SIZE {ranks.world}")
        return ranks

    @property
    def main(self) -> bool:
        return self.rank == 0

    def device(self, device: torch.device) -> torch.device:
        """The device of this process: cuda:LOCAL_RANK when the run is on CUDA."""
        if self.world == 1:
            return device
        if device.type == "mps":
            raise UserError("data-parallel training runs on CPU (gloo) or CUDA (nccl), not MPS; "
                            "set train.device=cpu or train on one process")
        if device.type == "cuda":
            if self.local >= torch.cuda.device_count():
                raise UserError(f"process {self.rank} wants cuda:{self.local}, but this machine has "
                                f"{torch.cuda.device_count()} CUDA device(s); start at most that many per node")
            torch.cuda.set_device(self.local)
            return torch.device("cuda", self.local)
        return device

    def join(self, device: torch.device) -> None:
        """Join the process group (once per process), left when the process exits."""
        if self.world == 1 or torch.distributed.is_initialized():
            return
        torch.distributed.init_process_group("nccl" if device.type == "cuda" else "gloo")
        atexit.register(torch.distributed.destroy_process_group)

    def sharded(self, cfg, resume: bool):
        """`cfg`, with one data shard per process if it has one shard and several processes run
        it (not on resume, where the checkpoint's config fixes the data stream)."""
        batch_size = cfg.train.batch_size
        if self.world > 1 and cfg.data.shards == 1 and not resume and batch_size % self.world == 0:
            if self.main:
                print(f"lengthgen: note: data.shards set to {self.world}, one per process "
                      f"(one process with --set data.shards={self.world} draws the same data)", flush=True)
            cfg = replace(cfg, data=replace(cfg.data, shards=self.world))
        if cfg.data.shards % self.world:
            raise UserError(f"data.shards ({cfg.data.shards}) must be a multiple of the {self.world} "
                            f"processes (and divide train.batch_size, {batch_size})")
        return cfg

    def shards(self, data_shards: int) -> range:
        """The data shards this process draws (all of them in a single process)."""
        per = data_shards // self.world
        return range(self.rank * per, (self.rank + 1) * per)

    def first(self, make) -> None:
        """make() on rank 0 while the others wait; its UserError is raised on every rank."""
        error = None
        if self.main:
            try:
                make()
            except UserError as err:
                error = err
        if self.world > 1:
            box = [None if error is None else str(error)]
            torch.distributed.broadcast_object_list(box, src=0)
            if box[0] is not None and error is None:
                error = UserError(box[0])
        if error is not None:
            raise error

    def wrap(self, method, model: torch.nn.Module):
        """batch -> loss: the method's, through DistributedDataParallel when there are several processes."""
        loss_of = MethodLoss(method, model)
        if self.world == 1:
            return loss_of
        # the only buffers are constant position tables (and a halting probe's statistics, set after the
        # last step), built alike by every process: no sync per step
        ddp = torch.nn.parallel.DistributedDataParallel
        newer = "forward_sync_buffers" in inspect.signature(ddp).parameters  # torch >= 2.13's name
        return ddp(loss_of, **({"forward_sync_buffers": False} if newer else {"broadcast_buffers": False}))

    def summed(self, *values: torch.Tensor) -> list[torch.Tensor]:
        """Each scalar summed over the processes, in one all-reduce."""
        if self.world == 1:
            return list(values)
        packed = torch.stack([v.detach().to(torch.float64) for v in values])
        torch.distributed.all_reduce(packed)
        return list(packed.unbind())

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()


def no_sync(loss_of, last: bool):
    """DDP's gradient averaging only on a process's last shard of a step (the earlier ones accumulate)."""
    return nullcontext() if last or not hasattr(loss_of, "no_sync") else loss_of.no_sync()
