"""Looped training speed: step-dependent "prefix" scheme vs the published "max" scheme,
and model FLOP utilisation (MFU) of a paper-scale looped training step.

"prefix" runs each sample only for its own T_i iterations and only over its own
width (rows packed into one token array, lengthgen.model.attention.Packed);
"prefix-padded" is the same without packing (every row at the batch's widest
width); "max" runs every sample for the batch's largest T at full width.

Everything is measured in one run on the same machine, the variants (scheme x
precision) taking turns on every batch (benchmarks/common/timing.py), so ratios are meaningful
even when absolute times drift. Each variant is a copy of the model, from the same weights,
trained by the trainer's own step (Trainer.step: forward under the run's precision, backward,
clipping, AdamW; benchmarks/common/steps.py) with the method's loss scheme set to the variant's:
1. For Parity and Addition at the paper's scale and length distribution (width 256,
   the task's released block depth and heads, batch 64, lengths mixed uniformly in
   1..20): training steps per second of both schemes on the same batches, and the loss
   of both on one fixed batch (they train the same objective, so it must agree).
2. The best measured matmul throughput of this machine (2048 x 2048, fp32 and bf16)
   and the MFU of each paper-scale step in fp32 and in bf16 autocast:
   FLOPs of one prefix-scheme step (counted by torch's FlopCounterMode: the work the
   objective needs) / step time / peak matmul FLOP/s. For the max scheme the same
   useful FLOPs are divided by its (longer) step time.
   bf16 is timed only where the CPU has it natively (lengthgen.runtime.devices.native_bf16):
   elsewhere it runs a reference kernel hundreds of times slower, and training refuses it.

    python benchmarks/speed/looped_speed.py [--steps 10] [--warmup 1] [--tasks parity,addition] [--token-multiple 64]

--token-multiple 1 packs exact token counts instead of rounding them up
(lengthgen.methods.looped.block.TOKEN_MULTIPLE), to see what the rounding buys: every fresh
batch then brings new matmul shapes.
"""
from __future__ import annotations

import argparse
import copy
import sys
from dataclasses import replace
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: lengthgen and benchmarks

from benchmarks.common import records  # noqa: E402
from benchmarks.common.steps import TrainerStep  # noqa: E402
from benchmarks.common.timing import alternate, time_one  # noqa: E402
from lengthgen.assembly.runs import new_run  # noqa: E402
from lengthgen.methods.looped import block as looped  # noqa: E402
from lengthgen.methods.looped.block import looped_loss  # noqa: E402
from lengthgen.runtime.devices import native_bf16  # noqa: E402

PAPER = {"parity": (1, 64), "addition": (3, 8)}  # released block depth, heads
SCHEMES = ("max", "prefix-padded", "prefix")


def matmul_peak(dtype: torch.dtype, shape: tuple[int, int, int] = (2048, 2048, 2048), repeats: int = 10,
                median: bool = False) -> float:
    """FLOP/s of an (m, k) @ (k, n) matmul in `dtype`, shape = (m, k, n): the
    best of `repeats` tries, or their median."""
    m, k, n = shape
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    stats = time_one(lambda: torch.mm(a, b), repeats, warmup=1)
    return 2 * m * k * n / (stats.median if median else stats.min)


def build(task_name: str, precision: str = "fp32", scheme: str = "prefix"):
    """The paper-scale looped run (width 256, the released depth and heads, batch 64, lengths mixed in
    1..20) as a TrainerStep whose method computes its loss by `scheme`."""
    depth, heads = PAPER[task_name]
    run = new_run(None, ["method=looped", f"task.name={task_name}", "task.train_min=1", "task.train_max=20",
                         "data.length_sampling=per_sample", "train.batch_size=64", "model.d_model=256",
                         f"model.n_layer={depth}", f"model.n_head={heads}", f"train.precision={precision}",
                         "train.device=cpu"])
    run = replace(run, method=copy.copy(run.method))  # a method of its own: the scheme is the method's
    run.method.loss_scheme = scheme
    return TrainerStep(run, "cpu", capture=False, compile=False)


