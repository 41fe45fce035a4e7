"""Training a run: the Trainer's stages around a RunState, the run folder, resume.

One training step: draw a fresh batch from the task (online i.i.d. samples, lengths up to the
current curriculum maximum; or the step's batch of a fixed finite set, data.dataset_size,
lengthgen.training.finite_set) -> position-ID transform (data.position_transform,
lengthgen.model.position_transforms) -> method loss -> backward -> clip -> AdamW step -> EMA
update (lengthgen.training.run_state). Metrics go to metrics.jsonl every `log_interval` steps,
with the values of the hooks due (exact match at test lengths every `tests.interval` steps,
lengthgen.evaluation.during_training); checkpoints every `checkpoint_interval` steps and at the
end. Three seeds are kept apart: model initialisation, training data and evaluation (the last
one lives in the evaluator). The curriculum and learning rate are lengthgen.config.schedules.
"""
from __future__ import annotations

import contextlib
import json
import shutil
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from lengthgen.assembly.runs import Run, saved_run
from lengthgen.config.schedules import curriculum_max, learning_rate
from lengthgen.config.schema import Config, TrainConfig, to_dict, to_toml
from lengthgen.errors import ResourceError, TrainingDiverged, UserError, path_problem
from lengthgen.accel.hook import FastPaths
from lengthgen.results.metrics_log import METRICS_LOG, PREFIX, read_metrics
from lengthgen.runtime import checkpoint
from lengthgen.runtime.devices import autocast, check_precision, pick_device
from lengthgen.runtime.resources import DISK_FULL, NOT_WRITABLE, check_fits, is_out_of_memory, oom_detail, os_error_line
from lengthgen.runtime.run_folders import check_deletable, run_lock, unstarted
from lengthgen.tasks import Batch, Task
from lengthgen.tasks.base import sample_mixed
from lengthgen.training import trackers
from lengthgen.training.distributed import Ranks, no_sync, shard_seed
from lengthgen.training.finite_set import FiniteSet, training_set
from lengthgen.training.run_state import RunState


def sample_batch(task: Task, batch_size: int, low: int, high: int, generator: torch.Generator,
                 per_sample: bool) -> Batch:
    """Uniform lengths in [low, high]: one per sample (mixed batch, one vectorised call) or one per batch."""
    if per_sample:
        return sample_mixed(task, batch_size, low, high, generator)
    n = int(torch.randint(low, high + 1, (1,), generator=generator))
    return task.sample(batch_size, n, generator)


