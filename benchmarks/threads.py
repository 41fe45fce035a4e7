"""Thread policy on a busy machine: a preset's training step with 1 torch thread, and with every
core's thread spinning (OMP_WAIT_POLICY=ACTIVE, OpenMP's default) or sleeping (PASSIVE,
lengthgen's default) while it waits, measured quiet and next to another CPU-bound job.

Each setting runs in a fresh process (OpenMP reads its wait policy once, when torch loads it);
the settings take turns for --rounds rounds, so machine noise hits all alike. "Busy" starts one
pure-Python busy loop per --load before the step process and stops it after: another job that
wants a core all the time, as a second run or a compilation would. Reported: the median step of
each setting, quiet and busy, and busy / quiet. Steps are those of `lengthgen train` (the
method's loss, backward, AdamW) on the preset's batches at its longest training length.

    python benchmarks/threads.py [--preset experiments/looped/cpu/parity.toml] [--rounds 3] [--steps 12] [--load 1]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

STEP = r"""
import json, sys, time
import lengthgen  # sets the wait policy (unless the environment already has one) before torch loads
import torch
from lengthgen import assembly
from lengthgen.training.run_state import decay_params

preset, threads, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
run = assembly.assemble(preset, [])
cfg, task, method = run.cfg, run.task, run.method
torch.manual_seed(0)
model = method.build_model(cfg, task)
optimizer = torch.optim.AdamW(decay_params(model), lr=cfg.optim.lr)
generator = torch.Generator().manual_seed(0)
times = []
for _ in range(steps):
    batch = task.sample(cfg.train.batch_size, cfg.task.train_max, generator)
    began = time.perf_counter()
    method.loss(model, batch).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    times.append(time.perf_counter() - began)
print(json.dumps(times[2:]))  # the first two steps warm the allocator and oneDNN's caches
"""
BUSY = "while True: pass"


def settings(cores: int) -> dict[str, tuple[int, str]]:
    """name -> (torch threads, OMP_WAIT_POLICY)."""
    return {"1 thread": (1, "PASSIVE"), f"{cores} threads, spinning": (cores, "ACTIVE"),
            f"{cores} threads, sleeping (default)": (cores, "PASSIVE")}


def step_times(preset: str, threads: int, policy: str, steps: int, load: int) -> list[float]:
    busy = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(load)]
    try:
        out = subprocess.run([sys.executable, "-c", STEP, preset, str(threads), str(steps)], check=True,
                             capture_output=True, text=True, env={**os.environ, "OMP_WAIT_POLICY": policy})
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default=str(Path(__file__).parent.parent / "experiments/looped/cpu/parity.toml"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--load", type=int, default=1, help="busy processes beside the step in the busy runs")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    chosen = settings(cores)
    times = {(name, busy): [] for name in chosen for busy in (False, True)}
    for _ in range(args.rounds):
        for name, (threads, policy) in chosen.items():
            for busy in (False, True):
                times[(name, busy)] += step_times(args.preset, threads, policy, args.steps, args.load * busy)
    print(f"{args.preset}: median training step, {cores} cores, {args.rounds} rounds x {args.steps - 2} steps; "
          f"busy = {args.load} busy-loop process(es) beside it")
    print("| setting | quiet ms | busy ms | busy / quiet |")
    print("|---|---:|---:|---:|")
    for name in chosen:
        quiet, busy = (statistics.median(times[(name, b)]) * 1000 for b in (False, True))
        print(f"| {name} | {quiet:.0f} | {busy:.0f} | {busy / quiet:.2f}x |")


if __name__ == "__main__":
    main()
