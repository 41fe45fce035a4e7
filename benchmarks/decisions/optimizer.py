"""Decided 2026-12-07: AdamW stays torch's default on CPU; the fused one is about 3x faster but saves 1-2 % of a step.

For each CPU preset of benchmarks/speed/cpu_presets.py: its model's weights, two copies, each with
the AdamW a run builds (lengthgen.training.run_state: two groups, with and without weight decay),
one with torch's default implementation (a loop of foreach operators over the weights) and one
`fused=True`. The two take turns (benchmarks/common/timing.py) on the same random gradients, one
optimizer step each, one thread; then the largest difference between the two copies' weights after
all those steps, which must be float rounding.

    python benchmarks/decisions/optimizer.py [--steps 50] [--cases looped-parity,ntp-parity]
"""
from __future__ import annotations

import argparse
import copy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: lengthgen and benchmarks

import torch  # noqa: E402

from benchmarks.common import records  # noqa: E402
from benchmarks.common.timing import alternate  # noqa: E402
from benchmarks.speed.cpu_presets import CASES  # noqa: E402
from lengthgen.assembly.runs import new_run  # noqa: E402
from lengthgen.training.run_state import decay_params  # noqa: E402


def measure(name: str, steps: int) -> dict:
    preset, overrides = CASES[name]
    run = new_run(preset, ["train.device=cpu", *overrides])
    op = run.cfg.optim
    torch.manual_seed(0)
    models = {way: run.method.build_model(run.cfg, run.task) for way in ("foreach", "fused")}
    models["fused"].load_state_dict(models["foreach"].state_dict())
    optimizers = {way: torch.optim.AdamW(decay_params(m, op.decay_all), lr=op.lr, betas=tuple(op.betas),
                                         weight_decay=op.weight_decay, fused=way == "fused" or None)
                  for way, m in models.items()}
    params = {way: [p for p in m.parameters() if p.requires_grad] for way, m in models.items()}
    generator = torch.Generator().manual_seed(1)

    def gradients():
        return [torch.randn(p.shape, generator=generator) for p in params["foreach"]]

    def step(way):
        def call(grads):
            for p, g in zip(params[way], grads):
                p.grad = g.clone()
            optimizers[way].step()
        return call

    timings = alternate({way: step(way) for way in models}, steps, warmup=3, draw=gradients)
    differs = max(float((a - b).abs().max()) for a, b in zip(params["foreach"], params["fused"]))
    return {"case": name, "preset": preset, "weights": sum(p.numel() for p in params["foreach"]),
            "foreach us": 1e6 * timings.median("foreach"), "fused us": 1e6 * timings.median("fused"),
            "speed-up": timings.ratio("foreach", "fused"), "largest weight difference": differs,
            "timings": timings.as_dict(1e6)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50, help="timed optimizer steps each way, after 3 warm-up steps")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    records.add_arguments(p)
    args = p.parse_args(argv)
    names = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        p.error(f"unknown case {unknown[0]!r}; one of: {', '.join(CASES)}")
    torch.set_num_threads(1)
    rows = [measure(name, args.steps) for name in names]
    print(f"torch {torch.__version__}, 1 thread; median of {args.steps} AdamW steps each way, alternating")
    print("| case | weights | foreach us | fused us | speed-up | largest weight difference |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['case']} | {r['weights']:,} | {r['foreach us']:.0f} | {r['fused us']:.0f} | "
              f"{r['speed-up']:.2f}x | {r['largest weight difference']:.1e} |")
    records.write(__file__, args, {"rows": rows}, device="cpu")


if __name__ == "__main__":
    main()