def draw_batches(cfg: Config, task: Task, transform, step: int, high: int, data: torch.Generator,
                 shards: range, finite: FiniteSet | None = None) -> list[Batch]:
    """The step's training data: one batch from the run's stream `data` (one data shard), or one
    batch of batch_size / data.shards samples per shard this process draws, each from a generator
    seeded by (data.seed, shard, step), so no process needs another's stream (lengthgen.training.distributed).
    With a finite training set (data.dataset_size), the step's batch of it; IDs still drawn from `data`."""
    d, per_sample = cfg.data, cfg.data.length_sampling == "per_sample"
    if finite is not None:
        return [transform(finite.batch(step), data)]
    if d.shards == 1:
        batch = sample_batch(task, cfg.train.batch_size, cfg.task.train_min, high, data, per_sample)
        return [transform(batch, data)]  # position IDs drawn from the data stream too
    batches = []
    for shard in shards:
        stream = torch.Generator().manual_seed(shard_seed("data", d.seed, shard, step))
        batch = sample_batch(task, cfg.train.batch_size // d.shards, cfg.task.train_min, high, stream, per_sample)
        batches.append(transform(batch, stream))
    return batches


def backward(loss_of, batches: list[Batch], cfg: Config, step: int, shards: range,
             device: torch.device) -> torch.Tensor:
    """Gradients of the mean of the batches' losses (DDP averages them over processes); returns
    that mean. A shard's dropout is seeded by (model_seed, shard, step): the same masks whichever
    process draws the shard."""
    total = torch.zeros((), device=device)
    for i, (shard, batch) in enumerate(zip(shards, batches)):
        if cfg.data.shards > 1:
            torch.manual_seed(shard_seed("dropout", cfg.train.model_seed, shard, step))
        with no_sync(loss_of, last=i == len(batches) - 1):
            with autocast(device, cfg.train.precision):
                loss = loss_of(batch.to(device))
            (loss / len(batches)).backward()
        total += loss.detach()
    return total / len(batches)


def update(optimizer: torch.optim.Optimizer, model: torch.nn.Module, lr: float, grad_clip: float) -> None:
    """An eager step's update once its gradients are in: the learning rate, clipping, the optimizer
    (a captured step does the same inside its graph: lengthgen.accel.captured)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()


def check_is_folder(folder: Path) -> None:
    """Refuse a run folder path that is a file or lies under one, or a link to nothing (mkdir and
    iterdir would crash)."""
    if folder.is_symlink() and not folder.exists():
        raise UserError(f"run folder {folder} {path_problem(folder, 'folder')}")
    for path in (folder, *folder.parents):  # the nearest part that exists must be a folder
        if path.is_dir():
            return
        if path.exists():
            where = "is a file" if path == folder else f"lies under {path}, which is a file"
            raise UserError(f"run folder {folder} {where}, not a folder")


def prepare_run_dir(folder: Path, force: bool) -> None:
    """Make a new run's folder. An existing one is replaced only with --force, and only if it
    is a lengthgen run (lengthgen.runtime.run_folders): never a folder of other files, nor the current one."""
    check_is_folder(folder)
    if folder.exists() and any(folder.iterdir()):
        if not force:
            how = ("stopped before its first checkpoint: use --resume to train it from step 0 with its "
                   "saved config" if unstarted(folder) and (folder / "config.toml").is_file()
                   else "use --resume to continue it")
            raise UserError(f"run folder {folder} already exists ({how}, or --force to overwrite it)")
        check_deletable(folder)
        shutil.rmtree(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ResourceError(f"cannot make run folder {folder}: {err.strerror}; give a folder you can write (--out)") from None


def resumed_run(folder: Path) -> tuple[Run, bool]:
    """The assembled run `train --resume` continues with, and whether there is a checkpoint to continue
    from. A run stopped before its first checkpoint (Ctrl-C, a kill, a crash) holds its config.toml
    and nothing else of value: it starts again from step 0 with that config."""
    check_is_folder(folder)
    path = checkpoint.latest(folder) if folder.is_dir() else None
    if path is not None:
        return saved_run(checkpoint.read_state(path)["config"], path / "state.json"), True
    if not (folder / "config.toml").is_file():
        raise UserError(f"cannot resume: {folder} holds no run (no checkpoint and no config.toml)")
    if not unstarted(folder):
        kept = ", ".join(sorted(p.name for p in folder.iterdir()))
        raise UserError(f"cannot resume: {folder} has no checkpoint but holds {kept}; "
                        "not overwriting it (--force starts the run afresh)")
    return saved_run(folder / "config.toml"), False


class Trainer:
    """One run's training as named stages around its RunState. A step: the batch (`draw`) ->
    forward and backward (`learn`) -> clip -> optimizer -> EMA. Every log_interval steps
    (`log_row`): a metrics.jsonl row, the hooks' values in it, and every checkpoint_interval steps a
    checkpoint. A hook (tests during training) has `due(step, last)` and `__call__(weights,
    current_max) -> {key: value}`; the seconds it takes are not counted as training time."""

    def __init__(self, run: Run, folder: Path, state: RunState, ranks: Ranks, device: torch.device, hooks: list = ()):
        cfg, task = run.cfg, run.task
        self.cfg, self.folder, self.task, self.method, self.state = cfg, folder, task, run.method, state
        self.ranks, self.device, self.hooks = ranks, device, list(hooks)
        self.transform = run.transform
        self.fixed_set = training_set(cfg, task)  # None: fresh samples every step
        self.loss_of, self.shards = None, ranks.shards(cfg.data.shards)
        self.fast = FastPaths(cfg, run.method, state, device, ranks.world)  # train.compile, train.capture
        self.loss_sum = torch.zeros((), device=device)  # on the device: no host sync per step on GPUs
        self.finite = torch.ones((), dtype=torch.bool, device=device)
        self.window_start, self.window_steps, self.window_samples = time.perf_counter(), 0, 0
        self.start_time = self.window_start - state.trained_seconds

    def draw(self, high: int) -> list[Batch]:
        return draw_batches(self.cfg, self.task, self.transform, self.state.step, high, self.state.data, self.shards,
                            self.fixed_set)

    def learn(self, batches: list[Batch]) -> torch.Tensor:
        """Gradients of the step's loss; a block that fails to compile runs eagerly from here on."""
        optimizer = self.state.optimizer
        optimizer.zero_grad(set_to_none=True)
        try:
            return backward(self.loss_of, batches, self.cfg, self.state.step, self.shards, self.device)
        except Exception as err:
            if not self.fast.recovered(err):
                raise
            optimizer.zero_grad(set_to_none=True)
            return backward(self.loss_of, batches, self.cfg, self.state.step, self.shards, self.device)

    def step(self) -> tuple[float, int]:
        """One optimizer step; returns its learning rate and curriculum maximum."""
        lr, high, batches = self.prepare()
        loss = self.fast.replayed(batches, lr)
        if loss is None:
            loss = self.learn(batches)
            update(self.state.optimizer, self.state.model, lr, self.cfg.optim.grad_clip)
        self.account(loss, batches)
        return lr, high

    def prepare(self) -> tuple[float, int, list[Batch]]:
        """The step's learning rate, curriculum maximum and batches."""
        high = curriculum_max(self.cfg, self.state.step)
        return learning_rate(self.cfg, self.state.step), high, self.draw(high)

    def account(self, loss: torch.Tensor, batches: list[Batch]) -> None:
        """After the update: the EMA, the step count, the loss and samples of the log window."""
        self.state.update_ema(self.cfg.optim)
        self.state.step += 1
        self.loss_sum += loss
        self.finite &= torch.isfinite(loss)
        self.window_steps += 1
        self.window_samples += sum(map(len, batches))

    def log_row(self, lr: float, high: int, hooked: list) -> dict:
        """The metrics.jsonl row of the steps since the last one (every process's losses and
        samples), with the values of the hooks due; a NaN or infinite loss stops training here."""
        step = self.state.step
        losses, finite_count, samples = self.ranks.summed(self.loss_sum, self.finite, torch.tensor(
            float(self.window_samples), device=self.device))
        if int(finite_count) < self.ranks.world:
            good = checkpoint.latest(self.folder)
            kept = f"the last good checkpoint {good} is kept" if good else "no checkpoint had been written"
            raise TrainingDiverged(f"loss became NaN or inf at or before step {step}; training stopped, {kept}")
        elapsed = time.perf_counter() - self.window_start
        row = {"step": step, "loss": float(losses) / (self.window_steps * self.ranks.world), "lr": lr, "max_length": high,
               "samples_per_s": float(samples) / max(elapsed, 1e-9), "time": time.perf_counter() - self.start_time}
        row.update(self.fast.metrics())
        if hooked and self.ranks.main:
            began = time.perf_counter()
            weights = self.state.tested_weights(self.cfg.optim.ema_start)
            for hook in hooked:
                row.update(hook(weights, high))
            self.start_time += time.perf_counter() - began
        self.loss_sum.zero_()
        self.window_start, self.window_steps, self.window_samples = time.perf_counter(), 0, 0
        return row

    def run(self, progress: bool = True) -> dict:
        with self.session(progress) as after_step:
            while self.state.step < self.cfg.train.steps:
                after_step(*self.step())
        self.ranks.barrier()  # every process returns once the last checkpoint is written
        return {"step": self.state.step, "folder": str(self.folder), "device": str(self.device)}

    @contextlib.contextmanager
    def session(self, progress: bool = True, own_steps: bool = True):
        """Yields `after_step(lr, high)` (logs, tests, checkpoints as due) with the log, trackers and
        progress bar open; out of memory or disk becomes one line naming the checkpoint kept.
        `own_steps` False: lengthgen.accel.stacked takes the steps: nothing compiled or recorded."""
        cfg, tr, state, ranks, folder = self.cfg, self.cfg.train, self.state, self.ranks, self.folder
        state.model.train()
        if own_steps:
            self.fast.start()
            self.loss_of = ranks.wrap(self.method, state.model)
        sinks = trackers.Sinks(tr.log_to if ranks.main else [], folder, to_dict(cfg), state.step)
        bar = tqdm(total=tr.steps, initial=state.step, disable=not progress or not ranks.main, dynamic_ncols=True,
                   mininterval=1.0)
        shown_tests = {}  # the latest tests during training, kept on the progress bar between them

        def after_step(lr: float, high: int) -> None:
            step, last = state.step, state.step == tr.steps
            if last:  # e.g. fit a probe on the trained model, in the weights that are tested
                for trained in (state.model, state.ema) if state.ema is not None else (state.model,):
                    self.method.finish(trained, cfg, self.task, self.device)
            hooked = [hook for hook in self.hooks if hook.due(step, last)]
            if step % tr.log_interval == 0 or step % tr.checkpoint_interval == 0 or last or hooked:
                row = self.log_row(lr, high, hooked)
                if ranks.main:
                    log.write(json.dumps(row) + "\n")
                    log.flush()
                    sinks.log(row)
                shown_tests.update({k: f"{v:.3f}" for k, v in row.items() if k.startswith(PREFIX)})
                bar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{lr:.2e}", len=high,
                                sps=f"{row['samples_per_s']:.0f}", **shown_tests)
                if ranks.main and (step % tr.checkpoint_interval == 0 or last):
                    state.save(folder, cfg)
            bar.update(1)

        try:
            with ((folder / METRICS_LOG).open("a") if ranks.main else contextlib.nullcontext()) as log, \
                    contextlib.closing(sinks):
                yield after_step
        except (MemoryError, RuntimeError, OSError, TrainingDiverged) as err:
            bar.close()
            fault = resource_fault(err, cfg.train, folder, state.step) if not isinstance(err, TrainingDiverged) else None
            if fault is None:
                raise
            raise fault from None
        bar.close()


