"""Where the time of a paper-scale looped training step goes, op by op.

Profiles `--steps` prefix-scheme training steps (the trainer's own: forward, backward, clipping,
AdamW; benchmarks/common/steps.py) of the paper-scale model of benchmarks/speed/looped_speed.py
and prints, per
aten op, milliseconds per step, share of the step, and GFLOP/s where torch
counts FLOPs; then the linear layers' matmul throughput inside the step against the
same matmul shape timed alone (warm caches, median of 20; benchmarks/common/timing.py) and the
2048^2 figure the MFU divides by (best of 10): the ceiling on MFU that the step's own matmuls set.

    python benchmarks/speed/looped_profile.py [--task addition] [--precision bf16] [--steps 3]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: lengthgen and benchmarks

from benchmarks.common import records  # noqa: E402
from benchmarks.speed.looped_speed import PAPER, build, matmul_peak  # noqa: E402
from lengthgen.runtime.devices import native_bf16  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="addition", choices=sorted(PAPER))
    bf16 = native_bf16(torch.device("cpu"))
    p.add_argument("--precision", default="bf16" if bf16 else "fp32", choices=("fp32", "bf16"),
                   help="default: bf16 where the CPU has native bf16, else fp32")
    p.add_argument("--steps", type=int, default=3, help="profiled training steps (after 3 untimed ones)")
    p.add_argument("--rows", type=int, default=15, help="ops to list, most expensive first")
    records.add_arguments(p)
    args = p.parse_args()
    if args.steps < 1 or args.rows < 1:
        p.error(f"--steps and --rows must be >= 1, got {args.steps} and {args.rows}")
    if args.precision == "bf16" and not bf16:
        p.error("this CPU has no native bf16 (bf16 would profile a reference kernel); use --precision fp32")
    step = build(args.task, args.precision, "prefix")
    model = step.state.model
    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
        for _ in range(args.steps):
            step()
    ops = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in ops) / args.steps / 1e3  # ms per step
    print(f"{args.task}, {args.precision}, prefix scheme: {total:.0f} ms per step (under the profiler), "
          f"{torch.get_num_threads()} threads\n\n{'op':<32} {'ms/step':>8} {'share':>6} {'GFLOP/s':>8}")
    rows = []
    for e in ops[:args.rows]:
        ms = e.self_cpu_time_total / args.steps / 1e3
        rate = f"{e.flops / e.self_cpu_time_total / 1e3:8.0f}" if e.flops else f"{'':>8}"
        print(f"{e.key:<32} {ms:>8.1f} {ms / total:>6.1%} {rate}")
        rows.append({"op": e.key, "ms_per_step": ms, "share": ms / total,
                     "gflops": e.flops / e.self_cpu_time_total / 1e3 if e.flops else None})
    mm = [e for e in ops if e.key in ("aten::mm", "aten::addmm")]
    flops, us = sum(e.flops for e in mm), sum(e.self_cpu_time_total for e in mm)
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    width = model.cfg.d_model
    alone = matmul_peak(dtype, (2048, width, 4 * width), repeats=20, median=True)  # an MLP matmul's shape
    square = matmul_peak(dtype)
    print(f"\nlinear-layer matmuls inside the step: {flops / us / 1e3:.0f} GFLOP/s; "
          f"alone, warm caches: {alone / 1e9:.0f} GFLOP/s at (2048, {width}) @ "
          f"({width}, {4 * width}), {square / 1e9:.0f} GFLOP/s at 2048^2")
    records.write(__file__, args, {"ms_per_step": total, "ops": rows, "linear_gflops_in_step": flops / us / 1e3,
                                   "linear_gflops_alone": alone / 1e9, "square_gflops": square / 1e9}, device="cpu")


if __name__ == "__main__":
    main()