def step_flops(model, batch, scheme: str, token_multiple: int = 1) -> int:
    """FLOPs of one training step; token_multiple 1 counts only the objective's tokens,
    without the zero rows that round a packed token count up."""
    saved, looped.TOKEN_MULTIPLE = looped.TOKEN_MULTIPLE, token_multiple
    try:
        counter = FlopCounterMode(display=False)
        with counter:
            looped_loss(model, batch, scheme).backward()
    finally:
        looped.TOKEN_MULTIPLE = saved
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10, help="timed training steps per variant")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps per variant first, on other batches")
    p.add_argument("--tasks", default="parity,addition")
    p.add_argument("--token-multiple", type=int, default=looped.TOKEN_MULTIPLE,
                   help="round packed token counts up to this multiple (1: exact counts)")
    records.add_arguments(p)
    args = p.parse_args()
    if args.token_multiple < 1:
        p.error(f"--token-multiple must be >= 1, got {args.token_multiple}")
    if args.steps < 1 or args.warmup < 0:
        p.error(f"--steps must be >= 1 and --warmup >= 0, got {args.steps} and {args.warmup}")
    unknown = [name for name in args.tasks.split(",") if name not in PAPER]
    if unknown:
        p.error(f"--tasks: {unknown[0]!r} is not one of {', '.join(sorted(PAPER))}")
    looped.TOKEN_MULTIPLE = args.token_multiple
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch 64, lengths mixed in 1..20, "
          f"packed token counts rounded up to a multiple of {looped.TOKEN_MULTIPLE}")
    precisions = ("fp32", "bf16") if native_bf16(torch.device("cpu")) else ("fp32",)
    peak = {"fp32": matmul_peak(torch.float32)}
    if "bf16" in precisions:
        peak["bf16"] = matmul_peak(torch.bfloat16)
        print(f"matmul 2048^2: fp32 {peak['fp32'] / 1e9:.0f} GFLOP/s, bf16 {peak['bf16'] / 1e9:.0f} GFLOP/s")
    else:  # a 2048^2 bf16 matmul alone would take about a minute here
        slow = matmul_peak(torch.bfloat16, (256, 256, 256), repeats=3)
        print(f"matmul 2048^2: fp32 {peak['fp32'] / 1e9:.0f} GFLOP/s; bf16 not measured: this CPU has no native "
              f"bf16 (a 256^3 bf16 matmul runs at {slow / 1e9:.1f} GFLOP/s), so only fp32 is timed")
    print(f"\n{'task':<10} {'precision':<9} {'max ms':>8} {'padded ms':>9} {'prefix ms':>9} {'speed-up':>8} "
          f"{'loss max':>9} {'loss prefix':>11} {'MFU max':>8} {'MFU prefix':>10}")
    results = {"peak_flops": peak, "token_multiple": looped.TOKEN_MULTIPLE, "tasks": {}}
    for name in args.tasks.split(","):
        steppers = {(prec, s): build(name, prec, s) for prec in precisions for s in SCHEMES}
        first = next(iter(steppers.values()))
        model = first.state.model  # every copy starts from these weights
        batches = [first.batches()[0] for _ in range(args.steps)]
        fixed = batches[0]
        with torch.no_grad():
            loss = {s: float(looped_loss(model, fixed, s)) for s in SCHEMES}
        assert abs(loss["prefix-padded"] - loss["max"]) < 1e-4, loss  # the same objective
        flops = sum(step_flops(model, b, "prefix") for b in batches) / len(batches)
        as_run = sum(step_flops(model, b, "prefix", looped.TOKEN_MULTIPLE) for b in batches) / len(batches)
        # the variants take turns on every batch: first the warm-up batches, then the timed ones
        # (more warm-up batches let the prefix scheme meet more of its shapes first, as a long run
        # does: the running rows change every iteration, and a new shape costs oneDNN a new kernel)
        drawn = iter([first.batches() for _ in range(args.warmup)] + [[b] for b in batches])
        timings = alternate({f"{prec} {s}": step for (prec, s), step in steppers.items()}, args.steps, args.warmup,
                            draw=lambda: next(drawn))
        t = {(prec, s): timings.median(f"{prec} {s}") for prec, s in steppers}
        results["tasks"][name] = {"losses": loss, "flops": flops, "flops_as_run": as_run,
                                  "timings": timings.as_dict(1000)}
        for precision in precisions:
            ms = {s: t[precision, s] * 1e3 for s in SCHEMES}
            mfu = {s: flops / t[precision, s] / peak[precision] for s in SCHEMES}
            results["tasks"][name][precision] = {"ms": ms, "mfu": mfu, "speed_up": ms["max"] / ms["prefix"]}
            print(f"{name:<10} {precision:<9} {ms['max']:>8.1f} {ms['prefix-padded']:>9.1f} {ms['prefix']:>9.1f} "
                  f"{ms['max'] / ms['prefix']:>7.2f}x {loss['max']:>9.5f} {loss['prefix']:>11.5f} "
                  f"{mfu['max']:>8.2f} {mfu['prefix']:>10.2f}")
        print(f"{name:<10} the prefix step as run does {as_run / flops:.3f}x the objective's FLOPs "
              f"(token counts rounded up to {looped.TOKEN_MULTIPLE})")
        best = precisions[-1]
        ratio = t['fp32', 'max'] / t[best, 'prefix']
        print(f"{name:<10} prefix + {best} vs published max + fp32: "
              + (f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"))
    print("\nMFU = FLOPs the objective needs (the packed prefix-scheme step with exact token counts, "
          "FlopCounterMode) / step time / peak matmul FLOP/s of the same precision.")
    records.write(__file__, args, results, device="cpu")


if __name__ == "__main__":
    main()