def train(run: Run | Config | None, folder: Path, resume: bool = False, force: bool = False,
          progress: bool = True, hooks=None) -> dict:
    """Train the assembled `run` in `folder` (a Config checked before, as a test edits one, has its
    parts built here); returns a summary dict. Resumes from the latest checkpoint, whose config wins.
    Under torchrun, one of the processes of a data-parallel run (lengthgen.training.distributed).
    The run folder's lock is held from before the folder is made (or deleted by --force, or read
    by --resume) until training ends: a second train of it stops with one line (run_lock).
    `hooks(run, device)`: what to do during training besides learning (its list of hooks, e.g.
    lengthgen.evaluation.during_training.training_tests), given by the caller, so training imports
    nothing from evaluation; None: nothing."""
    folder = Path(folder)
    check_is_folder(folder)
    with run_lock(folder) if Ranks.from_env().main else contextlib.nullcontext():
        return train_held(run, folder, resume, force, progress, hooks)


def train_held(run: Run | Config | None, folder: Path, resume: bool, force: bool, progress: bool, hooks=None) -> dict:
    """`train` under the run folder's lock."""
    return trainer_for(run, folder, resume, force, hooks).run(progress)


def trainer_for(run: Run | Config | None, folder: Path, resume: bool, force: bool, hooks=None) -> Trainer:
    """The run's Trainer at its first step to take: the folder made (or resumed), the state built."""
    ranks = Ranks.from_env()
    restart = False
    if resume:  # the run's own config wins: the data stream and schedule depend on it
        run, resume = resumed_run(folder)
        restart = not resume
        if restart and ranks.main:
            print(f"note: {folder} has no checkpoint (stopped before its first one); "
                  "training it from step 0 with its saved config", file=sys.stderr)
    run = run if isinstance(run, Run) else Run.from_checked(run)
    device = ranks.device(pick_device(run.cfg.train.device))
    check_precision(device, run.cfg.train.precision)
    ranks.join(device)
    run = replace(run, cfg=ranks.sharded(run.cfg, resume))
    cfg, task, method = run.cfg, run.task, run.method
    trackers.check_installed(cfg.train.log_to)
    check_fits(cfg, task.vocab_size, run.widest, device)  # sizes that cannot fit: refused now
    if not resume:  # made only once the device can serve the config, by one process
        ranks.first(lambda: prepare_run_dir(folder, force or restart))
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    state = RunState.start(cfg, method, task, device)
    if resume:
        state.restore(folder)
        if ranks.main:  # drop the log lines written after the checkpoint
            state.trained_seconds = _truncate_metrics(folder / METRICS_LOG, state.step)
    elif ranks.main:  # one process writes the run folder
        (folder / "config.toml").write_text(to_toml(cfg))
        if hasattr(task, "save"):  # what the run read beyond its config (a trained tokenizer)
            task.save(folder)
    return Trainer(run, folder, state, ranks, device, hooks(run, device) if hooks else [])


