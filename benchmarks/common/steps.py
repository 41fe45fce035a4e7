"""The training step the benchmarks time: lengthgen's own (Trainer.step), never a copy of it.

`TrainerStep` is a run's Trainer (lengthgen.training.trainer) set up as `Trainer.session` sets it
up before a run's first step (its fast paths started, lengthgen.accel.hook: the blocks compiled
where train.compile says, the step recorded as CUDA graphs where train.capture says and the run
allows; the method's loss), at the step where the
curriculum reaches its last length: a run spends most of its steps there, and on CUDA a recorded
step compiles from there (train.compile with train.capture). Calling it takes one `Trainer.step`:
draw (or the batches given, so that the variants of a benchmark train on the same ones), forward,
backward, clipping, the optimizer, the EMA. No run folder is written: the log, checkpoints and
tests during training are `session`'s, which a benchmark does not open.

`StackedStep` is seeds of one run trained as one model as `reproduce --stack-seeds` trains them
(lengthgen.training.stacked_seeds): each seed's Trainer draws and accounts, lengthgen.accel.stacked
takes their steps together. `UnrecordedSteps` is the body of a recorded step (lengthgen.accel.captured)
run without a CUDA graph, for a CPU: what the GPU's fast path would do there.
"""
from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from lengthgen.accel.captured import WIDTH_MULTIPLE, CapturedSteps, padded, shape_of
from lengthgen.accel.compiling import compiled_whole
from lengthgen.accel.stacked import StackedSteps
from lengthgen.config.schedules import curriculum_end, curriculum_max, learning_rate
from lengthgen.runtime.devices import pick_device
from lengthgen.tasks import Batch
from lengthgen.training.distributed import Ranks
from lengthgen.training.run_state import RunState
from lengthgen.training.trainer import Trainer


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (a CUDA call returns before its kernels finish)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class TrainerStep(Trainer):
    """One run's training steps, each `Trainer.step`. `__call__(batches=None)`: one step on the
    batches given (a Batch or the step's list), else on the trainer's own draw; returns its loss
    (on the device). `capture`, `compile`: train.capture and train.compile for this copy (None:
    the run's). `seed`: train.model_seed and data.seed (None: the run's), as stacked seeds differ."""

    def __init__(self, run, device: torch.device | str | None = None, *, capture: bool | None = None,
                 compile: bool | None = None, seed: int | None = None, step: int | None = None):
        cfg = run.cfg
        device = pick_device(cfg.train.device) if device is None else torch.device(device)
        tr = replace(cfg.train, device=device.type, **{k: v for k, v in (("capture", capture), ("compile", compile),
                                                                          ("model_seed", seed)) if v is not None})
        cfg = replace(cfg, train=tr, data=cfg.data if seed is None else replace(cfg.data, seed=seed))
        run = replace(run, cfg=cfg)
        state = RunState.start(cfg, run.method, run.task, device)
        state.step = curriculum_end(cfg) if step is None else step
        super().__init__(run, Path(tempfile.gettempdir()), state, Ranks(), device)
        self.given, self.loss = None, None
        # what Trainer.session does before the first step when the trainer takes its own steps
        state.model.train()
        self.fast.start()
        self.loss_of = self.ranks.wrap(self.method, state.model)

    @property
    def lr(self) -> float:
        return learning_rate(self.cfg, self.state.step)

    def draw(self, high: int) -> list[Batch]:
        return self.given if self.given is not None else super().draw(high)

    def account(self, loss: torch.Tensor, batches: list[Batch]) -> None:
        self.loss = loss
        super().account(loss, batches)

    def batches(self, length: int | None = None) -> list[Batch]:
        """The next step's batches from this trainer's data stream, drawn as training draws them at
        the curriculum's current maximum; `length`: every sample exactly that long (transformed as
        training transforms its batches)."""
        if length is None:
            return super().draw(curriculum_max(self.cfg, self.state.step))
        data = self.state.data
        return [self.transform(self.task.sample(self.cfg.train.batch_size, length, data), data)]

    def __call__(self, batches: list[Batch] | Batch | None = None) -> torch.Tensor:
        self.given = [batches] if isinstance(batches, Batch) else batches
        try:
            self.step()
        finally:
            self.given = None
        return self.loss

    def replay_with(self, steps) -> None:
        """Take the steps through `steps(batch, lr)` where the trainer replays a recorded step
        (lengthgen.accel.hook.FastPaths.replayed), e.g. UnrecordedSteps on a CPU; where it fails the
        trainer goes eager, with a note."""
        self.fast.captured = steps

    @property
    def recorded(self) -> bool:
        """Whether the steps are (still) replayed: a recording that failed left them eager."""
        return self.fast.captured is not None

    @property
    def is_compiled(self) -> bool:
        """Whether train.compile took: the blocks, or a recorded step's loss whole."""
        return bool(self.fast.compiled)

    def graphs(self) -> int:
        """CUDA graphs recorded so far (one per shape bucket)."""
        return self.fast.captured.count() if self.recorded else 0


class StackedStep:
    """`seeds` seeds of one run (seeds 0..seeds-1) as one stacked model, each seed's Trainer drawing
    its own batch; recorded as CUDA graphs on CUDA. `__call__(batches=None)` returns the (S,) losses."""

    def __init__(self, run, device: torch.device, seeds: int, compile: bool = False):
        self.alone = [TrainerStep(run, device, capture=False, compile=False, seed=s) for s in range(seeds)]
        first, cuda = self.alone[0], device.type == "cuda"
        # as lengthgen.training.stacked_seeds builds it for `reproduce --stack-seeds`
        self.steps = StackedSteps(first.method, [t.state for t in self.alone], first.cfg.optim.grad_clip,
                                  first.cfg.train.precision, device, cuda, 0 if compile and cuda else None)

    def batches(self) -> list[Batch]:
        return [t.batches()[0] for t in self.alone]

    def __call__(self, batches: list[Batch] | None = None) -> torch.Tensor:
        batches = batches or self.batches()
        losses = self.steps(batches, self.alone[0].lr)
        for t, loss, batch in zip(self.alone, losses, batches):
            t.account(loss, [batch])
        return losses


class UnrecordedSteps(CapturedSteps):
    """A recorded step's body (lengthgen.accel.captured.CapturedSteps.step_body: the batch padded
    to its shape bucket, the method's fixed-shape loss, compiled whole where `compile`, backward,
    clipping, the optimizer), run without a CUDA graph. `__call__(batch, lr)`, as CapturedSteps."""

    def __init__(self, method, model: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float,
                 precision: str, device: torch.device, compile: bool = True):
        # not CapturedSteps.__init__: it opens a CUDA graph pool and moves the optimizer's state to one
        self.method, self.model, self.optimizer = method, model, optimizer
        self.whole = compiled_whole(model, method.fixed_shape_loss) if compile else None
        self.compiled = self.whole is not None
        self.grad_clip, self.precision, self.device = grad_clip, precision, device
        self.params = [p for p in model.parameters() if p.requires_grad]

    def bucket(self, batch: Batch) -> tuple[Batch, int]:
        """The batch padded to its shape bucket, and its loop count."""
        width, iterations, _ = shape_of(self.method, batch)
        return padded(batch, -(-width // WIDTH_MULTIPLE) * WIDTH_MULTIPLE).to(self.device), iterations

    def __call__(self, batch: Batch, lr: float) -> torch.Tensor:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return self.step_body(*self.bucket(batch), self.compiled)
