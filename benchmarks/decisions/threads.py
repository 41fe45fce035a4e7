"""Decided 2026-11-26: idle OpenMP threads sleep (OMP_WAIT_POLICY=PASSIVE): busy/quiet 1.14x, spinning 3.38x.

Thread policy on a busy machine: a preset's training step with 1 torch thread, and with every
core's thread spinning (OMP_WAIT_POLICY=ACTIVE, OpenMP's default) or sleeping (PASSIVE,
lengthgen's default) while it waits, measured quiet and next to another CPU-bound job.

Each setting runs in a fresh process (OpenMP reads its wait policy once, when torch loads it);
the settings take turns for --rounds rounds (benchmarks/common/timing.py; each process times its
own steps), so machine noise hits all alike. "Busy" starts one pure-Python busy loop per --load
before the step process and stops it after: another job that wants a core all the time, as a
second run or a compilation would. Reported: the median step of each setting, quiet and busy, and
busy / quiet. Steps are the trainer's own (Trainer.step, benchmarks/common/steps.py) on the
preset's batches at its longest training length.

    python benchmarks/decisions/threads.py [--preset experiments/looped/cpu/parity.toml] [--rounds 3] [--steps 12]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout: benchmarks.common (torch loads only in the step processes)

from benchmarks.common import records  # noqa: E402
from benchmarks.common.timing import alternate  # noqa: E402

STEP = r"""
import json, sys
sys.path.insert(0, sys.argv[4])
import lengthgen  # sets the wait policy (unless the environment already has one) before torch loads
import torch
from benchmarks.common.steps import TrainerStep
from benchmarks.common.timing import time_one
from lengthgen.assembly.runs import new_run

preset, threads, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
step = TrainerStep(new_run(preset, ["train.device=cpu"]), "cpu", capture=False, compile=False)
# the first two steps warm the allocator and oneDNN's caches
longest = lambda: step.batches(step.cfg.task.train_max)  # noqa: E731
print(json.dumps(time_one(step, steps - 2, warmup=2, draw=longest).samples))
"""
BUSY = "while True: pass"


def settings(cores: int) -> dict[str, tuple[int, str]]:
    """name -> (torch threads, OMP_WAIT_POLICY)."""
    return {"1 thread": (1, "PASSIVE"), f"{cores} threads, spinning": (cores, "ACTIVE"),
            f"{cores} threads, sleeping (default)": (cores, "PASSIVE")}


def step_times(preset: str, threads: int, policy: str, steps: int, load: int) -> list[float]:
    """Seconds of each timed step of one fresh process, with `load` busy loops beside it."""
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(load)]
    try:
        out = subprocess.run([sys.executable, "-c", STEP, preset, str(threads), str(steps), str(ROOT)], check=True,
                             capture_output=True, text=True, env={**os.environ, "OMP_WAIT_POLICY": policy})
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default=str(ROOT / "experiments/looped/cpu/parity.toml"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12, help="steps per process, the first two untimed")
    ap.add_argument("--load", type=int, default=1, help="busy processes beside the step in the busy runs")
    records.add_arguments(ap)
    args = ap.parse_args()
    if args.rounds < 1 or args.steps < 3 or args.load < 0:
        ap.error("--rounds must be >= 1, --steps >= 3 and --load >= 0")
    cores = os.cpu_count() or 1
    variants = {f"{name}, {'busy' if busy else 'quiet'}": (lambda t=threads, p=policy, b=busy:
                                                           step_times(args.preset, t, p, args.steps, args.load * b))
                for name, (threads, policy) in settings(cores).items() for busy in (False, True)}
    timings = alternate(variants, args.rounds, warmup=0, returns_seconds=True)
    print(f"{args.preset}: median training step, {cores} cores, {args.rounds} rounds x {args.steps - 2} steps; "
          f"busy = {args.load} busy-loop process(es) beside it")
    print("| setting | quiet ms | busy ms | busy / quiet |")
    print("|---|---:|---:|---:|")
    for name in settings(cores):
        quiet, busy = (1000 * timings.median(f"{name}, {b}") for b in ("quiet", "busy"))
        print(f"| {name} | {quiet:.0f} | {busy:.0f} | {busy / quiet:.2f}x |")
    records.write(__file__, args, {"cores": cores, "timings": timings.as_dict(1000)}, device="cpu")


if __name__ == "__main__":
    main()
