"""The narrow-head attention kernel (lengthgen/model/narrow_attention.py) against SDPA, training
steps side by side in one run, and the whole training run each gives.

For each preset: two copies of the model with the same weights, one attending through the kernel
and one through SDPA (the path before the kernel, kept selectable by `narrow_attention.enabled`),
take turns on the same batches at every training length the run draws. Reported: the median step
at the longest length, and the whole run: sum over lengths of (steps the run spends at that
length) x (median step there), where the steps per length follow the preset's curriculum and its
uniform draw of one length per batch (lengthgen.training.trainer.sample_batch). Evaluation is
not counted (under 5 % of these runs). One thread, as the reproductions run each job.

    python benchmarks/narrow_attention.py [--steps 7] [--cases looped-parity-cpu,...]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import lengthgen  # noqa: F401  (the thread wait policy, before torch loads)
import torch

from lengthgen import assembly
from lengthgen.config.schedules import curriculum_max
from lengthgen.model import narrow_attention
from lengthgen.training.run_state import decay_params

ROOT = Path(__file__).resolve().parent.parent / "experiments"
CASES = {  # name: (preset, overrides)
    "looped-parity-cpu": ("looped/cpu/parity.toml", []),  # 16 heads of width 4
    "ntp-parity-cpu": ("looped/cpu/parity.toml", ["method=ntp", "model.n_layer=4"]),  # the grid's ntp arm
    "looped-parity-paper": ("looped/paper/parity.toml", []),  # 64 heads of width 4
}
# The other CPU presets have heads of width 16 or 32, which stay with SDPA: nothing to compare.


def steps_per_length(cfg) -> Counter:
    """Expected training steps at each length: a uniform draw in [train_min, curriculum max]."""
    weights = Counter()
    low = cfg.task.train_min
    for step in range(cfg.train.steps):
        high = curriculum_max(cfg, step)
        for n in range(low, high + 1):
            weights[n] += 1 / (high - low + 1)
    return weights


def measure(name: str, steps: int, lengths: int) -> dict:
    preset, sets = CASES[name]
    run = assembly.assemble(str(ROOT / preset), sets)
    cfg, task, method = run.cfg, run.task, run.method
    models, optimizers = {}, {}
    for path in ("sdpa", "kernel"):
        torch.manual_seed(0)
        models[path] = method.build_model(cfg, task)
        optimizers[path] = torch.optim.AdamW(decay_params(models[path]), lr=cfg.optim.lr)
    weights = steps_per_length(cfg)
    measured = sorted(weights)
    if lengths and len(measured) > lengths:  # a few lengths spread over the range, the rest interpolated
        measured = sorted({measured[round(i * (len(measured) - 1) / (lengths - 1))] for i in range(lengths)})
    generator = torch.Generator().manual_seed(0)
    median = {"sdpa": {}, "kernel": {}}
    for n in measured:
        times = {"sdpa": [], "kernel": []}
        for _ in range(steps + 1):  # the first step at each length is left out (allocator warm-up)
            batch = method.model_batch(task.sample(cfg.train.batch_size, n, generator))
            for path, model in models.items():
                narrow_attention.enabled = path == "kernel"
                began = time.perf_counter()
                method.loss(model, batch).backward()
                optimizers[path].step()
                optimizers[path].zero_grad(set_to_none=True)
                times[path].append(time.perf_counter() - began)
        for path in times:
            median[path][n] = statistics.median(times[path][1:])
    narrow_attention.enabled = True

    def step_at(path: str, n: int) -> float:  # linear between measured lengths
        known = median[path]
        if n in known:
            return known[n]
        below, above = max(m for m in known if m < n), min(m for m in known if m > n)
        return known[below] + (known[above] - known[below]) * (n - below) / (above - below)

    run = {path: sum(w * step_at(path, n) for n, w in weights.items()) for path in median}
    longest = max(measured)
    return {"case": name, "longest": longest, "heads": f"{cfg.model.n_head} x {cfg.model.d_model // cfg.model.n_head}",
            "sdpa": median["sdpa"][longest], "kernel": median["kernel"][longest], "run_steps": cfg.train.steps,
            "sdpa_run": run["sdpa"], "kernel_run": run["kernel"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=7, help="steps per length and path (median)")
    ap.add_argument("--lengths", type=int, default=6, help="lengths measured per preset (0: every one)")
    ap.add_argument("--cases", default="looped-parity-cpu,ntp-parity-cpu")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if narrow_attention.library() is None:
        sys.exit("the narrow-head kernel could not be built (see the line above)")
    print(f"torch {torch.__version__}, 1 thread; median of {args.steps} steps per length and path, alternating")
    print("| case | heads | longest length | sdpa ms | kernel ms | step speed-up | run steps | sdpa run s | kernel run s | run speed-up |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.cases.split(","):
        r = measure(name, args.steps, args.lengths)
        print(f"| {name} | {r['heads']} | {r['longest']} | {1000 * r['sdpa']:.1f} | {1000 * r['kernel']:.1f} "
              f"| {r['sdpa'] / r['kernel']:.2f}x | {r['run_steps']} | {r['sdpa_run']:.0f} | {r['kernel_run']:.0f} "
              f"| {r['sdpa_run'] / r['kernel_run']:.2f}x |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
