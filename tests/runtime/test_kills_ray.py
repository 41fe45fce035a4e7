"""A reproduction on Ray killed at a random point reruns to the numbers of the local pool
(a file of its own, so that the test workers share the two long kill tests out)."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from test_kills import reproduction, rerun


@pytest.mark.slow
def test_a_reproduction_killed_on_ray_reruns_to_the_numbers_of_the_local_pool(toy, monkeypatch):
    """The local pool's numbers from its runs in this process (tests/runtime/test_kills.py kills it);
    the reproduction on Ray, and its rerun, in processes of their own."""
    pytest.importorskip("ray")
    began = time.monotonic()
    rerun(reproduction("whole"), toy, monkeypatch)
    whole = time.monotonic() - began
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
    subprocess.run([sys.executable, "-m", "lengthgen", *on_ray], cwd=toy, check=True, capture_output=True)
    assert (toy / "on-ray" / "results.csv").read_text() == (toy / "whole" / "results.csv").read_text()
