"""Compiled blocks (train.compile) against eager ones, training steps side by side in one run.

For each preset: two copies of the model with the same weights, one with its blocks compiled as
`train.compile` compiles them (lengthgen.model.compiling), take turns on the same batches (drawn as
training draws them at the preset's longest training length, lengths mixed as its
`length_sampling` says). Reported: the median step after --warmup steps of each, the seconds
the compiled copy's first steps took beyond the eager copy's (the compilation), the graphs
compiled, and the whole run at the preset's steps: eager = steps x eager step; compiled =
compilation + steps x compiled step. A content scheme (TRA, CoPE) is not compiled: its row says so.

    python benchmarks/compile.py [--steps 30] [--warmup 10] [--cases looped-parity-cpu,ntp-copy-cpu,...]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import lengthgen  # noqa: F401  (the thread wait policy, before torch loads)
import torch

from lengthgen.model import compiling

from lengthgen import assembly
from lengthgen.tasks.base import sample_mixed
from lengthgen.training.run_state import decay_params

ROOT = Path(__file__).resolve().parent.parent / "experiments"
CASES = {  # name: (preset, overrides)
    "looped-parity-cpu": ("looped/cpu/parity.toml", []),
    "looped-parity-paper": ("looped/paper/parity.toml", []),
    "looped-addition-paper": ("looped/paper/addition.toml", []),
    "ntp-copy-cpu": ("core/copy-ntp.toml", []),
    "coupled-addition-cpu": ("sparsity/cpu/addition.toml", ["task.options.coupled=true"]),
    "tra-mini-256": ("tra/paper/copy_symbols.toml", ["model.position=tra"]),
}


def batch_of(cfg, task, generator):
    high = cfg.task.train_max
    if cfg.data.length_sampling == "per_batch":
        return task.sample(cfg.train.batch_size, high, generator)
    return sample_mixed(task, cfg.train.batch_size, cfg.task.train_min, high, generator)


def measure(name: str, steps: int, warmup: int) -> dict:
    preset, sets = CASES[name]
    run = assembly.assemble(str(ROOT / preset), sets)
    cfg, task, method = run.cfg, run.task, run.method
    models, optimizers = {}, {}
    for variant in ("eager", "compiled"):
        torch.manual_seed(0)
        models[variant] = method.build_model(cfg, task)
        optimizers[variant] = torch.optim.AdamW(decay_params(models[variant]), lr=cfg.optim.lr)
    torch._dynamo.reset()
    before = compiling.compilations()
    if not compiling.compile_blocks(models["compiled"], torch.device("cpu"), "benchmark"):
        return {"case": name, "note": "not compiled (content scheme)"}
    generator = torch.Generator().manual_seed(0)
    times = {"eager": [], "compiled": []}
    for _ in range(steps):
        batch = method.model_batch(batch_of(cfg, task, generator))
        for variant, model in models.items():
            began = time.perf_counter()
            method.loss(model, batch).backward()
            optimizers[variant].step()
            optimizers[variant].zero_grad(set_to_none=True)
            times[variant].append(time.perf_counter() - began)
    eager, compiled = (statistics.median(times[v][warmup:]) for v in ("eager", "compiled"))
    # the compilation: what the compiled copy's warm-up steps took beyond its steady step
    compile_s = sum(times["compiled"][:warmup]) - warmup * compiled
    return {"case": name, "eager": eager, "compiled": compiled, "compile_s": compile_s,
            "graphs": compiling.compilations() - before, "run_steps": cfg.train.steps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=10, help="steps left out of the median (compilation happens here)")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s); median of steps {args.warmup + 1}..{args.steps}")
    print("| case | eager ms | compiled ms | step speed-up | compilation s | graphs | run steps | eager run s | compiled run s | run speed-up |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.cases.split(","):
        r = measure(name, args.steps, args.warmup)
        if "note" in r:
            print(f"| {name} | {r['note']} |||||||||")
            continue
        whole_eager = r["run_steps"] * r["eager"]
        whole_compiled = r["compile_s"] + r["run_steps"] * r["compiled"]
        print(f"| {name} | {1000 * r['eager']:.1f} | {1000 * r['compiled']:.1f} | {r['eager'] / r['compiled']:.2f}x "
              f"| {r['compile_s']:.0f} | {r['graphs']} | {r['run_steps']} | {whole_eager:.0f} | {whole_compiled:.0f} "
              f"| {whole_eager / whole_compiled:.2f}x |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
