"""`FastPaths`: the one object through which the trainer reaches the fast paths of a run's own
steps: the blocks compiled (train.compile), the whole step recorded as CUDA graphs
(train.capture, on CUDA), compiled whole inside its graph where both are asked. Each falls back
to the eager step with a one-line note where it cannot run; the eager step is the definition."""
from __future__ import annotations

import torch

from lengthgen.accel import heap
from lengthgen.accel.captured import CapturedSteps, capture_refusal, note, replayed_or_none
from lengthgen.accel.compiling import compilations, compile_blocks, compile_failed, fall_back
from lengthgen.config.schedules import curriculum_end
from lengthgen.config.schema import Config


class FastPaths:
    """One run's fast paths. `start` (as training starts) turns on what the config asks and the
    run allows; `replayed` runs a whole step from a graph; `recovered` makes a failed compile run
    eagerly from then on; `metrics` counts graphs for the training log."""

    def __init__(self, cfg: Config, method, state, device: torch.device, world: int = 1):
        self.cfg, self.method, self.state, self.device, self.world = cfg, method, state, device, world
        self.compiled, self.graphs_before = False, 0
        self.captured: CapturedSteps | None = None  # the step as CUDA graphs (train.capture)

    def start(self) -> None:
        tr = self.cfg.train
        self.graphs_before = compilations()  # the process may have compiled before (tests, scripts)
        heap.keep(self.device)
        self.captured = self.capture()
        if tr.compile:  # a recorded step compiles whole; else the blocks, in place (EMA, checkpoints see no change)
            self.compiled = self.captured.compiled if self.captured else compile_blocks(self.state.model, self.device)

    def capture(self) -> CapturedSteps | None:
        """Steps recorded as CUDA graphs where train.capture asks and the run allows, else None (and a note)."""
        tr = self.cfg.train
        if not (tr.capture and self.device.type == "cuda"):
            return None
        reason = capture_refusal(self.method, self.world, self.cfg.data.shards)
        if reason:
            return note(reason)
        compile_after = max(0, curriculum_end(self.cfg) - self.state.step) if tr.compile else None  # its last length
        return CapturedSteps(self.method, self.state.model, self.state.optimizer, self.cfg.optim.grad_clip,
                             tr.precision, self.device, compile_after)

    def replayed(self, batches: list, lr: float) -> torch.Tensor | None:
        """The whole step from a CUDA graph (gradients, clipping, the optimizer): its loss; None where
        no step is recorded, or recording fails (with a note, and every later step runs eagerly)."""
        if self.captured is None:
            return None
        loss = replayed_or_none(self.captured, batches[0], lr)
        if loss is None:
            self.captured = None
        return loss

    def recovered(self, err: BaseException) -> bool:
        """Whether `err` was compiled blocks failing, now switched back to eager (with a note)."""
        if not (self.compiled and compile_failed(err)):
            return False
        fall_back(self.state.model, err)
        self.compiled = False
        return True

    def metrics(self) -> dict:
        row = {}
        if self.compiled:  # graphs compiled so far: a number that keeps growing means recompiling
            row["compiled_graphs"] = compilations() - self.graphs_before
        if self.captured is not None:  # CUDA graphs recorded so far: about one per curriculum length
            row["cuda_graphs"] = self.captured.count()
        return row
