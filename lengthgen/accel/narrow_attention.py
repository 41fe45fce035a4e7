"""Causal attention for heads of width <= 8 on CPU, in C (narrow_attention.c).

Why: the CPU presets run 4 to 64 heads of width 4, where SDPA's flash kernel spends its time on
per-(row, head) bookkeeping; in the looped Parity CPU preset it was 43 % of a training step, and
every other torch path was slower still (docs/benchmarks.md, "Heads of width 4"). This kernel
keeps the heads innermost, so they are the SIMD lanes, written with the compiler's vector types, and
is 4-6x faster than SDPA, forward and backward, at those shapes (`benchmarks/decisions/attention_paths.py
--narrow`; twice as fast as the first, auto-vectorised version, which gcc left scalar at 16 heads). Wider heads (16: 3x slower
here) stay with SDPA, which is built for them. With several torch threads the batch is split into
one slice of rows per thread, run on torch's own OpenMP threads: the library is built with
`-fopenmp` and links the libgomp that torch has loaded. Threads of a pool of lengthgen's own (the
way until 2026-12-08) gained nothing inside a training step: after each of torch's parallel
operators its OpenMP threads spin on the cores for a while, waiting for the next, and the
kernel's second thread competed with them (64 rows, 64 heads of width 4, 23 tokens, right after
an OpenMP operator: 2.16 ms split on the pool, 1.95 ms on one thread, 1.18 ms split on OpenMP;
benchmarks/decisions/heap_and_split.py --split; docs/benchmarks.md, "Linear layers on oneDNN"). Where the build has no OpenMP, or its runtime is not torch's, the
kernel runs on one thread. Like torch's own operators, the split does not work in a process forked
after its parent ran OpenMP threads (libgomp's limit): lengthgen starts its workers by spawn.

The C file is compiled once per machine with the system's C compiler (`cc`, or $CC) into
lengthgen's cache folder ($LENGTHGEN_CACHE, else $XDG_CACHE_HOME/lengthgen, else
~/.cache/lengthgen), keyed by the source, the flags and the CPU, since `-march=native` code must
not run on another CPU. Without a compiler, or if the build fails, attention stays with SDPA and
one line says why. `LENGTHGEN_NARROW_ATTENTION=0` turns the kernel off; `enabled` (below) does
the same in-process (the benchmarks compare both paths in one run).

It is `-ffast-math` code with its own vector exp (a polynomial, about 2 ulp): it agrees with SDPA to about
1e-6 (tests/accel/test_narrow_attention.py), not bit for bit. It is compiled and linked in two
steps so the shared library does not carry gcc's crtfastmath, which would switch the whole
process to flush-to-zero arithmetic when loaded.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from functools import lru_cache
from pathlib import Path

import torch
from torch import Tensor

SOURCE = Path(__file__).with_suffix(".c")
COMPILE_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fPIC", "-std=c11"]
MAX_HEAD_WIDTH = 8
enabled = os.environ.get("LENGTHGEN_NARROW_ATTENTION", "1") != "0"


def cache_folder() -> Path:
    if os.environ.get("LENGTHGEN_CACHE"):
        return Path(os.environ["LENGTHGEN_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lengthgen"


def cpu_signature() -> str:
    """What -march=native compiles for: the CPU's model and flags (Linux), else the platform."""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({line for line in info if line.startswith(("model name", "flags"))}))
    except OSError:
        return platform.processor() + platform.machine()


