"""Trainer: online data, curriculum, schedule, EMA, checkpoints, resume.

One training step: draw a fresh batch from the task (online i.i.d. samples,
lengths up to the current curriculum maximum; or the step's batch of a fixed
finite set, train.dataset_size, lengthgen.training.finite_set) -> position-ID transform
(train.position_transform, lengthgen.model.position_transforms) -> method loss -> backward ->
clip -> AdamW step -> EMA update. Metrics go to metrics.jsonl every
`log_interval` steps, with exact match at test lengths every `test_interval`
steps (lengthgen.evaluation.during_training); checkpoints every `checkpoint_interval` steps
and at the end. Three seeds are kept apart: model initialisation, training data and
evaluation (the last one lives in the evaluator).
"""
from __future__ import annotations

import contextlib
import copy
import json
import math
import shutil
import sys
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from lengthgen.runtime import checkpoint

from lengthgen.config.presets import from_dict, load, longest_sequence
from lengthgen.config.schema import Config, to_dict, to_toml
from lengthgen.errors import ResourceError, TrainingDiverged, UserError
from lengthgen.evaluation.during_training import PREFIX, due, run_tests
from lengthgen.methods.registry import get_method
from lengthgen.model.compiling import compilations, compile_blocks, compile_failed, fall_back
from lengthgen.model.position_transforms import build_transform
from lengthgen.runtime.devices import autocast, check_precision, pick_device
from lengthgen.runtime.resources import DISK_FULL, NOT_WRITABLE, check_fits, is_out_of_memory, oom_detail, os_error_line
from lengthgen.runtime.run_folders import check_deletable, read_metrics, unstarted
from lengthgen.tasks import Batch, Task, task_of
from lengthgen.tasks.base import sample_mixed
from lengthgen.training import trackers
from lengthgen.training.distributed import Ranks, no_sync, shard_seed
from lengthgen.training.finite_set import FiniteSet, training_set


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


