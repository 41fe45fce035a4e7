"""`lengthgen reproduce looped`: every run of a paper's comparison, then one report.

A reproduction is a grid of runs (task x method x seed). Each run is trained
from the task's preset (experiments/looped/<scale>/<task>.toml) with the
method's overrides (experiments/looped/methods.toml), evaluated at the
preset's test lengths, and aggregated into DIR/report.md, DIR/results.csv and
figures. Independent runs go to worker processes. A run that has finished
training is not trained again, and its evaluation is kept when eval.done records
the same evaluation settings and eval.csv is readable; one with a checkpoint
resumes, so an interrupted reproduction continues where it stopped; a failing
run is reported and does not stop the others.
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
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from .config import load, parse_lengths, parse_override, to_dict, tomllib
from .errors import UserError
from .methods import METHODS

ROOT = Path(__file__).resolve().parents[1] / "experiments"
PAPERS = {"looped": {"tasks": ["parity", "copy", "addition", "binary_sum", "multiplication", "unique_set"],
                     "methods": ["looped", "ntp", "looped-wo-injection"],
                     "title": "Looped Transformers (Fan et al., ICLR 2025)"}}
SCALES = ("cpu", "paper")


@dataclass
class Job:
    task: str
    method: str
    seed: int
    preset: str
    overrides: list[str]
    folder: str
    stops: list[str] = field(default_factory=list)  # stop rules to evaluate (looped methods)
    per_step: bool = False
    samples: int = 0  # test samples per length; 0 = the preset's eval.samples
    threads: int = 1


RUNTIME_KEYS = {"train.threads", "train.device"}  # how a run executes, not what it computes
# set per run by the grid itself (--seeds, --threads): a --set of these would be overridden
PER_RUN_KEYS = {"train.model_seed": "--seeds", "train.data_seed": "--seeds", "train.threads": "--threads"}


def _flat(data: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in data.items():
        out.update(_flat(value, f"{prefix}{key}.") if isinstance(value, dict) and key != "options"
                   else {f"{prefix}{key}": value})
    return out


def config_difference(folder: Path, cfg) -> str | None:
    """How the run saved in `folder` differs from `cfg` (first key), or None.
    A reproduction skips finished runs by folder name, so without this check a
    different --set or preset would silently mix runs of two configs."""
    saved = folder / "config.toml"
    if not saved.is_file():
        return None
    old, new = _flat(to_dict(load(saved))), _flat(to_dict(cfg))
    for key, value in new.items():
        if key not in RUNTIME_KEYS and old.get(key) != value:
            return f"{key} is {old.get(key)!r} there, {value!r} here"
    return None


def method_overrides(paper: str, scale: str, method: str, block_depth: int) -> list[str]:
    """--set strings for `method` from experiments/<paper>/methods.toml."""
    path = ROOT / paper / "methods.toml"
    table = tomllib.loads(path.read_text()).get(scale, {}).get(method)
    if table is None:
        raise UserError(f"{path} has no [{scale}.{method}] table")
    sets = [f"method={method}"]
    for key, value in table.items():
        if key == "depth_multiplier":  # e.g. ntp: a plain stack k times the looped block's depth
            sets.append(f"model.n_layer={int(value) * block_depth}")
        else:
            sets.append(f"{key}={value!r}" if isinstance(value, str) else f"{key}={str(value).lower()}")
    return sets


def plan(paper: str, scale: str, tasks: list[str], methods: list[str], seeds: int, out: Path,
         workers: int, samples: int = 0, extra: list[str] | None = None, threads: int = 0) -> list[Job]:
    """`threads`: torch threads per run; 0 shares the machine's cores among the workers."""
    jobs = []
    threads = threads or max(1, (os.cpu_count() or 1) // workers)
    for task in tasks:
        preset = ROOT / paper / scale / f"{task}.toml"
        if not preset.is_file():
            raise UserError(f"no preset {preset} for task {task!r} at scale {scale!r}")
        base = load(preset)
        for method in methods:
            sets = method_overrides(paper, scale, method, base.model.n_layer) + list(extra or [])
            load(preset, sets)  # fail now, in the parent, on a bad preset or override
            looped = method.startswith("looped")
            stops = (["oracle", "confidence", "confidence-per-sample"] if task in ("parity", "copy") else ["oracle"]) \
                if looped else []
            for seed in range(seeds):
                jobs.append(Job(task, method, seed, str(preset),
                                sets + [f"train.model_seed={seed}", f"train.data_seed={seed}", f"train.threads={threads}"],
                                str(out / "runs" / f"{task}-{method}-s{seed}"), stops,
                                per_step=looped and task in ("parity", "copy"), samples=samples, threads=threads))
    return jobs


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
    return {"samples": job.samples or cfg.eval.samples, "lengths": parse_lengths(cfg.eval.lengths),
            "stops": job.stops, "per_step": job.per_step}


def evaluation_current(folder: Path, settings: dict) -> bool:
    """eval.done records these settings, and eval.csv (and per_step.csv) are there and readable."""
    from .evaluate import read_per_step, read_rows

    try:
        if json.loads((folder / "eval.done").read_text()) != settings:
            return False  # "ok" from before settings were recorded is not JSON: evaluated again
        if settings["per_step"]:
            read_per_step(folder / "per_step.csv")
        return bool(read_rows(folder / "eval.csv"))
    except (OSError, ValueError, UserError):  # missing or unreadable
        return False


def set_aside_if_unreadable(path: Path) -> None:
    """Move an unreadable eval.csv aside (kept, never deleted): evaluating the run again would
    otherwise refuse to merge into it."""
    from .evaluate import read_rows

    try:
        if path.exists():
            read_rows(path)
    except UserError as err:
        aside = path.with_name(f"{path.name}.unreadable")
        path.replace(aside)
        print(f"note: {err}; moved it to {aside}", file=sys.stderr)


# What a training killed before its first checkpoint leaves (checkpoint.save writes into
# hidden .tmp folders): such a folder holds no result and may be started afresh.
UNSTARTED = {"config.toml", "metrics.jsonl", "checkpoints"}


def unstarted(folder: Path) -> bool:
    """`folder` is missing or holds only what UNSTARTED names, with no checkpoint in it."""
    if not folder.exists():
        return True
    if any(p.name not in UNSTARTED for p in folder.iterdir()):
        return False
    ckpts = folder / "checkpoints"
    return not ckpts.exists() or all(p.name.startswith(".") and p.name.endswith(".tmp") for p in ckpts.iterdir())


def run_job(job: Job) -> dict:
    """Train (or resume, or skip) and evaluate one run; never raises."""
    import torch

    from . import checkpoint
    from .evaluate import evaluate_run
    from .train import is_finished, train

    torch.set_num_threads(job.threads)
    folder = Path(job.folder)
    start = time.perf_counter()
    try:
        cfg = load(job.preset, job.overrides)
        difference = config_difference(folder, cfg)
        if difference:
            raise UserError(f"{folder} holds a run of another config ({difference}); "
                            "use another --out or delete that folder")
        settings, done = eval_settings(job, cfg), folder / "eval.done"
        finished = is_finished(folder)
        skipped = finished and evaluation_current(folder, settings)
        if not finished:
            resume = folder.is_dir() and checkpoint.latest(folder) is not None
            if not resume and not unstarted(folder):  # e.g. checkpoints pruned to save disk: keep its results
                kept = ", ".join(sorted(p.name for p in folder.iterdir()))
                raise UserError(f"{folder} has no checkpoint but holds {kept}; not overwriting it: "
                                "move or delete that folder to train the run again")
            train(cfg, folder, resume=resume, force=not resume, progress=False)
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


def reproduce(paper: str, scale: str = "cpu", seeds: int = 3, tasks: list[str] | None = None,
              methods: list[str] | None = None, out: Path | None = None, workers: int = 2,
              samples: int = 0, progress: bool = True, extra: list[str] | None = None, threads: int = 0) -> Path:
    """`extra`: KEY=VALUE config overrides applied to every run (after the method's)."""
    if paper not in PAPERS:
        raise UserError(f"unknown paper {paper!r}; choose from {', '.join(PAPERS)}")
    if scale not in SCALES:
        raise UserError(f"unknown scale {scale!r}; choose from {', '.join(SCALES)}")
    if seeds < 1 or workers < 1 or threads < 0:
        raise UserError("--seeds and --workers must be >= 1, --threads >= 0")
    if samples < 0:
        raise UserError(f"--samples must be >= 1 (or 0 for the presets' own), got {samples}")
    for setting in extra or []:  # flattened, so an inline table (train={threads=1}) is caught too
        for key in _flat(parse_override(setting)):
            if key in PER_RUN_KEYS:
                raise UserError(f"--set {key} is set per run by reproduce; use {PER_RUN_KEYS[key]} instead")
    spec = PAPERS[paper]
    chosen = {}
    for name, given, valid in (("task", tasks, spec["tasks"]), ("method", methods, list(METHODS))):
        if given is not None and not given:
            raise UserError(f"--{name}s names no {name}; leave it out to run all of them")
        given = list(dict.fromkeys(given or spec[f"{name}s"]))  # a name given twice is one run, not two
        bad = [c for c in given if c not in valid]
        if bad:
            raise UserError(f"unknown {name} {bad[0]!r} for {paper}; choose from {', '.join(valid)}")
        chosen[name] = given
    tasks, methods = chosen["task"], chosen["method"]
    out = Path(out or f"runs/reproduce-{paper}-{scale}")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a folder for the runs and the report")
    jobs = plan(paper, scale, tasks, methods, seeds, out, workers, samples, extra, threads)
    from .train import check_precision, pick_device
    settings = {(c.train.device, c.train.precision) for c in (load(job.preset, job.overrides) for job in jobs)}
    for device, precision in settings:  # refuse here once, not in every worker
        check_precision(pick_device(device), precision)
    out.mkdir(parents=True, exist_ok=True)
    print(f"{len(jobs)} runs ({len(tasks)} tasks x {len(methods)} methods x {seeds} seeds) in {out}/runs, "
          f"{workers} worker(s)", file=sys.stderr)
    results, start = [], time.perf_counter()
    context = multiprocessing.get_context("spawn")  # fresh interpreters: no shared torch threads or state
    # Interrupted (Ctrl-C, or SIGTERM from a scheduler), the workers stop with this process:
    # left running, they would keep writing run folders that a rerun of the command resumes.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_exit_with,
                               initargs=(os.getpid(),))
    try:
        futures = [pool.submit(run_job, job) for job in jobs]
        for fut in tqdm(as_completed(futures), total=len(futures), desc="runs", disable=not progress):
            res = fut.result()
            results.append(res)
            if not res["ok"]:
                tqdm.write(f"run {res['folder']} failed: {res['error']}", file=sys.stderr)
    except BaseException:
        _stop_workers(pool)  # at once: finished runs are on disk, an unfinished one resumes next time
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
    failed = [r for r in results if not r["ok"]]
    (out / "failures.txt").write_text("".join(f"{r['folder']}\n{r['traceback']}\n" for r in failed))
    write_timing(out / "timing.csv", results)
    print(f"{len(results)} runs done in {time.perf_counter() - start:.0f} s of wall time "
          f"({len(failed)} failed); per run: {out / 'timing.csv'}", file=sys.stderr)
    from .report import write_report
    command = shlex.join(["lengthgen", "reproduce", paper, "--scale", scale, "--seeds", str(seeds),
                          "--tasks", ",".join(tasks), "--methods", ",".join(methods), "--out", str(out)]
                         + (["--samples", str(samples)] if samples else [])
                         + [arg for e in extra or [] for arg in ("--set", e)])
    evaluated = [Path(r["folder"]) for r in results if r["ok"]]
    if not evaluated:
        raise UserError(f"every run failed; see {out / 'failures.txt'}")
    path = write_report(evaluated, out, title=f"{spec['title']}: {scale} scale", command=command,
                        failures=[r["folder"] + ": " + r["error"] for r in failed])
    return path
