"""`lengthgen reproduce PAPER`: every run of a paper's grid, then one report.

A reproduction is declared in experiments/<paper>/grid.toml (lengthgen.reproduce.grid):
tasks with a preset per scale, arms (config overrides + how to evaluate them),
optional axes, seeds and the report's layout. Each run is trained from its
task's preset with its arm's and axes' overrides, evaluated at the preset's
test lengths, and aggregated into DIR/report.md, DIR/results.csv and figures.
Independent runs go to worker processes, or with `--backend ray` to Ray tasks on a
cluster (lengthgen.reproduce.ray_runner), the same job either way. A run that has finished training is
not trained again, and its evaluation is kept when eval.done records the same
evaluation settings and eval.csv is readable (such a run is skipped before any worker
starts); one with a checkpoint resumes, so
an interrupted reproduction continues where it stopped; a failing run is
reported and does not stop the others.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import shlex
import signal
import sys
import threading
import time
import traceback
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

from tqdm.auto import tqdm

from lengthgen.config.presets import load, load_saved
from lengthgen.config.schema import PER_RUN_KEYS, RUNTIME_KEYS, flat, from_data, parse_lengths, parse_override, to_dict
from lengthgen.errors import RunsFailed, UserError
from lengthgen.results.metrics_log import METRICS_LOG, PREFIX
from lengthgen.results.rows import LABELS
from lengthgen.reproduce import grid as grids
from lengthgen.reproduce.grid import Job
from lengthgen.runtime.run_folders import OutLock, check_overwritable, unstarted

REPRODUCTION_FILES = ("report.md", "results.csv", "timing.csv", "failures.txt")  # written into --out


def config_difference(folder: Path, cfg) -> str | None:
    """How the run saved in `folder` differs from `cfg` (first key), or None.
    A reproduction skips finished runs by folder name, so without this check a
    different --set or preset would silently mix runs of two configs."""
    saved = folder / "config.toml"
    if not saved.is_file():
        return None
    old, new = flat(to_dict(load_saved(saved))), flat(to_dict(cfg))
    for key in sorted(set(old) | set(new)):
        if key not in RUNTIME_KEYS and old.get(key) != new.get(key):
            return f"{key} is {old.get(key)!r} there, {new.get(key)!r} here"
    return None


def write_timing(path: Path, results: list[dict]) -> None:
    """run,ok,seconds of the invocation that trained or evaluated each run (plans the next
    grid). A run this invocation only skipped keeps its earlier row, so re-running a
    finished reproduction to rebuild its report does not erase the measured times."""
    rows = {}
    if path.is_file():
        rows = {line.split(",", 1)[0]: line for line in path.read_text().splitlines()[1:] if line}
    for r in results:
        name = Path(r["folder"]).name
        if not (r.get("skipped") and name in rows):
            rows[name] = f"{name},{r['ok']},{r['seconds']:.1f}"
    path.write_text("run,ok,seconds\n" + "".join(rows[name] + "\n" for name in sorted(rows)))


def eval_settings(job: Job, cfg) -> dict:
    """What a run's evaluation depends on beyond its config; recorded in eval.done."""
    settings = {"samples": job.samples or cfg.eval.samples, "lengths": parse_lengths(cfg.eval.lengths),
                "stops": job.stops, "per_step": job.per_step}
    if cfg.eval.token_contexts:  # the per-token files too (their settings are the run's config, checked apart)
        settings["token_files"] = ["token_loss.csv"] + (["dependence.csv"] if cfg.eval.dependence else [])
    return settings


def evaluation_current(folder: Path, settings: dict) -> bool:
    """eval.done records these settings, and eval.csv (and per_step.csv) are there and readable."""
    from lengthgen.results.rows import read_per_step, read_rows

    try:
        if json.loads((folder / "eval.done").read_text()) != settings:
            return False  # "ok" from before settings were recorded is not JSON: evaluated again
        if settings["per_step"]:
            read_per_step(folder / "per_step.csv")
        if not all((folder / name).is_file() for name in settings.get("token_files", [])):
            return False
        return bool(read_rows(folder / "eval.csv"))
    except (OSError, ValueError, UserError):  # missing or unreadable
        return False


def set_aside_if_unreadable(path: Path) -> None:
    """Move an unreadable eval.csv aside (kept, never deleted): evaluating the run again would
    otherwise refuse to merge into it."""
    from lengthgen.results.rows import read_rows

    try:
        if path.exists():
            read_rows(path)
    except UserError as err:
        aside = path.with_name(f"{path.name}.unreadable")
        path.replace(aside)
        print(f"note: {err}; moved it to {aside}", file=sys.stderr)


