"""`lengthgen reproduce PAPER`: every run of a paper's grid, then one report.

A reproduction is declared in experiments/<paper>/grid.toml (lengthgen.reproduction.grid):
tasks with a preset per scale, arms (config overrides + how to evaluate them),
optional axes, seeds and the report's layout. It is planned once (`planned`): the grid at
its scale, the tasks and arms chosen, every job with its overrides and validated config.
Each run is trained from its task's preset with its arm's and axes' overrides, evaluated at
the preset's test lengths (lengthgen.reproduction.jobs), and aggregated into DIR/report.md,
DIR/results.csv and figures. Independent runs go to worker processes, or with `--backend ray`
to Ray tasks on a cluster (lengthgen.reproduction.ray_runner), the same job either way. A run
that has finished training is not trained again, and its evaluation is kept when eval.done
records the same evaluation settings and eval.csv is readable (such a run is skipped before
any worker starts); one with a checkpoint resumes, so an interrupted reproduction continues
where it stopped; a failing run is reported and does not stop the others. The command's flags
are checked by lengthgen.cli before a reproduction is planned.
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
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass, replace
from pathlib import Path

from tqdm.auto import tqdm

from lengthgen.errors import RunsFailed, UserError
from lengthgen.plugins import load as load_plugins
from lengthgen.methods.registry import METHODS
from lengthgen.reporting.report import DEFAULT_LAYOUT, figure_specs, write_report
from lengthgen.reproduction import grid as grids
from lengthgen.reproduction import planning
from lengthgen.reproduction.grid import AtScale, Job
from lengthgen.reproduction.jobs import already_done, run_group, run_job, seed_groups
from lengthgen.reproduction.ray_runner import run_on_ray
from lengthgen.reproduction.request import ReproduceRequest
from lengthgen.results.metrics_log import METRICS_LOG, PREFIX
from lengthgen.runtime.devices import check_precision, pick_device
from lengthgen.runtime.resources import check_fits
from lengthgen.runtime.run_folders import OutLock, check_overwritable, check_reproduction_out

REPRODUCTION_FILES = ("report.md", "results.csv", "timing.csv", "failures.txt")  # written into --out


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


def _interrupt(signum, frame):
    raise KeyboardInterrupt


# Local runs on CUDA: how many share one GPU, measured by benchmarks/speed/gpu.py on an H200
# (docs/cluster.md, "Several runs per GPU"). A recorded step (train.capture) keeps the GPU busy
# 82-90 % of the time: four looped Parity runs at once trained 0.94x as fast as one. An eager step
# leaves it idle over 80 % of the time, waiting on launches: four eager runs trained 3.6x as fast.
WORKERS_PER_GPU = {"captured": 1, "eager": 4}
CPU_WORKERS = 2


def machine_gpus() -> int:
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpus_used(jobs: list[Job]) -> int:
    """GPUs the local runs train on: this machine's CUDA devices when every run's train.device
    lets it use them (auto or cuda), else 0."""
    return machine_gpus() if all(job.loaded().train.device in ("auto", "cuda") for job in jobs) else 0


def all_captured(jobs: list[Job]) -> bool:
    """Whether every run records its steps as CUDA graphs (lengthgen.accel.captured)."""
    return all(cfg.train.capture and cfg.data.shards == 1 and METHODS[cfg.method].capturable
               for cfg in (job.loaded() for job in jobs))


def default_workers(gpus: int, captured: bool = True) -> int:
    return WORKERS_PER_GPU["captured" if captured else "eager"] * gpus if gpus else CPU_WORKERS


def _start_worker(parent: int, gpus: int, counter) -> None:
    """Worker initializer: its own GPU where there are several (round robin, before CUDA starts),
    and its end with `parent`."""
    if gpus > 1:
        with counter.get_lock():
            index, counter.value = counter.value, counter.value + 1
        os.environ["CUDA_VISIBLE_DEVICES"] = str(index % gpus)
    _exit_with(parent)


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


@dataclass
class Reproduction:
    """A reproduction planned once: the grid at its scale, the request with every default filled in
    (its scale, seeds, tasks, arms, out and workers given), the report's layout, and every job."""
    paper: str
    at: AtScale
    request: ReproduceRequest
    layout: dict
    jobs: list[Job]

    @property
    def out(self) -> Path:
        """The folder of the runs (OUT/runs) and of the report."""
        return self.request.out

    def shape(self, where: str) -> str:
        """The line that says what runs, e.g. `18 runs (6 tasks x 3 arms x 1 seeds) in OUT/runs, 2 worker(s)`."""
        tasks, arms = self.request.tasks, self.request.arms
        axes = " x axis values" if any(self.at.axes(task) for task in tasks) else ""
        pairs = len({(job.task, job.arm) for job in self.jobs})  # tasks may run only some arms
        shape = (f"{len(tasks)} tasks x {len(arms)} arms" if pairs == len(tasks) * len(arms)
                 else f"{pairs} task-arm pairs")
        return f"{len(self.jobs)} runs ({shape}{axes} x {self.request.seeds} seeds) in {self.out}/runs, {where}"

    def command(self) -> str:
        """The command that reproduces this reproduction, for the report."""
        r = self.request
        return shlex.join(["lengthgen", "reproduce", self.paper, "--scale", self.at.name, "--seeds", str(r.seeds),
                           "--tasks", ",".join(r.tasks), "--arms", ",".join(r.arms), "--out", str(self.out)]
                          + (["--samples", str(r.samples)] if r.samples else [])
                          + [arg for key, values in r.axes.items() for arg in ("--axis", f"{key}={','.join(values)}")]
                          + [arg for p in r.plugins for arg in ("--plugin", p)]
                          + [arg for e in r.overrides for arg in ("--set", e)])


