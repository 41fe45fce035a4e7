"""One run of a reproduction, as a worker runs it: train (or resume, or skip), then evaluate.

`run_job` (or, seeds stacked, `run_group`) is what the local process pool (lengthgen.reproduction.runner) and Ray
(lengthgen.reproduction.ray_runner) run for each job; `already_done` lets the reproducing
process skip a finished run without starting a worker. A worker process imports this
module, not the runner: it loads what a run needs (torch, the trainer, the evaluator) and
not the progress line or the report.
"""
from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import torch

from lengthgen.config.schema import RUNTIME_KEYS, EvalConfig, flat, parse_lengths, read, to_dict
from lengthgen.errors import UserError
from lengthgen.evaluation.during_training import training_tests
from lengthgen.evaluation.evaluate import evaluate_run
from lengthgen.evaluation.settings import EvalSettings
from lengthgen.reproduction.grid import Job
from lengthgen.results.rows import LABELS, outdated, read_per_step, read_rows, relabel
from lengthgen.runtime import checkpoint
from lengthgen.runtime.run_folders import unstarted
from lengthgen.training.stacked_seeds import train_stacked
from lengthgen.training.trainer import is_finished, train


def config_difference(folder: Path, cfg) -> str | None:
    """How the run saved in `folder` differs from `cfg` (first key), or None.
    A reproduction skips finished runs by folder name, so without this check a
    different --set or preset would silently mix runs of two configs."""
    saved = folder / "config.toml"
    if not saved.is_file():
        return None
    old, new = flat(to_dict(read(saved))), flat(to_dict(cfg))  # data only: the run's parts are not built for it
    for key in sorted(set(old) | set(new)):
        if key not in RUNTIME_KEYS and old.get(key) != new.get(key):
            return f"{key} is {old.get(key)!r} there, {new.get(key)!r} here"
    return None


def job_evaluation(job: Job, ev: EvalConfig) -> EvalSettings:
    """How a reproduction evaluates a job's run (`ev` its [eval] section): at eval.lengths, with
    --samples (else eval.samples), its arm's stop rules and per_step, its [[evaluate]] sweep (else
    eval.sweep), without a progress bar."""
    return EvalSettings(lengths=parse_lengths(ev.lengths), samples=job.samples or ev.samples, stops=job.stops,
                        per_step=job.per_step, sweep=job.sweep or None, progress=False)


def eval_settings(job: Job, ev: EvalConfig) -> dict:
    """What a run's evaluation (`job_evaluation`) depends on beyond its config; recorded in eval.done."""
    settings = {"samples": job.samples or ev.samples, "lengths": parse_lengths(ev.lengths),
                "stops": job.stops, "per_step": job.per_step}
    if job.sweep:  # a grid's [[evaluate]] sweep (recorded only where there is one: older eval.done files stay current)
        settings["sweep"] = job.sweep
    if ev.token_contexts:  # the per-token files too (their settings are the run's config, checked apart)
        settings["token_files"] = ["token_loss.csv"] + (["dependence.csv"] if ev.dependence else [])
    return settings


def evaluation_current(folder: Path, settings: dict) -> bool:
    """eval.done records these settings, and eval.csv (and per_step.csv) are there and readable."""
    try:
        if json.loads((folder / "eval.done").read_text()) != settings:
            return False  # "ok" from before settings were recorded is not JSON: evaluated again
        if settings["per_step"]:
            read_per_step(folder / "per_step.csv")
        if not all((folder / name).is_file() for name in settings.get("token_files", [])):
            return False
        return bool(read_rows(folder / "eval.csv")) and not outdated(folder / "eval.csv")  # a metric renamed since
    except (OSError, ValueError, UserError):  # missing or unreadable
        return False


def set_aside_if_unreadable(path: Path) -> None:
    """Move an unreadable eval.csv aside (kept, never deleted): evaluating the run again would
    otherwise refuse to merge into it."""
    try:
        if path.exists():
            read_rows(path)
    except UserError as err:
        aside = path.with_name(f"{path.name}.unreadable")
        path.replace(aside)
        print(f"note: {err}; moved it to {aside}", file=sys.stderr)


