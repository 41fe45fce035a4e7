"""Decided 2026-11-26: heads <= 8 wide on one CPU thread take the narrow-head kernel (looped Parity CPU run 1.60x).

The narrow-head attention kernel (lengthgen/accel/narrow_attention.py) against SDPA, training
steps side by side in one run, and the whole training run each gives. For each preset: two copies
of the model with the same weights, each the trainer's own step (Trainer.step,
benchmarks/common/steps.py), one attending through the kernel and one through SDPA (the path before
the kernel, kept selectable by `narrow_attention.enabled`), take turns on the same batches at every
training length the run draws (benchmarks/common/timing.py). Reported: the median step at the
longest length, and the whole run: sum over lengths of (steps the run spends at that length) x
(median step there), where the steps per length follow the preset's curriculum and its uniform
draw of one length per batch (lengthgen.training.trainer.sample_batch). Evaluation is not counted
(under 5 % of these runs). One thread, as the reproductions run each job.

    python benchmarks/decisions/narrow_attention.py [--steps 7] [--cases looped-parity-cpu,...]
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: lengthgen and benchmarks

import lengthgen  # noqa: E402,F401  (the thread wait policy, before torch loads)
import torch  # noqa: E402

from benchmarks.common import records  # noqa: E402
from benchmarks.common.steps import TrainerStep  # noqa: E402
from benchmarks.common.timing import alternate  # noqa: E402
from lengthgen.accel import narrow_attention  # noqa: E402
from lengthgen.assembly.runs import new_run  # noqa: E402
from lengthgen.config.schedules import curriculum_max  # noqa: E402

ROOT = Path(__file__).resolve().parents[2] / "experiments"
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


def through(path: str, step: TrainerStep):
    """`step` with attention through `path` ("kernel" or "sdpa") while it runs."""
    def call(batches):
        kept, narrow_attention.enabled = narrow_attention.enabled, path == "kernel"
        try:
            return step(batches)
        finally:
            narrow_attention.enabled = kept
    return call


def measure(name: str, steps: int, lengths: int) -> dict:
    preset, sets = CASES[name]
    run = new_run(str(ROOT / preset), [*sets, "train.device=cpu"])
    cfg = run.cfg
    copies = {path: TrainerStep(run, "cpu", capture=False, compile=False) for path in ("sdpa", "kernel")}
    weights = steps_per_length(cfg)
    measured = sorted(weights)
    if lengths and len(measured) > lengths:  # a few lengths spread over the range, the rest interpolated
        measured = sorted({measured[round(i * (len(measured) - 1) / (lengths - 1))] for i in range(lengths)})
    median, timings = {"sdpa": {}, "kernel": {}}, {}
    for n in measured:
        # the first step at each length is left out (allocator warm-up)
        t = alternate({path: through(path, step) for path, step in copies.items()}, steps, warmup=1,
                      draw=lambda n=n: copies["sdpa"].batches(n))
        timings[n] = t.as_dict(1000)
        for path in median:
            median[path][n] = t.median(path)

    def step_at(path: str, n: int) -> float:  # linear between measured lengths
        known = median[path]
        if n in known:
            return known[n]
        below, above = max(m for m in known if m < n), min(m for m in known if m > n)
        return known[below] + (known[above] - known[below]) * (n - below) / (above - below)

    whole = {path: sum(w * step_at(path, n) for n, w in weights.items()) for path in median}
    longest = max(measured)
    return {"case": name, "longest": longest, "heads": f"{cfg.model.n_head} x {cfg.model.d_model // cfg.model.n_head}",
            "sdpa": median["sdpa"][longest], "kernel": median["kernel"][longest], "run_steps": cfg.train.steps,
            "sdpa_run": whole["sdpa"], "kernel_run": whole["kernel"], "timings": timings}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=7, help="steps per length and path (median)")
    ap.add_argument("--lengths", type=int, default=6, help="lengths measured per preset (0: every one)")
    ap.add_argument("--cases", default="looped-parity-cpu,ntp-parity-cpu")
    records.add_arguments(ap)
    args = ap.parse_args()
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown:
        ap.error(f"unknown case {unknown[0]!r}; one of: {', '.join(CASES)}")
    if args.steps < 1 or args.lengths == 1 or args.lengths < 0:
        ap.error("--steps must be >= 1, and --lengths 0 or at least 2")
    torch.set_num_threads(1)
    if narrow_attention.library() is None:
        sys.exit("the narrow-head kernel could not be built (see the line above)")
    print(f"torch {torch.__version__}, 1 thread; median of {args.steps} steps per length and path, alternating")
    print("| case | heads | longest length | sdpa ms | kernel ms | step speed-up | run steps | sdpa run s "
          "| kernel run s | run speed-up |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name in args.cases.split(","):
        r = measure(name, args.steps, args.lengths)
        rows.append(r)
        print(f"| {name} | {r['heads']} | {r['longest']} | {1000 * r['sdpa']:.1f} | {1000 * r['kernel']:.1f} "
              f"| {r['sdpa'] / r['kernel']:.2f}x | {r['run_steps']} | {r['sdpa_run']:.0f} | {r['kernel_run']:.0f} "
              f"| {r['sdpa_run'] / r['kernel_run']:.2f}x |", flush=True)
    records.write(__file__, args, {"rows": rows}, device="cpu")


if __name__ == "__main__":
    sys.exit(main())