def learning_rate(cfg: Config, step: int) -> float:
    """Cosine, curriculum_cosine and linear warm up linearly first; constant has no warm-up
    (config refuses one). linear then decays in a straight line to lr * min_lr_ratio at the
    last step (Golowich et al.'s schedule)."""
    tr = cfg.train
    if tr.schedule == "constant":
        return tr.lr
    if step < tr.warmup_steps:
        return tr.lr * (step + 1) / tr.warmup_steps
    # cosine: decay from the end of warm-up; curriculum_cosine: hold until the curriculum ends
    begin = tr.warmup_steps if tr.schedule != "curriculum_cosine" else max(tr.warmup_steps, tr.cosine_start
                                                                          or curriculum_end(cfg))
    if step < begin:
        return tr.lr
    progress = min(1.0, (step - begin) / max(1, tr.steps - begin))
    floor = tr.lr * tr.min_lr_ratio
    if tr.schedule == "linear":
        return tr.lr - (tr.lr - floor) * progress
    return floor + (tr.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


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
    batch of batch_size / data_shards samples per shard this process draws, each from a generator
    seeded by (data_seed, shard, step), so no process needs another's stream (lengthgen.training.distributed).
    With a finite training set (train.dataset_size), the step's batch of it; IDs still drawn from `data`."""
    tr, per_sample = cfg.train, cfg.train.length_sampling == "per_sample"
    if finite is not None:
        return [transform(finite.batch(step), data)]
    if tr.data_shards == 1:
        batch = sample_batch(task, tr.batch_size, cfg.task.train_min, high, data, per_sample)
        return [transform(batch, data)]  # position IDs drawn from the data stream too
    batches = []
    for shard in shards:
        stream = torch.Generator().manual_seed(shard_seed("data", tr.data_seed, shard, step))
        batch = sample_batch(task, tr.batch_size // tr.data_shards, cfg.task.train_min, high, stream, per_sample)
        batches.append(transform(batch, stream))
    return batches


def backward(loss_of, batches: list[Batch], cfg: Config, step: int, shards: range,
             device: torch.device) -> torch.Tensor:
    """Gradients of the mean of the batches' losses (DDP averages them over processes); returns
    that mean. A shard's dropout is seeded by (model_seed, shard, step): the same masks whichever
    process draws the shard."""
    total = torch.zeros((), device=device)
    for i, (shard, batch) in enumerate(zip(shards, batches)):
        if cfg.train.data_shards > 1:
            torch.manual_seed(shard_seed("dropout", cfg.train.model_seed, shard, step))
        with no_sync(loss_of, last=i == len(batches) - 1):
            with autocast(device, cfg.train.precision):
                loss = loss_of(batch.to(device))
            (loss / len(batches)).backward()
        total += loss.detach()
    return total / len(batches)


def check_is_folder(folder: Path) -> None:
    """Refuse a run folder path that is a file or lies under one (mkdir and iterdir would crash)."""
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
        raise UserError(f"cannot make run folder {folder}: {err.strerror}; give a folder you can write (--out)") from None


def resumed_config(folder: Path) -> tuple[Config, bool]:
    """The config `train --resume` continues with, and whether there is a checkpoint to continue
    from. A run stopped before its first checkpoint (Ctrl-C, a kill, a crash) holds its config.toml
    and nothing else of value: it starts again from step 0 with that config."""
    check_is_folder(folder)
    path = checkpoint.latest(folder) if folder.is_dir() else None
    if path is not None:
        return from_dict(checkpoint.read_state(path)["config"]), True
    if not (folder / "config.toml").is_file():
        raise UserError(f"cannot resume: {folder} holds no run (no checkpoint and no config.toml)")
    if not unstarted(folder):
        kept = ", ".join(sorted(p.name for p in folder.iterdir()))
        raise UserError(f"cannot resume: {folder} has no checkpoint but holds {kept}; "
                        "not overwriting it (--force starts the run afresh)")
    return load(folder / "config.toml"), False


def decay_params(model: torch.nn.Module, decay_all: bool = False) -> list[dict]:
    """Weight decay on matrices only (not on biases, norms), or on every parameter."""
    params = [p for p in model.parameters() if p.requires_grad]
    if decay_all:
        return [{"params": params}]
    return [{"params": [p for p in params if p.dim() >= 2]},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]


def train(cfg: Config, folder: Path, resume: bool = False, force: bool = False, progress: bool = True) -> dict:
    """Train the run in `folder`; returns a summary dict. Resumes from the latest checkpoint.
    Under torchrun, one of the processes of a data-parallel run (lengthgen.training.distributed)."""
    folder = Path(folder)
    ranks = Ranks.from_env()
    restart = False
    if resume:  # the run's own config wins: the data stream and schedule depend on it
        cfg, resume = resumed_config(folder)
        restart = not resume
        if restart and ranks.main:
            print(f"note: {folder} has no checkpoint (stopped before its first one); "
                  "training it from step 0 with its saved config", file=sys.stderr)
    device = ranks.device(pick_device(cfg.train.device))
    check_precision(device, cfg.train.precision)
    ranks.join(device)
    cfg = ranks.sharded(cfg, resume)
    trackers.check_installed(cfg.train.log_to)
    task, method = task_of(cfg.task), get_method(cfg.method, cfg)
    check_fits(cfg, task.vocab_size, longest_sequence(cfg), device)  # sizes that cannot fit: refused now
    if not resume:  # made only once the device can serve the config, by one process
        ranks.first(lambda: prepare_run_dir(folder, force or restart))
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    transform = build_transform(cfg.train.position_transform, cfg.train.position_transform_options)
    fixed_set = training_set(cfg, task)  # None: fresh samples every step
    torch.manual_seed(cfg.train.model_seed)
    model = method.build_model(cfg, task).to(device)
    ema = copy.deepcopy(model).requires_grad_(False) if cfg.train.ema > 0 else None
    tr = cfg.train
    optimizer = torch.optim.AdamW(decay_params(model, tr.decay_all), lr=tr.lr, betas=tuple(tr.betas), weight_decay=tr.weight_decay)
    data = torch.Generator().manual_seed(tr.data_seed)
    step, trained_seconds = 0, 0.0
    metrics_path = folder / "metrics.jsonl"
    if resume:
        path = checkpoint.latest(folder)
        state = checkpoint.read_state(path)
        digests = state.get("sha256")
        checkpoint.load_weights(model, path / "model.safetensors", digests)
        if ema is not None:
            checkpoint.load_weights(ema, path / "ema.safetensors", digests)
        checkpoint.load_optimizer(optimizer, path / "optimizer.pt", digests)
        checkpoint.restore_rng(path, state, data)
        step = state["step"]
        if ranks.main:
            trained_seconds = _truncate_metrics(metrics_path, step)  # drop lines logged after the checkpoint
    elif ranks.main:  # one process writes the run folder
        (folder / "config.toml").write_text(to_toml(cfg))
        if hasattr(task, "save"):  # what the run read beyond its config (a trained tokenizer)
            task.save(folder)

    def save() -> None:
        state = {"config": to_dict(cfg), "data_rng": checkpoint.encode_state(data.get_state()),
                 "torch_rng": checkpoint.encode_state(torch.get_rng_state()), "finished": step >= tr.steps}
        checkpoint.save(folder, step, model, optimizer, ema, state)

    model.train()
    compiled = tr.compile and compile_blocks(model, device)  # in place: the EMA and checkpoints see no change
    graphs_before = compilations()  # the process may have compiled before (tests, scripts)
    loss_of, shards = ranks.wrap(method, model), ranks.shards(tr.data_shards)
    sinks = trackers.Sinks(tr.log_to if ranks.main else [], folder, to_dict(cfg), step)
    bar = tqdm(total=tr.steps, initial=step, disable=not progress or not ranks.main, dynamic_ncols=True,
               mininterval=1.0)
    loss_sum = torch.zeros((), device=device)
    finite = torch.ones((), dtype=torch.bool, device=device)
    shown_tests = {}  # the latest tests during training, kept on the progress bar between them
    # "time" in metrics.jsonl counts training seconds across resumes, not the time the run was stopped
    window_start, window_steps, window_samples = time.perf_counter(), 0, 0
    start_time = window_start - trained_seconds
    try:  # out of memory or disk: one line saying what to change and which checkpoint is kept
        with (metrics_path.open("a") if ranks.main else contextlib.nullcontext()) as log, contextlib.closing(sinks):
            while step < tr.steps:
                high = curriculum_max(cfg, step)
                batches = draw_batches(cfg, task, transform, step, high, data, shards, fixed_set)
                lr = learning_rate(cfg, step)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                optimizer.zero_grad(set_to_none=True)
                try:
                    loss = backward(loss_of, batches, cfg, step, shards, device)
                except Exception as err:  # a block that fails to compile runs eagerly from here on
                    if not (compiled and compile_failed(err)):
                        raise
                    fall_back(model, err)
                    compiled = False
                    optimizer.zero_grad(set_to_none=True)
                    loss = backward(loss_of, batches, cfg, step, shards, device)
                if tr.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), tr.grad_clip)
                optimizer.step()
                if ema is not None and step + 1 >= tr.ema_start:  # the EMA starts as the weights after step ema_start
                    with torch.no_grad():
                        if step + 1 == tr.ema_start:
                            torch._foreach_copy_(list(ema.parameters()), list(model.parameters()))
                        else:
                            torch._foreach_lerp_(list(ema.parameters()), list(model.parameters()), 1 - tr.ema)
                step += 1
                # accumulate on the device: no host sync per step on GPUs
                loss_sum += loss
                finite &= torch.isfinite(loss)
                window_steps += 1
                window_samples += sum(map(len, batches))
                last = step == tr.steps
                if last:  # e.g. fit a probe on the trained model, in the weights that are tested
                    for trained in (model, ema) if ema is not None else (model,):
                        method.finish(trained, cfg, task, device)
                tested = tr.test_interval > 0 and (due(cfg, step) or last)
                if step % tr.log_interval == 0 or step % tr.checkpoint_interval == 0 or last or tested:
                    # every process's losses and samples (the same tensors in a single process)
                    losses, finite_count, samples = ranks.summed(loss_sum, finite, torch.tensor(
                        float(window_samples), device=device))
                    if int(finite_count) < ranks.world:
                        bar.close()
                        good = checkpoint.latest(folder)
                        kept = f"the last good checkpoint {good} is kept" if good else "no checkpoint had been written"
                        raise TrainingDiverged(f"loss became NaN or inf at or before step {step}; training stopped, {kept}")
                    elapsed = time.perf_counter() - window_start
                    row = {"step": step, "loss": float(losses) / (window_steps * ranks.world), "lr": lr, "max_length": high,
                           "samples_per_s": float(samples) / max(elapsed, 1e-9), "time": time.perf_counter() - start_time}
                    if compiled:  # graphs compiled so far: a number that keeps growing means recompiling
                        row["compiled_graphs"] = compilations() - graphs_before
                    if tested and ranks.main:  # its seconds are not training time
                        began = time.perf_counter()
                        tested_weights = ema if ema is not None and step >= tr.ema_start else model
                        row.update(run_tests(cfg, task, method, tested_weights, high, device))
                        start_time += time.perf_counter() - began
                    if ranks.main:
                        log.write(json.dumps(row) + "\n")
                        log.flush()
                        sinks.log(row)
                    shown_tests.update({k: f"{v:.3f}" for k, v in row.items() if k.startswith(PREFIX)})
                    bar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{lr:.2e}", len=high, sps=f"{row['samples_per_s']:.0f}",
                                    **shown_tests)
                    loss_sum.zero_()
                    window_start, window_steps, window_samples = time.perf_counter(), 0, 0
                    if ranks.main and (step % tr.checkpoint_interval == 0 or last):
                        save()
                bar.update(1)
    except (MemoryError, RuntimeError, OSError) as err:
        bar.close()
        fault = resource_fault(err, cfg, folder, step)
        if fault is None:
            raise
        raise fault from None
    bar.close()
    ranks.barrier()  # every process returns once the last checkpoint is written
    return {"step": step, "folder": str(folder), "device": str(device)}


def resource_fault(err: BaseException, cfg: Config, folder: Path, step: int) -> ResourceError | None:
    """Running out of memory or disk at `step` as one line, with what to change and the checkpoint
    that is kept (checkpoints are written atomically: a failed one is never `latest`)."""
    good = checkpoint.latest(folder) if (folder / "checkpoints").is_dir() else None
    kept = (f"the last complete checkpoint, {good.name}, is kept (lengthgen train --resume --out {folder} "
            "continues from it)" if good else "no checkpoint had been written")
    if is_out_of_memory(err):
        return ResourceError(f"out of memory at step {step + 1} ({oom_detail(err)}); lower "
                             f"train.batch_size (now {cfg.train.batch_size}) or the model's size, or free memory; {kept}")
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
