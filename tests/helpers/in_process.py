"""`python FILE ARGS...` run in the test's own process: a new Python spends about 2 s of CPU
importing torch before the file starts, and the suite runs the scripts and examples often."""
from __future__ import annotations

import contextlib
import io
import runpy
import subprocess
import sys
import traceback
import warnings
from pathlib import Path

import torch


def run_python_file(path: Path, *args: str) -> subprocess.CompletedProcess:
    """Its exit code, stdout and stderr, as `python PATH ARGS...` would give them: run as __main__
    with its own folder first on sys.path (so it imports the modules beside it, e.g. run_args);
    sys.exit(message) prints the message and exits 1, an uncaught exception prints its traceback
    and exits 1, and warnings print to its stderr. Afterwards sys.argv, sys.path, torch's random
    state and thread count are as they were, and the modules beside it are forgotten, so the next
    file imports them afresh, as a new process would."""
    path = Path(path)
    out, err, code = io.StringIO(), io.StringIO(), 0
    argv, search, modules = sys.argv[:], sys.path[:], set(sys.modules)
    rng, threads = torch.random.get_rng_state(), torch.get_num_threads()  # e.g. a script seeds torch
    sys.argv, sys.path = [str(path), *args], [str(path.parent), *sys.path]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("default")
            warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: \
                sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))
            try:
                runpy.run_path(str(path), run_name="__main__")
            except SystemExit as stop:
                if stop.code is None or isinstance(stop.code, int):
                    code = stop.code or 0
                else:
                    print(stop.code, file=sys.stderr)
                    code = 1
            except Exception:  # noqa: BLE001 - what the interpreter does with it: a traceback, exit 1
                traceback.print_exc()
                code = 1
    finally:
        sys.argv, sys.path = argv, search
        for name in set(sys.modules) - modules:
            if Path(getattr(sys.modules[name], "__file__", None) or "/").parent == path.parent:
                del sys.modules[name]
        torch.random.set_rng_state(rng)
        torch.set_num_threads(threads)
    return subprocess.CompletedProcess([sys.executable, str(path), *args], code, out.getvalue(), err.getvalue())


def run_all_here(jobs, workers, progress, gpus=0, stack_seeds=False) -> list[dict]:
    """lengthgen.reproduction.runner.run_all without its worker processes (each would load torch for
    seconds): run_job for each job (run_group for each seed group with stack_seeds), in this process,
    whose torch thread count is as it was afterwards. What a grid pairs, skips and refuses is decided
    in run_job and in the parent, wherever run_job runs; tests/reproduction/test_reproduce.py and the
    matrix example run grids in worker processes."""
    from lengthgen.reproduction.jobs import run_group, run_job, seed_groups

    threads = torch.get_num_threads()
    try:
        if stack_seeds:
            return [result for group in seed_groups(jobs) for result in run_group(group)]
        return [run_job(job) for job in jobs]
    finally:
        torch.set_num_threads(threads)
