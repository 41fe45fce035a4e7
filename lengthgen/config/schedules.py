"""What changes with the step: the curriculum's longest training length and the learning rate.
Pure functions of (config, step), so a resumed run, a test and the presets' checks against the
released code all read the same numbers. `SCHEDULES` holds the learning-rate schedules: each
builds the rate and checks the settings it reads (config validation asks it, by name of the
schedule only)."""
from __future__ import annotations

import math

from lengthgen.config.schema import Config, TrainConfig


def curriculum_max(cfg: Config, step: int) -> int:
    """Largest training length at `step`: start, +1 every interval, capped."""
    start = cfg.train.curriculum_start
    if start == 0:
        return cfg.task.train_max
    return min(cfg.task.train_max, start + step // cfg.train.curriculum_interval)


def curriculum_end(cfg: Config) -> int:
    """First step at which the curriculum has reached train_max."""
    start = cfg.train.curriculum_start
    return 0 if start == 0 else (cfg.task.train_max - start) * cfg.train.curriculum_interval


class Schedule:
    """Linear warm-up over train.warmup_steps, held at lr until `decay_start`, then `decayed`
    (progress 0 -> 1 over the remaining steps) down to the floor lr * min_lr_ratio."""

    name = ""
    warms_up = True

    def decay_start(self, cfg: Config) -> int:
        return cfg.train.warmup_steps

    def decayed(self, lr: float, floor: float, progress: float) -> float:
        raise NotImplementedError

    def rate(self, cfg: Config, step: int) -> float:
        tr = cfg.train
        if not self.warms_up:
            return tr.lr
        if step < tr.warmup_steps:
            return tr.lr * (step + 1) / tr.warmup_steps
        begin = self.decay_start(cfg)
        if step < begin:
            return tr.lr
        progress = min(1.0, (step - begin) / max(1, tr.steps - begin))
        return self.decayed(tr.lr, tr.lr * tr.min_lr_ratio, progress)

    def problems(self, tr: TrainConfig) -> list[str]:
        """What is wrong with the settings this schedule reads ([] if nothing)."""
        return [] if tr.cosine_start == 0 else [f"train.cosine_start applies to schedule curriculum_cosine, not {self.name!r}"]


class Cosine(Schedule):
    """Half a cosine from the end of warm-up to the last step."""

    name = "cosine"

    def decayed(self, lr: float, floor: float, progress: float) -> float:
        return floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


class CurriculumCosine(Cosine):
    """The cosine held at lr until the curriculum ends (or train.cosine_start): the looped
    paper's released schedule."""

    name = "curriculum_cosine"

    def decay_start(self, cfg: Config) -> int:
        return max(cfg.train.warmup_steps, cfg.train.cosine_start or curriculum_end(cfg))

    def problems(self, tr: TrainConfig) -> list[str]:
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

    def problems(self, tr: TrainConfig) -> list[str]:
        return super().problems(tr) + ([] if tr.warmup_steps == 0 else [
            f"train.warmup_steps ({tr.warmup_steps}) has no effect with train.schedule constant; "
            "use cosine or curriculum_cosine, or set train.warmup_steps=0"])


SCHEDULES = {s.name: s() for s in (Cosine, CurriculumCosine, Linear, Constant)}


def learning_rate(cfg: Config, step: int) -> float:
    return SCHEDULES[cfg.train.schedule].rate(cfg, step)