def run_job(job: Job) -> dict:
    """Train (or resume, or skip) and evaluate one run; never raises."""
    import torch

    from lengthgen.evaluation.evaluate import evaluate_run

    from lengthgen.results.rows import relabel
    from lengthgen.runtime import checkpoint
    from lengthgen.training.trainer import is_finished, train

    folder = Path(job.folder)
    start = time.perf_counter()
    try:
        cfg = from_data(job.config) if job.config else load(job.preset, job.overrides)  # validated by plan
        difference = config_difference(folder, cfg)
        if difference:
            raise UserError(f"{folder} holds a run of another config ({difference}); "
                            "use another --out or delete that folder")
        settings, done = eval_settings(job, cfg), folder / "eval.done"
        finished = is_finished(folder)
        skipped = finished and evaluation_current(folder, settings)
        if not skipped:
            torch.set_num_threads(job.threads)
        if not finished:
            resume = folder.is_dir() and checkpoint.latest(folder) is not None
            if not resume and not unstarted(folder):  # e.g. checkpoints pruned to save disk: keep its results
                kept = ", ".join(sorted(p.name for p in folder.iterdir()))
                raise UserError(f"{folder} has no checkpoint but holds {kept}; not overwriting it: "
                                "move or delete that folder to train the run again")
            train(cfg, folder, resume=resume, force=not resume, progress=False)
        labels = folder / LABELS  # the row labels, written after training (which may start the folder afresh)
        if not labels.is_file() or json.loads(labels.read_text() or "null") != job.labels:
            labels.write_text(json.dumps(job.labels) + "\n")
            if skipped:
                relabel(folder)
        if not skipped:
            done.unlink(missing_ok=True)  # an interrupted evaluation must not look finished
            set_aside_if_unreadable(folder / "eval.csv")
            evaluate_run(folder, settings["lengths"], settings["samples"], stops=job.stops or None,
                         per_step=job.per_step, progress=False)
            done.write_text(json.dumps(settings) + "\n")
        return {"folder": job.folder, "ok": True, "seconds": time.perf_counter() - start, "skipped": skipped}
    except BaseException as err:  # report any failure of this run and let the others go on
        return {"folder": job.folder, "ok": False, "seconds": time.perf_counter() - start,
                "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}


def already_done(job: Job) -> bool:
    """Whether run_job would skip this run: trained, and evaluated with these settings. (Any
    doubt, e.g. an unreadable file, is False: the worker finds and reports what is wrong.)"""
    from lengthgen.training.trainer import is_finished

    folder = Path(job.folder)
    if not (folder / "eval.done").is_file():
        return False
    try:
        cfg = from_data(job.config) if job.config else load(job.preset, job.overrides)
        return is_finished(folder) and evaluation_current(folder, eval_settings(job, cfg))
    except Exception:
        return False


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _exit_with(parent: int) -> None:
    """Worker initializer: end this worker once `parent` is gone, even if it was killed
    outright (SIGKILL runs no handler). An orphan is re-parented, so its parent id changes."""
    def watch():
        while os.getppid() == parent:
            time.sleep(1)
        os._exit(1)  # a run's checkpoints are written atomically; a rerun resumes from the last

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Terminate the pool's worker processes; shutdown() alone would wait for their runs."""
    if hasattr(pool, "terminate_workers"):  # Python 3.14+
        pool.terminate_workers()
        return
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.terminate()


def reproduce(paper: str, scale: str | None = None, seeds: int | None = None, tasks: list[str] | None = None,
              arms: list[str] | None = None, out: Path | None = None, workers: int = 2,
              samples: int = 0, progress: bool = True, extra: list[str] | None = None, threads: int = 0,
              backend: str = "local", address: str | None = None, gpus_per_job: float | None = None) -> Path:
    """Run `paper`'s grid (a name under experiments/ or a folder holding a grid.toml) at
    `scale` (default: cpu, or the grid's first scale) and write its report. `extra`: KEY=VALUE
    config overrides applied to every run (after the arm's). `backend`: "local" (a pool of
    `workers` processes) or "ray" (a task per run on the cluster at `address`, or on a local Ray
    instance; `gpus_per_job` GPUs each, see lengthgen.reproduce.ray_runner)."""
    from lengthgen.reporting.report import DEFAULT_LAYOUT, figure_specs, write_report

    grid = grids.find(paper)
    scale = scale or ("cpu" if "cpu" in grid.scales else grid.scales[0])
    if scale not in grid.scales:
        raise UserError(f"unknown scale {scale!r} for {grid.name}; choose from {', '.join(grid.scales)}")
    spec = grid.resolved(scale)
    seeds = spec.get("seeds", 3) if seeds is None else seeds
    if seeds < 1 or workers < 1 or threads < 0:
        raise UserError("--seeds and --workers must be >= 1, --threads >= 0")
    if samples < 0:
        raise UserError(f"--samples must be >= 1 (or 0 for the presets' own), got {samples}")
    if backend not in ("local", "ray"):
        raise UserError(f"unknown --backend {backend!r}; choose from local, ray")
    if backend != "ray" and (address is not None or gpus_per_job is not None):
        raise UserError("--address and --gpus-per-job are options of --backend ray")
    if gpus_per_job is not None and gpus_per_job < 0:
        raise UserError(f"--gpus-per-job must be >= 0, got {gpus_per_job}")
    if backend == "ray":
        from lengthgen.reproduce.ray_runner import require
        require()  # a one-line error naming the extra, before anything is planned or written
    for setting in extra or []:  # flattened, so an inline table (train={threads=1}) is caught too
        for key in flat(parse_override(setting)):
            if key in PER_RUN_KEYS:
                raise UserError(f"--set {key} is set per run by reproduce; use {PER_RUN_KEYS[key]} instead")
    chosen = {}
    for kind, given in (("tasks", tasks), ("arms", arms)):
        if given is not None and not given:
            raise UserError(f"--{kind} names no {kind[:-1]}; leave it out to run the default ones")
        given = list(dict.fromkeys(given or grid.defaults(scale, kind)))  # a name given twice is one run, not two
        bad = [c for c in given if c not in spec[kind]]
        if bad:
            raise UserError(f"unknown {kind[:-1]} {bad[0]!r} for {grid.name}; choose from {', '.join(spec[kind])}")
        chosen[kind] = given
    tasks, arms = chosen["tasks"], chosen["arms"]
    layout = {**DEFAULT_LAYOUT, **spec.get("report", {})}
    figure_specs(layout)  # a bad figure in the grid stops here, before any run
    out = Path(out or f"runs/reproduce-{grid.name}-{scale}")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a folder for the runs and the report")
    jobs = grids.plan(grid, scale, tasks, arms, seeds, out, workers, samples, extra, threads)
    if not jobs:  # every chosen task runs only other arms
        runs = "; ".join(f"{task} runs {', '.join(grid.arms_of(scale, task))}" for task in tasks)
        raise UserError(f"--tasks and --arms select no run of {grid.name} ({runs})")
    from lengthgen.config.presets import longest_sequence
    from lengthgen.runtime.devices import check_precision, pick_device
    from lengthgen.runtime.resources import check_fits
    from lengthgen.tasks import task_of
    configs = [from_data(job.config) for job in jobs]
    for device, precision in {(c.train.device, c.train.precision) for c in configs} if backend == "local" else ():
        check_precision(pick_device(device), precision)  # refused here once, not in every worker
    for cfg in configs if backend == "local" else ():  # (on a cluster, each run checks the node it lands on)
        check_fits(cfg, task_of(cfg.task).vocab_size, longest_sequence(cfg), pick_device(cfg.train.device))
    check_overwritable(out, REPRODUCTION_FILES)  # e.g. --out . in a project with a report.md of its own
    out.mkdir(parents=True, exist_ok=True)
    with OutLock(out):  # until the report is written: a second reproduce on --out stops at once
        axes = " x axis values" if any(grid.axes(scale, task) for task in tasks) else ""
        pairs = len({(job.task, job.arm) for job in jobs})  # tasks may run only some arms
        shape = f"{len(tasks)} tasks x {len(arms)} arms" if pairs == len(tasks) * len(arms) else f"{pairs} task-arm pairs"
        print(f"{len(jobs)} runs ({shape}{axes} x {seeds} seeds) in {out}/runs, "
              + (f"{workers} worker(s)" if backend == "local" else "on Ray"), file=sys.stderr)
        # Finished runs are skipped here, in this process: a worker would load torch (seconds) to
        # find nothing to do, so a rerun for the report alone starts none.
        results = [run_job(job) for job in jobs if already_done(job)]
        kept = {r["folder"] for r in results}
        todo = [job for job in jobs if job.folder not in kept]
        if kept:
            print(f"{len(kept)} of {len(jobs)} runs already trained and evaluated: kept", file=sys.stderr)
        if todo and backend == "ray":
            from lengthgen.reproduce.ray_runner import run_on_ray
            results += run_on_ray(run_job, todo, out, address, progress, gpus_per_job)
        elif todo:
            results += run_all(todo, workers, progress)
        results.sort(key=lambda r: r["folder"])  # the report does not depend on the order runs finished in
        failed = [r for r in results if not r["ok"]]
        (out / "failures.txt").write_text("".join(f"{r['folder']}\n{r['traceback']}\n" for r in failed))
        write_timing(out / "timing.csv", results)
        command = shlex.join(["lengthgen", "reproduce", paper, "--scale", scale, "--seeds", str(seeds),
                              "--tasks", ",".join(tasks), "--arms", ",".join(arms), "--out", str(out)]
                             + (["--samples", str(samples)] if samples else [])
                             + [arg for e in extra or [] for arg in ("--set", e)])
        evaluated = [Path(r["folder"]) for r in results if r["ok"]]
        if not evaluated:
            raise RunsFailed(f"every run failed ({len(failed)}); see {out / 'failures.txt'}")
        report = write_report(evaluated, out, title=f"{spec['title']}: {scale} scale", command=command,
                              failures=[r["folder"] + ": " + r["error"] for r in failed], layout=layout)
        if failed:  # the report of the others is written; the exit code still says the grid is incomplete
            raise RunsFailed(f"{len(failed)} of {len(results)} runs failed (see {out / 'failures.txt'}); "
                             f"{report} reports the other {len(evaluated)}", report)
        return report


LIVE_SECONDS = 3.0  # how often the progress line reads the running runs' logs


def last_row(path: Path) -> dict | None:
    """The last complete row of a metrics.jsonl (None if none yet), read from its tail."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = f.read().decode("utf-8", errors="replace").split("\n")[:-1]  # the last may be unfinished
    except OSError:
        return None
    for line in reversed(lines):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            return row
    return None


def live_status(running: list[Job]) -> str:
    """Each running run as `name step/steps loss L` (and its latest test at the curriculum's
    maximum), from its training log; runs that have logged nothing yet are left out."""
    parts = []
    for job in running:
        row = last_row(Path(job.folder) / METRICS_LOG)
        if row is None:
            continue
        steps = job.config.get("train", {}).get("steps", "?")
        test = row.get(f"{PREFIX}max")
        parts.append(f"{Path(job.folder).name} {row['step']}/{steps} loss {row.get('loss', float('nan')):.3g}"
                     + (f" acc {test:.2f}" if isinstance(test, (int, float)) else ""))
    return " | ".join(parts)


def running_jobs(futures: dict, pending: set, workers: int) -> list[Job]:
    """The jobs that are training now. The pool marks one job more than it has workers as
    running (it queues it ahead), and that job, the last one submitted, has not started: left
    in, a finished run being checked and skipped would show as running at its last step."""
    return [job for future, job in futures.items() if future in pending and future.running()][:workers]


def run_all(jobs: list[Job], workers: int, progress: bool) -> list[dict]:
    """run_job for every job in `workers` processes; the results in the order they finish."""
    results, start = [], time.perf_counter()
    context = multiprocessing.get_context("spawn")  # fresh interpreters: no shared torch threads or state
    # Interrupted (Ctrl-C, or SIGTERM from a scheduler), the workers stop with this process:
    # left running, they would keep writing run folders that a rerun of the command resumes.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_exit_with,
                               initargs=(os.getpid(),))
    try:
        futures = {pool.submit(run_job, job): job for job in jobs}
        pending = set(futures)
        bar = tqdm(total=len(futures), desc="runs", disable=not progress, dynamic_ncols=True)
        while pending:  # every few seconds: the runs that finished, and where the running ones are
            finished, pending = wait(pending, timeout=LIVE_SECONDS, return_when=FIRST_COMPLETED)
            for fut in finished:
                res = fut.result()
                results.append(res)
                bar.update(1)
                if not res["ok"]:
                    tqdm.write(f"run {res['folder']} failed: {res['error']}", file=sys.stderr)
            if progress:
                bar.set_postfix_str(live_status(running_jobs(futures, pending, workers)), refresh=True)
        bar.close()
    except BaseException:
        _stop_workers(pool)  # at once: finished runs are on disk, an unfinished one resumes next time
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    failed = sum(not r["ok"] for r in results)
    print(f"{len(results)} runs done in {time.perf_counter() - start:.0f} s of wall time ({failed} failed)",
          file=sys.stderr)
    return results
