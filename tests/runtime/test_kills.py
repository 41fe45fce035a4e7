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

from toy_papers import positions_grid, toy_paper, toy_preset


# -- kills at random points ---------------------------------------------------------------------------

GRID = positions_grid("Faults")
PRESET = toy_preset(steps=40, lengths="2,4,8", samples=32)


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
    return at


def rerun(argv: list[str], cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "lengthgen", *argv], cwd=cwd, check=True, capture_output=True)


def timed(argv: list[str], cwd: Path) -> float:
    began = time.monotonic()
    rerun(argv, cwd)
    return time.monotonic() - began


@pytest.fixture
def toy(tmp_path) -> Path:
    toy_paper(tmp_path / "toy", GRID, {"parity": PRESET})
    return tmp_path


def reproduction(out: str, *extra: str) -> list[str]:
    return ["reproduce", "toy", "--out", out, "--workers", "2", "--threads", "1", "--no-progress", *extra]


@pytest.mark.slow
def test_kills_at_random_points_rerun_to_the_numbers_of_an_undisturbed_run(toy):
    """SIGKILL at a random point of a reproduction (two workers training), of an evaluation and of
    a report of its runs; each rerun gives the results of the undisturbed reproduction, none
    duplicated. (A killed `train` resumes to the same weights: tests/training/test_train.py.)"""
    whole = timed(reproduction("whole"), toy)
    expected = (toy / "whole" / "results.csv").read_text()
    killed_at_random(reproduction("killed"), toy, whole, seed=0)
    rerun(reproduction("killed"), toy)
    assert (toy / "killed" / "results.csv").read_text() == expected
    run = "killed/runs/parity-rope-s0"
    evaluation = ["eval", run, "--lengths", "2:8", "--samples", "128", "--no-progress"]
    killed_at_random(evaluation, toy, timed(evaluation, toy), seed=1)
    evaluated = (toy / run / "eval.csv").read_text()
    rerun(evaluation, toy)
    assert (toy / run / "eval.csv").read_text() == evaluated
    report = ["report", "whole/runs", "--out", "report"]
    killed_at_random(report, toy, timed(report, toy), seed=2)
    rerun(report, toy)
    assert (toy / "report" / "results.csv").read_text() == expected


@pytest.mark.slow
def test_a_reproduction_killed_on_ray_reruns_to_the_numbers_of_the_local_pool(toy):
    pytest.importorskip("ray")
    whole = timed(reproduction("whole"), toy)
    on_ray = reproduction("on-ray", "--backend", "ray")
    proc = subprocess.Popen([sys.executable, "-m", "lengthgen", *on_ray], cwd=toy, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:  # Ray takes seconds to start: the kill lands once its tasks train (after a first checkpoint)
        deadline = time.monotonic() + 180
        while not list((toy / "on-ray" / "runs").glob("*/checkpoints/latest")):
            assert proc.poll() is None and time.monotonic() < deadline, "no Ray task trained"
            time.sleep(0.1)
        time.sleep(random.Random(3).uniform(0, whole / 4))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    rerun(on_ray, toy)
    assert (toy / "on-ray" / "results.csv").read_text() == (toy / "whole" / "results.csv").read_text()
