"""Processes killed at random points (training, evaluation, a report, a reproduction on the
local pool and on Ray): each command reruns to the numbers of an undisturbed run (docs/faults.md)."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lengthgen.cli import main
from lengthgen.reproduction import runner
from tests.helpers.in_process import run_all_here

# -- kills at random points ---------------------------------------------------------------------------

def killed_at_random(argv: list[str], cwd: Path, seconds: float, seed: int) -> float:
    """Start `lengthgen argv`, SIGKILL its process group at a random point of its first `seconds`."""
    at = random.Random(seed).uniform(0.1, 0.9) * seconds
    proc = subprocess.Popen([sys.executable, "-m", "lengthgen", *argv], cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        proc.wait(timeout=at)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    gone(proc.pid)
    return at


def gone(group: int, seconds: float = 60) -> None:
    """Wait until no process of `group` is left. A killed reproduction's workers outlive its main
    process by up to seconds (orphans, freeing their memory before their files, then reaped by
    init), holding their runs' folder locks meanwhile: the likely reason why a rerun started at
    once in this process failed once in 14 runs (CHANGELOG.md, 2026-12-07, night)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return
        time.sleep(0.02)
    raise AssertionError(f"processes of group {group} still alive {seconds} s after SIGKILL")


def timed(argv: list[str], cwd: Path) -> float:
    """Seconds `lengthgen argv` takes in a process of its own, as the killed one runs."""
    began = time.monotonic()
    subprocess.run([sys.executable, "-m", "lengthgen", *argv], cwd=cwd, check=True, capture_output=True)
    return time.monotonic() - began


def rerun(argv: list[str], cwd: Path, monkeypatch) -> None:
    """`lengthgen argv` in this process (a reproduction's runs too): what is tested is the folder
    the killed process left, which the rerun picks up wherever it runs; a process would spend
    seconds importing torch. A failed reproduction's failures.txt is in the message."""
    with monkeypatch.context() as patch:
        patch.chdir(cwd)
        patch.setattr(runner, "run_all", run_all_here)
        code = main(argv)
    failures = cwd / argv[argv.index("--out") + 1] / "failures.txt" if "--out" in argv else None
    assert code == 0, failures.read_text() if failures and failures.is_file() else code


def reproduction(out: str, *extra: str) -> list[str]:
    return ["reproduce", "toy", "--out", out, "--workers", "2", "--threads", "1", "--no-progress", *extra]


@pytest.mark.slow
def test_kills_at_random_points_rerun_to_the_numbers_of_an_undisturbed_run(toy, monkeypatch):
    """SIGKILL at a random point of a reproduction (two workers training), of an evaluation and of
    a report of its runs; each rerun gives the results of the undisturbed reproduction, none
    duplicated. (A killed `train` resumes to the same weights: tests/training/test_train.py.)"""
    whole = timed(reproduction("whole"), toy)
    expected = (toy / "whole" / "results.csv").read_text()
    killed_at_random(reproduction("killed"), toy, whole, seed=0)
    timed(reproduction("killed"), toy)  # rerun in a process, with its workers, as it was killed
    assert (toy / "killed" / "results.csv").read_text() == expected
    run = "killed/runs/parity-rope-s0"
    evaluation = ["eval", run, "--lengths", "2:8", "--samples", "128", "--no-progress"]
    killed_at_random(evaluation, toy, timed(evaluation, toy), seed=1)
    evaluated = (toy / run / "eval.csv").read_text()
    rerun(evaluation, toy, monkeypatch)
    assert (toy / run / "eval.csv").read_text() == evaluated
    report = ["report", "whole/runs", "--out", "report"]
    killed_at_random(report, toy, timed(report, toy), seed=2)
    rerun(report, toy, monkeypatch)
    assert (toy / "report" / "results.csv").read_text() == expected