def resource_fault(err: BaseException, tr: TrainConfig, folder: Path, step: int) -> ResourceError | None:
    """Running out of memory or disk at `step` as one line, with what to change and the checkpoint
    that is kept (checkpoints are written atomically: a failed one is never `latest`)."""
    good = checkpoint.latest(folder) if (folder / "checkpoints").is_dir() else None
    kept = (f"the last complete checkpoint, {good.name}, is kept (lengthgen train --resume --out {folder} "
            "continues from it)" if good else "no checkpoint had been written")
    if is_out_of_memory(err):
        return ResourceError(f"out of memory at step {step + 1} ({oom_detail(err)}); lower "
                             f"train.batch_size (now {tr.batch_size}) or the model's size, or free memory; {kept}")
    if isinstance(err, OSError) and err.errno in DISK_FULL | NOT_WRITABLE:
        return ResourceError(f"{os_error_line(err)} at step {step}; {kept}")
    return None


def _truncate_metrics(path: Path, step: int) -> float:
    """Drop the lines after `step`; returns the training seconds of the last line kept."""
    if not path.exists():
        return 0.0
    rows = [row for row in read_metrics(path, skip_damaged=True) if row["step"] <= step]  # noted, not fatal
    checkpoint.write_atomic(path, "".join(json.dumps(row) + "\n" for row in rows))
    return float(rows[-1].get("time", 0.0)) if rows else 0.0


def is_finished(folder: Path) -> bool:
    path = checkpoint.latest(Path(folder)) if (Path(folder) / "checkpoints").exists() else None
    return path is not None and bool(checkpoint.read_state(path).get("finished"))
