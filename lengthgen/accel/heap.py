"""glibc's heap kept between steps in a CPU training or evaluation process, instead of given back and faulted in again.

Why: glibc serves a large allocation by mmap, and gives the top of its heap back to the kernel once
more than M_TRIM_THRESHOLD of it is free. Both thresholds move with what the process frees, and a
CPU training step frees and allocates the same megabytes every step (activations, oneDNN's buffers),
so the heap is trimmed and grown again around them and every page comes back zeroed through a page
fault. With the thresholds fixed at 64 and 256 MiB the looped Parity paper step went from 82,000
page faults a step to none and ran 1.03-1.21x faster, the CPU presets' steps 1.09x (median), and an
evaluation of the demo's looped run 1.4-1.9x (2.2M page faults to 58k)
(benchmarks/decisions/heap_and_split.py; docs/benchmarks.md, "glibc's heap kept between steps").

What it costs: up to 256 MiB that the process has freed stay in its heap until it exits, and
allocations below 64 MiB come from the heap instead of their own mappings.

Set once per process by `keep` (as a CPU trainer starts its fast paths or its stacked seeds, and as a
CPU evaluation starts), only on glibc and only where the user has not set glibc's own
MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ (theirs win); LENGTHGEN_KEEP_HEAP=0 leaves glibc as it is.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

import torch

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # mallopt's parameters (malloc.h)
TRIM_BYTES, MMAP_BYTES = 256 << 20, 64 << 20
GLIBC_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")  # the user's own, which win

kept = False  # whether this process's heap thresholds are lengthgen's


def wanted(environ=os.environ) -> bool:
    if environ.get("LENGTHGEN_KEEP_HEAP") == "0":
        return False
    return not any(environ.get(name) for name in GLIBC_SETTINGS) and platform.libc_ver()[0] == "glibc"


def keep(device: torch.device | None = None) -> bool:
    """Fix glibc's mmap and trim thresholds for this process (once), where `device` (if given) is the
    CPU; whether they are lengthgen's now."""
    global kept
    if kept or (device is not None and device.type != "cpu") or not wanted():
        return kept
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    kept = bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_BYTES)) and bool(libc.mallopt(M_TRIM_THRESHOLD, TRIM_BYTES))
    return kept
