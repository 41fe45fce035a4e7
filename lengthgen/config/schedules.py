"""What changes with the step: the curriculum's longest training length and the learning rate.
Pure functions of (config, step), so a resumed run, a test and the presets' checks against the
released code all read the same numbers. `SCHEDULES` holds the learning-rate schedules: each
builds the rate and checks the settings it reads (config validation asks it, by name of the
schedule only)."""
from __future__ import annotations

import math

from lengthgen.config.schema import Config, OptimConfig


def curriculum_max(cfg: Config, step: int) -> int:
    """Largest training length at `step`: start, +1 every interval, capped."""
    start = cfg.data.curriculum_start
    if start == 0:
        return cfg.task.train_max
    return min(cfg.task.train_max, start + step // cfg.data.curriculum_interval)


def curriculum_end(cfg: Config) -> int:
    """First step at which the curriculum has reached train_max."""
    start = cfg.data.curriculum_start
    return 0 if start == 0 else (cfg.task.train_max - start) * cfg.data.curriculum_interval


class Schedule:
    """Linear warm-up over optim.warmup_steps, held at lr until `decay_start`, then `decayed`
    (progress 0 -> 1 over the remaining steps) down to the floor lr * min_lr_ratio."""

    name = ""
    warms_up = True

    def decay_start(self, cfg: Config) -> int:
        return cfg.optim.warmup_steps

    def decayed(self, lr: float, floor: float, progress: float) -> float:
        raise NotImplementedError

    def rate(self, cfg: Config, step: int) -> float:
        op = cfg.optim
        if not self.warms_up:
            return op.lr
        if step < op.warmup_steps:
            return op.lr * (step + 1) / op.warmup_steps
        begin = self.decay_start(cfg)
        if step < begin:
            return op.lr
        progress = min(1.0, (step - begin) / max(1, cfg.train.steps - begin))
        return self.decayed(op.lr, op.lr * op.min_lr_ratio, progress)

    def problems(self, op: OptimConfig) -> list[str]:
        """What is wrong with the settings this schedule reads ([] if nothing)."""
        return [] if op.cosine_start == 0 else [f"optim.cosine_start applies to schedule curriculum_cosine, not {self.name!r}"]


class Cosine(Schedule):
    """Half a cosine from the end of warm-up to the last step."""

    name = "cosine"

    def decayed(self, lr: float, floor: float, progress: float) -> float:
        return floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


class CurriculumCosine(Cosine):
    """The cosine held at lr until the curriculum ends (or optim.cosine_start): the looped
    paper's released schedule."""

    name = "curriculum_cosine"

    def decay_start(self, cfg: Config) -> int:
        return max(cfg.optim.warmup_steps, cfg.optim.cosine_start or curriculum_end(cfg))

    def problems(self, op: OptimConfig) -> list[str]:
        return []


class Linear(Schedule):
    """A straight line down to lr * min_lr_ratio at the last step (Golowich et al.'s schedule)."""

    name = "linear"

    def decayed(self, lr: float, floor: float, progress: float) -> float:
        return lr - (lr - floor) * progress


class Constant(Schedule):
    """lr throughout, with no warm-up (a warm-up given is refused, not ignored)."""

    name = "constant"
    warms_up = False

    def problems(self, op: OptimConfig) -> list[str]:
        return super().problems(op) + ([] if op.warmup_steps == 0 else [
            f"optim.warmup_steps ({op.warmup_steps}) has no effect with optim.schedule constant; "
            "use cosine or curriculum_cosine, or set optim.warmup_steps=0"])


SCHEDULES = {s.name: s() for s in (Cosine, CurriculumCosine, Linear, Constant)}


def learning_rate(cfg: Config, step: int) -> float:
    return SCHEDULES[cfg.optim.schedule].rate(cfg, step)
