"""Decided 2026-11-26: every preset leaves train.compile off (CPU presets' whole runs 0.32-1.08x eager).

Compiled blocks (train.compile) against eager ones, training steps side by side in one run. For
each preset: two copies of the model with the same weights, each the trainer's own step
(Trainer.step, benchmarks/common/steps.py), one with its blocks compiled as `train.compile`
compiles them (lengthgen.accel.compiling), take turns on the same batches (drawn as training draws
them at the preset's longest training length, lengths mixed as its `length_sampling` says;
benchmarks/common/timing.py). Reported: the median step after --warmup steps of each, with its
quartiles, the seconds the compiled copy's warm-up steps took beyond its steady step (the
compilation), the graphs compiled, and the whole run at the preset's steps: eager = steps x eager
step; compiled = compilation + steps x compiled step. A content scheme (TRA, CoPE), or heads
narrow enough for the narrow-head kernel on one thread, is not compiled: its row says why.

    python benchmarks/decisions/compile.py [--steps 30] [--warmup 10] [--cases looped-parity-cpu,ntp-copy-cpu,...]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: lengthgen and benchmarks

import lengthgen  # noqa: E402,F401  (the thread wait policy, before torch loads)
import torch  # noqa: E402

from benchmarks.common import records  # noqa: E402
from benchmarks.common.steps import TrainerStep  # noqa: E402
from benchmarks.common.timing import alternate  # noqa: E402
from lengthgen.accel import compiling  # noqa: E402
from lengthgen.assembly.runs import new_run  # noqa: E402

ROOT = Path(__file__).resolve().parents[2] / "experiments"
CASES = {  # name: (preset, overrides)
    "looped-parity-cpu": ("looped/cpu/parity.toml", []),
    "looped-parity-paper": ("looped/paper/parity.toml", []),
    "looped-addition-paper": ("looped/paper/addition.toml", []),
    "ntp-copy-cpu": ("core/copy-ntp.toml", []),
    "coupled-addition-cpu": ("sparsity/cpu/addition.toml", ["task.options.coupled=true"]),
    "tra-mini-256": ("tra/paper/copy_symbols.toml", ["model.position=tra"]),
}


def measure(name: str, steps: int, warmup: int) -> dict:
    preset, sets = CASES[name]
    run = new_run(str(ROOT / preset), [*sets, "train.device=cpu"])
    torch._dynamo.reset()
    before = compiling.compilations()
    eager = TrainerStep(run, "cpu", capture=False, compile=False)
    compiled = TrainerStep(run, "cpu", capture=False, compile=True)
    if not compiled.is_compiled:
        return {"case": name, "note": "not compiled (the note above says why)"}
    # both copies on the eager copy's draws, at the preset's longest training length
    timings = alternate({"eager": eager, "compiled": compiled}, steps, warmup, draw=eager.batches)
    # the compilation: what the compiled copy's warm-up steps took beyond its steady step
    compile_s = sum(timings.warmup["compiled"]) - warmup * timings.median("compiled")
    return {"case": name, "eager": timings.median("eager"), "compiled": timings.median("compiled"),
            "compile_s": compile_s, "graphs": compiling.compilations() - before, "run_steps": run.cfg.train.steps,
            "timings": timings.as_dict(1000)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30, help="timed steps each way")
    ap.add_argument("--warmup", type=int, default=10, help="steps left out of the median (compilation happens here)")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--threads", type=int, default=1)
    records.add_arguments(ap)
    args = ap.parse_args()
    unknown = [c for c in args.cases.split(",") if c not in CASES]
    if unknown or args.steps < 1 or args.warmup < 0:
        ap.error(f"unknown case {unknown[0]!r}; one of: {', '.join(CASES)}" if unknown
                 else "--steps must be >= 1 and --warmup >= 0")
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s); median of {args.steps} steps after {args.warmup}, "
          "the two copies taking turns")
    print("| case | eager ms | compiled ms | step speed-up | compilation s | graphs | run steps | eager run s "
          "| compiled run s | run speed-up |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for name in args.cases.split(","):
        r = measure(name, args.steps, args.warmup)
        rows.append(r)
        if "note" in r:
            print(f"| {name} | {r['note']} |||||||||")
            continue
        r["eager_run_s"] = r["run_steps"] * r["eager"]
        r["compiled_run_s"] = r["compile_s"] + r["run_steps"] * r["compiled"]
        print(f"| {name} | {1000 * r['eager']:.1f} | {1000 * r['compiled']:.1f} | {r['eager'] / r['compiled']:.2f}x "
              f"| {r['compile_s']:.0f} | {r['graphs']} | {r['run_steps']} | {r['eager_run_s']:.0f} "
              f"| {r['compiled_run_s']:.0f} | {r['eager_run_s'] / r['compiled_run_s']:.2f}x |", flush=True)
    records.write(__file__, args, {"rows": rows}, device="cpu")


if __name__ == "__main__":
    sys.exit(main())