def planned(paper: str, request: ReproduceRequest) -> Reproduction:
    """The reproduction of `paper` as `request` asks: at its scale (default: cpu, or the grid's first
    scale) with the tasks and arms named (default: the grid's), every config validated: what the grid
    refuses is one line here, before anything is written. The plan holds the request with its
    defaults filled in, which the grid plans (lengthgen.reproduction.planning.plan)."""
    grid = grids.find(paper)
    at = grid.pick(request.scale)
    seeds = at.data.get("seeds", 3) if request.seeds is None else request.seeds
    tasks, arms = at.chosen("tasks", request.tasks), at.chosen("arms", request.arms)
    layout = {**DEFAULT_LAYOUT, **at.data.get("report", {})}
    # the grid's comparisons of arms that this reproduction runs, with the 2 seeds a test needs
    # (`--arms` or `--seeds 1` leaves the others out; `lengthgen report --compare` sets any pair)
    layout["compare"] = [pair for pair in layout.get("compare", [])
                         if seeds >= 2 and set(pair.split(",") if isinstance(pair, str) else pair) <= set(arms)]
    figure_specs(layout)  # a bad figure in the grid stops here, before any run
    out = Path(request.out or f"runs/reproduce-{grid.name}-{at.name}")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a folder for the runs and the report")
    request = replace(request, scale=at.name, seeds=seeds, tasks=tasks, arms=arms, out=out)
    jobs = planning.plan(grid, request)
    if not jobs:  # every chosen task runs only other arms
        runs = "; ".join(f"{task} runs {', '.join(at.arms_of(task))}" for task in tasks)
        raise UserError(f"--tasks and --arms select no run of {grid.name} ({runs})")
    return Reproduction(paper, at, request, layout, jobs)


def check_machine(jobs: list[Job]) -> None:
    """What this machine cannot run (bf16 without native support, a run that would not fit in
    memory), refused here once rather than in every worker."""
    runs = [job.assembled() for job in jobs]
    for device, precision in {(r.cfg.train.device, r.cfg.train.precision) for r in runs}:
        check_precision(pick_device(device), precision)
    for run in runs:
        check_fits(run.cfg, run.task.vocab_size, run.widest, pick_device(run.cfg.train.device))