def build(folder: Path) -> Path:
    """Compile the kernel into `folder` (atomically: parallel workers may build at once), with
    OpenMP where the compiler has it, else without."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if not compiler:
        raise RuntimeError("no C compiler (cc, gcc or clang) on PATH")
    try:
        return build_with(folder, compiler, ["-fopenmp"])
    except RuntimeError:
        return build_with(folder, compiler, [])


def build_with(folder: Path, compiler: str, extra: list[str]) -> Path:
    flags = COMPILE_FLAGS + extra
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join([compiler] + flags).encode() + cpu_signature().encode())
    target = folder / f"narrow_attention-{key.hexdigest()[:16]}.so"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        obj, lib = Path(scratch) / "kernel.o", Path(scratch) / "kernel.so"
        for command in ([compiler, *flags, "-c", str(SOURCE), "-o", str(obj)],
                        [compiler, "-shared", *extra, str(obj), "-o", str(lib), "-lm"]):  # no -ffast-math when linking
            done = subprocess.run(command, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"{' '.join(command[:2])} ... failed: {done.stderr.strip()[:300]}")
        os.replace(lib, target)
    return target


def openmp_runtimes() -> set[str]:
    """The OpenMP runtimes mapped into this process (Linux; elsewhere an empty set)."""
    try:
        maps = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return set()
    paths = {line.split()[-1] for line in maps if "/" in line}
    return {p for p in paths if Path(p).name.startswith(("libgomp", "libomp", "libiomp"))}


@lru_cache(maxsize=1)
def library() -> ctypes.CDLL | None:
    """The compiled kernel, or None (and one line on stderr) when it cannot be built."""
    try:
        try:
            lib = ctypes.CDLL(str(build(cache_folder())))
        except OSError:  # a damaged library in the cache (a build cut short): built again, once
            build(cache_folder()).unlink(missing_ok=True)
            lib = ctypes.CDLL(str(build(cache_folder())))
    except (OSError, RuntimeError) as err:
        print(f"lengthgen: narrow-head attention kernel unavailable, using SDPA ({err})", file=sys.stderr)
        return None
    pointer, dims = ctypes.c_void_p, [ctypes.c_int] * 4 + [ctypes.c_float, ctypes.c_int]
    lib.narrow_forward.argtypes = [pointer] * 8 + dims
    lib.narrow_backward.argtypes = [pointer] * 12 + dims
    lib.narrow_forward.restype = lib.narrow_backward.restype = ctypes.c_int
    # split over threads only on torch's own OpenMP runtime: one runtime mapped, which torch loaded
    lib.threaded = len(openmp_runtimes()) == 1
    return lib


def applies(q: Tensor, dropout_p: float = 0.0) -> bool:
    """Whether `attend` takes this call: fp32 on CPU, heads <= 8 wide, no dropout, not traced by
    torch.compile (which cannot see inside a C call; vmap over stacked seeds, which has no data
    pointer to pass, is refused by its caller, lengthgen.accel.backends)."""
    if torch.compiler.is_compiling():  # first: the checks below would break a traced graph
        return False
    return (enabled and q.device.type == "cpu" and q.dtype == torch.float32 and q.shape[-1] <= MAX_HEAD_WIDTH
            and q.shape[2] > 0 and dropout_p == 0.0 and library() is not None)


def strides(x: Tensor) -> ctypes.Array:
    return (ctypes.c_long * 4)(*x.stride())


def threads(B: int) -> int:
    """Slices of the batch: one per torch thread (at most one per row) where the kernel shares torch's OpenMP."""
    return max(1, min(torch.get_num_threads(), B)) if library().threaded else 1


class NarrowCausalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        B, H, T, D = q.shape
        o, lse = q.new_empty(B, T, H, D), q.new_empty(B, T, H)
        qs, ks, vs = strides(q), strides(k), strides(v)
        if library().narrow_forward(q.data_ptr(), qs, k.data_ptr(), ks, v.data_ptr(), vs, o.data_ptr(), lse.data_ptr(),
                                    B, T, H, D, D ** -0.5, threads(B)):
            raise MemoryError("narrow-head attention: out of memory")
        ctx.save_for_backward(q, k, v, o, lse)
        return o.transpose(1, 2)  # (B, H, T, D), as SDPA returns it

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v, o, lse = ctx.saved_tensors
        B, H, T, D = q.shape
        go = grad.transpose(1, 2).contiguous()  # (B, T, H, D), o's layout
        dq, dk, dv = (q.new_empty(B, T, H, D) for _ in range(3))
        qs, ks, vs = strides(q), strides(k), strides(v)
        if library().narrow_backward(q.data_ptr(), qs, k.data_ptr(), ks, v.data_ptr(), vs, o.data_ptr(), go.data_ptr(),
                                     lse.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr(), B, T, H, D, D ** -0.5,
                                     threads(B)):
            raise MemoryError("narrow-head attention: out of memory")
        return dq.transpose(1, 2), dk.transpose(1, 2), dv.transpose(1, 2)


def attend(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal softmax(q k^T / sqrt(D)) v for q, k, v (B, H, T, D) float32 on CPU: SDPA(is_causal=True)."""
    return NarrowCausalAttention.apply(q, k, v)
