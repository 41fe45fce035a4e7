"""glibc's heap kept in a CPU training process (lengthgen/accel/heap.py): a 48 MiB allocation comes
from the heap once the thresholds are set (glibc's default maps it on its own), only where the user
has not set glibc's thresholds, and a CPU trainer's start, stacked seeds and an evaluation set them."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from lengthgen.accel import heap

glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")

# Prints whether a fresh 48 MiB malloc lies below the program break (in the heap) rather than in a
# mapping of its own, after `setup` ran in a fresh process. glibc's own threshold moves up with what a
# process frees but never past 32 MiB, so without lengthgen's 64 MiB such a block is always mapped.
PROBE = """
import ctypes
{setup}
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = libc.sbrk.restype = ctypes.c_void_p
libc.sbrk.argtypes = [ctypes.c_long]
block = libc.malloc(48 << 20)
print(block < libc.sbrk(0))
"""


def in_heap(setup: str, **env) -> bool:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "LENGTHGEN_KEEP"))}
    out = subprocess.run([sys.executable, "-c", PROBE.format(setup=setup)], env={**clean, **env},
                         capture_output=True, text=True, check=True).stdout.split()
    return out[-1] == "True"


@glibc
def test_keep_moves_a_large_block_into_the_heap():
    assert not in_heap("")  # glibc's default: above its mmap threshold (128 KiB at first, 32 MiB at most)
    assert in_heap("from lengthgen.accel import heap; assert heap.keep()")
    assert not in_heap("import torch; from lengthgen.accel import heap; assert not heap.keep(torch.device('meta'))")


@glibc
def test_users_settings_win():
    assert not in_heap("from lengthgen.accel import heap; assert not heap.keep()", LENGTHGEN_KEEP_HEAP="0")
    assert not in_heap("from lengthgen.accel import heap; assert not heap.keep()", MALLOC_TRIM_THRESHOLD_="131072")


@glibc
def test_a_cpu_trainer_keeps_the_heap():
    setup = """
import torch
from lengthgen.accel.hook import FastPaths
from lengthgen.assembly.runs import new_run_config
FastPaths(new_run_config(None, ["train.device=cpu"]), None, None, torch.device("cpu")).start()
"""
    assert in_heap(setup)


def test_wanted_reads_the_settings():
    on = platform.libc_ver()[0] == "glibc"
    assert heap.wanted({}) is on
    assert not heap.wanted({"LENGTHGEN_KEEP_HEAP": "0"})
    assert not heap.wanted({"MALLOC_MMAP_THRESHOLD_": "65536"})
    assert heap.wanted({"LENGTHGEN_KEEP_HEAP": "1"}) is on


@glibc
def test_seeds_stacked_on_cpu_keep_the_heap():
    setup = """
import torch
from lengthgen.accel.stacked import StackedSteps
from lengthgen.assembly.runs import new_run
from lengthgen.training.run_state import RunState
run = new_run(None, ["task.name=copy", "task.train_max=4", "model.d_model=16", "model.n_layer=1", "model.n_head=2",
                     "train.device=cpu"])
states = [RunState.start(run.cfg, run.method, run.task, torch.device("cpu")) for _ in range(2)]
StackedSteps(run.method, states, 1.0, "fp32", torch.device("cpu"), capture=False)
"""
    assert in_heap(setup)


@glibc
def test_an_evaluation_on_cpu_keeps_the_heap(tmp_path):
    """`lengthgen eval` is a process of its own: its batches' buffers stay in the heap too."""
    from lengthgen.assembly.runs import new_run
    from lengthgen.training.trainer import train
    folder = tmp_path / "run"
    train(new_run(None, ["task.name=copy", "task.train_max=4", "model.d_model=16", "model.n_layer=1",
                         "model.n_head=2", "train.steps=2", "train.device=cpu"]), folder, progress=False)
    setup = f"""
from lengthgen.evaluation.evaluate import evaluate_run
from lengthgen.evaluation.settings import EvalSettings
evaluate_run({str(folder)!r}, EvalSettings(lengths=[2], samples=8, progress=False))
"""
    assert in_heap(setup)