def reproduce(paper: str, request: ReproduceRequest | None = None) -> Path:
    """Run `paper`'s grid (a name under experiments/ or a folder holding a grid.toml) as `request`
    asks (lengthgen.reproduction.request; None: every default) and write its report. Its backend
    "local" runs a pool of `workers` processes (None: WORKERS_PER_GPU per GPU where the runs train on
    CUDA, else CPU_WORKERS), "ray" a task per run on the cluster at `address`, or on a local Ray
    instance (lengthgen.reproduction.ray_runner). Its plugins are imported here and recorded in every
    run's config, so each worker imports them. The command checks its flags before calling this
    (lengthgen.cli.check_reproduce_flags)."""
    request = request or ReproduceRequest()
    request = replace(request, plugins=load_plugins(list(request.plugins)))  # recorded as loaded: files made absolute
    local = request.backend == "local"
    chosen = request.workers or default_workers(machine_gpus() if local else 0)
    plan = planned(paper, replace(request, workers=chosen))
    gpus = gpus_used(plan.jobs) if local else 0
    if request.workers is None and chosen != default_workers(gpus, all_captured(plan.jobs)):  # planned again, rarely
        plan = planned(paper, replace(request, workers=default_workers(gpus, all_captured(plan.jobs))))
    if local:  # on a cluster, each run checks the node it lands on
        check_machine(plan.jobs)
    with OutLock(plan.out):  # until the report is written: a second writer of --out (reproduce, report, export) stops
        check_reproduction_out(plan.out)  # never into a run folder or an export, checked under the lock
        check_overwritable(plan.out, REPRODUCTION_FILES)  # e.g. --out . in a project with a report.md of its own
        plan.out.mkdir(parents=True, exist_ok=True)
        print(plan.shape(f"{plan.request.workers} worker(s)" if local else "on Ray"), file=sys.stderr)
        # Finished runs are skipped here, in this process: a worker would load torch (seconds) to
        # find nothing to do, so a rerun for the report alone starts none.
        results = [run_job(job) for job in plan.jobs if already_done(job)]
        kept = {r["folder"] for r in results}
        todo = [job for job in plan.jobs if job.folder not in kept]
        if kept:
            print(f"{len(kept)} of {len(plan.jobs)} runs already trained and evaluated: kept", file=sys.stderr)
        if todo and request.backend == "ray":
            results += run_on_ray(run_job, todo, plan.out, request.address, request.progress, request.gpus_per_job)
        elif todo:
            results += run_all(todo, plan.request.workers, request.progress, gpus, request.stack_seeds)
        results.sort(key=lambda r: r["folder"])  # the report does not depend on the order runs finished in
        return write_results(plan, results)


def write_results(plan: Reproduction, results: list[dict]) -> Path:
    """failures.txt, timing.csv and the report of the runs that finished; RunsFailed if any failed."""
    failed = [r for r in results if not r["ok"]]
    (plan.out / "failures.txt").write_text("".join(f"{r['folder']}\n{r['traceback']}\n" for r in failed))
    write_timing(plan.out / "timing.csv", results)
    evaluated = [Path(r["folder"]) for r in results if r["ok"]]
    if not evaluated:
        raise RunsFailed(f"every run failed ({len(failed)}); see {plan.out / 'failures.txt'}")
    written = write_report(evaluated, plan.out, title=f"{plan.at.data['title']}: {plan.at.name} scale",
                           command=plan.command(), failures=[r["folder"] + ": " + r["error"] for r in failed],
                           layout=plan.layout, held=True)  # under the reproduction's OutLock
    if failed:  # the report of the others is written; the exit code still says the grid is incomplete
        raise RunsFailed(f"{len(failed)} of {len(results)} runs failed (see {plan.out / 'failures.txt'}); "
                         f"{written} reports the other {len(evaluated)}", written)
    return written


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
    units = [unit for future, unit in futures.items() if future in pending and future.running()][:workers]
    return [job for unit in units for job in (unit if isinstance(unit, list) else [unit])]  # a stacked group's every seed


def run_all(jobs: list[Job], workers: int, progress: bool, gpus: int = 0, stack_seeds: bool = False) -> list[dict]:
    """run_job for every job in `workers` processes (spread over `gpus` GPUs), or with
    `stack_seeds` run_group for each configuration's seeds; the results in the order they finish."""
    results, start = [], time.perf_counter()
    context = multiprocessing.get_context("spawn")  # fresh interpreters: no shared torch threads or state
    # Interrupted (Ctrl-C, or SIGTERM from a scheduler), the workers stop with this process:
    # left running, they would keep writing run folders that a rerun of the command resumes.
    main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_start_worker,
                               initargs=(os.getpid(), gpus, context.Value("i", 0)))
    try:
        units = seed_groups(jobs) if stack_seeds else jobs
        futures = {pool.submit(run_group if stack_seeds else run_job, unit): unit for unit in units}
        pending = set(futures)
        bar = tqdm(total=len(jobs), desc="runs", disable=not progress, dynamic_ncols=True)
        while pending:  # every few seconds: the runs that finished, and where the running ones are
            finished, pending = wait(pending, timeout=LIVE_SECONDS, return_when=FIRST_COMPLETED)
            for fut in finished:
                for res in fut.result() if stack_seeds else [fut.result()]:
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
