"""Decided 2026-12-08: the blocks' fp32 linear layers run on oneDNN where MKL leaves AVX-512 unused.

For the matmul shapes of the CPU presets' blocks (width 64: q/k/v 64 -> 192, the MLP 64 -> 256 and
256 -> 64, the output projection 64 -> 64, a 3-symbol read-out), at row counts from 64 to 2048:
a linear layer forward and backward (dx, dW, db) with torch's F.linear (MKL) against
lengthgen.accel.onednn_linear's kernel, taking turns (benchmarks/common/timing.py), and the
forward alone each way; then the GFLOP/s of one 2048^3 fp32 matmul each way, the machine's
ceiling. Printed per thread count: the speed-up of oneDNN over MKL (above 1: oneDNN is faster)
and the multiply-adds of each matmul, against which onednn_linear.MIN_MACS is set.

    python benchmarks/decisions/linear_paths.py [--threads 1,2] [--rounds 30]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: lengthgen and benchmarks

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from benchmarks.common import records  # noqa: E402
from benchmarks.common.timing import alternate  # noqa: E402
from lengthgen.accel import onednn_linear  # noqa: E402

SHAPES = [(64, 192), (64, 256), (256, 64), (64, 64), (64, 3)]  # (in, out)
ROWS = [64, 128, 256, 512, 1024, 2048]


def oneDNN(x, w, b):
    return onednn_linear.OneDnnLinear.apply(x, w, b)


def ratios(d_in: int, d_out: int, rows: int, rounds: int) -> dict:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, d_in, generator=g).requires_grad_()
    w, b = torch.randn(d_out, d_in, generator=g).requires_grad_(), torch.randn(d_out, generator=g).requires_grad_()
    grad = torch.randn(rows, d_out, generator=g)

    def both(f):
        return lambda: torch.autograd.grad(f(x, w, b), (x, w, b), grad)

    def forward(f):
        return lambda: f(x.detach(), w.detach(), b.detach())

    train = alternate({"mkl": both(F.linear), "onednn": both(oneDNN)}, rounds, warmup=3)
    infer = alternate({"mkl": forward(F.linear), "onednn": forward(oneDNN)}, rounds, warmup=3)
    return {"in": d_in, "out": d_out, "rows": rows, "macs": rows * d_in * d_out,
            "forward+backward": train.ratio("mkl", "onednn"), "forward": infer.ratio("mkl", "onednn"),
            "mkl us": 1e6 * train.median("mkl"), "onednn us": 1e6 * train.median("onednn")}


def ceiling(f) -> float:
    """GFLOP/s of one 2048^3 fp32 matmul (the best of three)."""
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    f(a, b)
    best = min(timed(f, a, b) for _ in range(3))
    return 2 * 2048 ** 3 / best / 1e9


def timed(f, a, b) -> float:
    start = time.perf_counter()
    f(a, b)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    p.add_argument("--rounds", type=int, default=30, help="timed calls each way, after 3 warm-up calls")
    records.add_arguments(p)
    args = p.parse_args(argv)
    if not onednn_linear.available():
        p.error("this torch has no oneDNN (torch.backends.mkldnn): nothing to compare")
    vendor, flags = onednn_linear.cpu_info()
    print(f"torch {torch.__version__}; CPU {vendor or 'unknown'}, avx512f {'avx512f' in flags}; "
          f"the machine rule takes oneDNN here: {onednn_linear.pays()}")
    results = []
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        mkl, dnn = ceiling(torch.mm), ceiling(lambda a, b: onednn_linear.matmul_t(a, b.t().contiguous()))
        print(f"\n{threads} thread(s): a 2048^3 fp32 matmul, MKL {mkl:.0f} GFLOP/s, oneDNN {dnn:.0f} GFLOP/s")
        print("speed-up of oneDNN over MKL, forward+backward / forward alone (multiply-adds of the matmul)")
        print("| in -> out | " + " | ".join(f"{r} rows" for r in ROWS) + " |")
        print("|---|" + "---:|" * len(ROWS))
        rows = []
        for d_in, d_out in SHAPES:
            line = [ratios(d_in, d_out, r, args.rounds) for r in ROWS]
            rows += line
            print(f"| {d_in} -> {d_out} | " + " | ".join(
                f"{c['forward+backward']:.2f} / {c['forward']:.2f} ({c['macs'] / 2 ** 20:.1f}M)" for c in line) + " |")
        results.append({"threads": threads, "mkl gflops": mkl, "onednn gflops": dnn, "rows": rows})
    print(f"\nonednn_linear.MIN_MACS: {onednn_linear.MIN_MACS / 2 ** 20:.0f}M on one thread, "
          f"{4 * onednn_linear.MIN_MACS / 2 ** 20:.0f}M on more")
    records.write(__file__, args, {"cpu": vendor, "avx512f": "avx512f" in flags, "threads": results}, device="cpu")


if __name__ == "__main__":
    main()
