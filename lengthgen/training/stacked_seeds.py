"""Seeds of one configuration trained as one stacked model (`reproduce --stack-seeds`): each
seed keeps its own Trainer (data stream, run folder, log, tests during training, checkpoints);
lengthgen.accel.stacked takes their steps together. Runs that cannot stack train one after
another, with a one-line note saying why."""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path

from lengthgen.accel.captured import capture_refusal
from lengthgen.accel.stacked import StackedSteps
from lengthgen.config.schedules import curriculum_end
from lengthgen.config.schema import flat, to_dict
from lengthgen.runtime.run_folders import run_lock
from lengthgen.training.trainer import Trainer, check_is_folder, trainer_for


class StackedNote:
    """A hook that puts `stacked_seeds` (how many seeds trained as one) in every metrics row."""

    def __init__(self, seeds: int, log_interval: int):
        self.seeds, self.log_interval = seeds, log_interval

    def due(self, step: int, last: bool) -> bool:
        return step % self.log_interval == 0 or last

    def __call__(self, weights, current_max) -> dict:
        return {"stacked_seeds": self.seeds}


SEED_KEYS = ("train.model_seed", "data.seed")  # what the stacked runs may differ in


def stack_refusal(trainers: list[Trainer]) -> str | None:
    """Why these runs cannot train stacked, or None."""
    first = trainers[0]
    reason = capture_refusal(first.method, first.ranks.world, first.cfg.data.shards)
    if reason or not first.method.stackable:
        return reason or f"method {first.method.name}'s loss cannot run under vmap"
    config = flat(to_dict(first.cfg))
    for t in trainers[1:]:
        other = flat(to_dict(t.cfg))
        differ = sorted(k for k in set(config) | set(other) if k not in SEED_KEYS and config.get(k) != other.get(k))
        if differ:
            return f"{first.folder} and {t.folder} differ in {differ[0]}, not only in their seeds"
        if t.state.step != first.state.step:
            return f"{first.folder} is at step {first.state.step}, {t.folder} at step {t.state.step}"
    return None


def train_stacked(runs: list, folders: list[Path], resume: list[bool], force: bool = False, progress: bool = True,
                  hooks=None) -> list[dict]:
    """Train runs that differ only in their seeds as one stacked model (each run resumed where
    `resume` says); where they cannot be, with a one-line note, each on its own in turn.
    Returns each run's summary, as `train` does."""
    with contextlib.ExitStack() as held:
        for folder in folders:
            check_is_folder(Path(folder))
            held.enter_context(run_lock(Path(folder)))
        trainers = [trainer_for(run, Path(f), again, force, hooks) for run, f, again in zip(runs, folders, resume)]
        reason = stack_refusal(trainers) if len(trainers) > 1 else "one run has nothing to stack with"
        if reason:
            print(f"lengthgen: note: the seeds train one after another, not stacked: {reason}", file=sys.stderr)
            return [t.run(progress) for t in trainers]
        first, tr = trainers[0], trainers[0].cfg.train
        capture = tr.capture and first.device.type == "cuda"
        if tr.compile and not capture:
            print("lengthgen: note: train.compile is off for stacked seeds whose steps are not recorded "
                  "(on CUDA with train.capture their loss is compiled whole)", file=sys.stderr)
        compile_after = max(0, curriculum_end(first.cfg) - first.state.step) if tr.compile and capture else None
        steps = StackedSteps(first.method, [t.state for t in trainers], first.cfg.optim.grad_clip, tr.precision,
                             first.device, capture, compile_after)
        for t in trainers:
            t.hooks.append(StackedNote(len(trainers), tr.log_interval))
        after = [held.enter_context(t.session(progress and i == 0, own_steps=False)) for i, t in enumerate(trainers)]
        while first.state.step < tr.steps:
            prepared = [t.prepare() for t in trainers]
            losses = steps([batches[0] for _, _, batches in prepared], prepared[0][0])
            for t, done, loss, (lr, high, batches) in zip(trainers, after, losses, prepared):
                t.account(loss, batches)
                done(lr, high)
    return [{"step": t.state.step, "folder": str(t.folder), "device": str(t.device), "stacked": len(trainers)}
            for t in trainers]