def check_config(folder: Path, cfg) -> None:
    difference = config_difference(folder, cfg)
    if difference:
        raise UserError(f"{folder} holds a run of another config ({difference}); "
                        "use another --out or delete that folder")


def resumable(folder: Path) -> bool:
    """Whether an unfinished run continues from a checkpoint (else it starts afresh)."""
    resume = folder.is_dir() and checkpoint.latest(folder) is not None
    if not resume and not unstarted(folder):  # e.g. checkpoints pruned to save disk: keep its results
        kept = ", ".join(sorted(p.name for p in folder.iterdir()))
        raise UserError(f"{folder} has no checkpoint but holds {kept}; not overwriting it: "
                        "move or delete that folder to train the run again")
    return resume


def run_job(job: Job) -> dict:
    """Train (or resume, or skip) and evaluate one run; never raises."""
    folder = Path(job.folder)
    start = time.perf_counter()
    try:
        run = job.assembled()  # checked by plan: its parts built, once
        cfg = run.cfg
        check_config(folder, cfg)
        settings, done = eval_settings(job, cfg.eval), folder / "eval.done"
        finished = is_finished(folder)
        skipped = finished and evaluation_current(folder, settings)
        if not skipped:
            torch.set_num_threads(job.threads)
        if not finished:
            resume = resumable(folder)
            train(run, folder, resume=resume, force=not resume, progress=False, hooks=training_tests)
        labels = folder / LABELS  # the row labels, written after training (which may start the folder afresh)
        if not labels.is_file() or json.loads(labels.read_text() or "null") != job.labels:
            labels.write_text(json.dumps(job.labels) + "\n")
            if skipped:
                relabel(folder)
        if not skipped:
            done.unlink(missing_ok=True)  # an interrupted evaluation must not look finished
            set_aside_if_unreadable(folder / "eval.csv")
            evaluate_run(folder, job_evaluation(job, cfg.eval))
            done.write_text(json.dumps(settings) + "\n")
        return {"folder": job.folder, "ok": True, "seconds": time.perf_counter() - start, "skipped": skipped}
    except BaseException as err:  # report any failure of this run and let the others go on
        return {"folder": job.folder, "ok": False, "seconds": time.perf_counter() - start,
                "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}


def run_group(jobs: list[Job]) -> list[dict]:
    """The seeds of one configuration (`reproduce --stack-seeds`): the unfinished ones trained as
    one stacked model (lengthgen.accel.stacked), then each evaluated by run_job; never raises."""
    start = time.perf_counter()
    try:
        todo = [job for job in jobs if not is_finished(Path(job.folder))]
        if len(todo) > 1:
            runs = [job.assembled() for job in todo]
            for job, run in zip(todo, runs):
                check_config(Path(job.folder), run.cfg)
            torch.set_num_threads(todo[0].threads)
            train_stacked(runs, [Path(job.folder) for job in todo], [resumable(Path(job.folder)) for job in todo],
                          force=True, progress=False, hooks=training_tests)
    except BaseException as err:  # every seed of the group reports it; the other groups go on
        return [{"folder": job.folder, "ok": False, "seconds": time.perf_counter() - start,
                 "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()} for job in jobs]
    return [run_job(job) for job in jobs]


def seed_groups(jobs: list[Job]) -> list[list[Job]]:
    """Jobs grouped by everything but their seeds, in planning order."""
    groups: dict[str, list[Job]] = {}
    for job in jobs:
        cfg = {**job.config, "train": {k: v for k, v in job.config.get("train", {}).items() if k != "model_seed"},
               "data": {k: v for k, v in job.config.get("data", {}).items() if k != "seed"}}
        groups.setdefault(json.dumps([job.task, job.arm, job.labels, cfg], sort_keys=True, default=str), []).append(job)
    return list(groups.values())


def already_done(job: Job) -> bool:
    """Whether run_job would skip this run: trained, and evaluated with these settings. (Any
    doubt, e.g. an unreadable file, is False: the worker finds and reports what is wrong.)"""
    folder = Path(job.folder)
    if not (folder / "eval.done").is_file():
        return False
    try:
        return is_finished(folder) and evaluation_current(folder, eval_settings(job, job.loaded().eval))
    except Exception:
        return False
