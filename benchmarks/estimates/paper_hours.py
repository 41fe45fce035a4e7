"""Expected compute of a reproduction: what `lengthgen reproduce PAPER --scale SCALE` costs, from
one measured training step of each of its runs.

For every distinct run of the grid's default tasks and arms (task x arm x axis values; its
seeds share the config and the cost), the run's model is built from its config and one
training step (the trainer's own, Trainer.step: draw, forward, backward, clipping, AdamW, EMA;
benchmarks/common/steps.py) is taken at the end of the curriculum, the longest training lengths, so a run with
a curriculum is counted at its slowest step throughout (an upper bound; the looped presets
spend under a third of their steps before the curriculum ends). That step is measured three
ways:
- FLOPs, counted by torch's FlopCounterMode (matmuls and attention: the work the model needs);
- operators dispatched (aten calls, forward + backward + optimizer): on a GPU each is at least
  one kernel launch, so a step of small tensors costs at least ops x the per-launch overhead
  whatever the GPU's speed;
- seconds on this machine's device: the median of --steps more steps after one untimed step
  (benchmarks/common/timing.py; skip with --steps 0).

Hours on this device = seconds per step x steps x seeds. Estimated GPU hours = the larger of
FLOPs / --tflops (sustained throughput) and ops x --launch-us, x steps x seeds: a roofline of
compute against eager-mode launch overhead. Both are assumptions, stated in the output; on a
GPU, run this with --device cuda and read the measured column instead.
--compile compiles a copy's blocks as `train.compile` does (lengthgen.accel.compiling) and
counts, from torch's profiler, the kernels a compiled step runs: inductor's fused kernels and
the operators outside them that launch one (views and other metadata-only operators are not
counted), eager and compiled. On CUDA `train.compile` replays each compiled block as a CUDA
graph, one launch a call, so the launch bound is re-estimated from the kernels outside the
compiled blocks plus one launch per compiled-block call ("launches with graphs"). Counted on
this CPU, inductor fuses as it would for CUDA up to the backend's choices (C++ loops here,
Triton there), so the counts are an estimate of a GPU's; --device cuda measures the real step.
--capture, on CUDA, times the step as training runs it there: replayed from CUDA graphs
(train.capture, lengthgen.accel.captured), for every method that can be recorded; the
run's name then says "(captured)". --batch-fraction F measures a batch F times smaller and scales
FLOPs and seconds by F (for paper-scale batches that do not fit this machine's memory; operators
do not depend on it).

    python benchmarks/estimates/paper_hours.py looped [--scale paper] [--steps 2] [--device cpu] \
        [--batch-fraction 1] [--tflops 100] [--launch-us 10] [--tasks parity,copy] [--arms looped] \
        [--compile] [--capture]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
import torch._inductor.config as inductor_config
from torch.profiler import profile
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: lengthgen and benchmarks

from benchmarks.common import records  # noqa: E402
from benchmarks.common.steps import TrainerStep, sync  # noqa: E402
from benchmarks.common.timing import time_one  # noqa: E402
from lengthgen.assembly.runs import new_run  # noqa: E402
from lengthgen.reproduction import grid as grids  # noqa: E402
from lengthgen.reproduction.request import ReproduceRequest  # noqa: E402


class OpCounter(TorchDispatchMode):
    """Counts the aten operators dispatched inside it."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


# operators that run no kernel: views, metadata, allocation, and p = 0 dropout's identity
NO_KERNEL = {f"aten::{name}" for name in (
    "view", "_unsafe_view", "_reshape_alias", "reshape", "as_strided", "alias", "detach", "t", "transpose",
    "permute", "expand", "unsqueeze", "squeeze", "slice", "select", "narrow", "split", "split_with_sizes",
    "chunk", "unbind", "unflatten", "flatten", "contiguous", "to", "_to_copy", "empty", "empty_strided",
    "empty_like", "resize_", "set_", "lift_fresh", "resolve_conj", "resolve_neg", "result_type", "dropout")}
GRAPH_CALLS = ("CompiledFunction", "CompiledFunctionBackward")  # one compiled block's forward / backward


def is_kernel(name: str) -> bool:
    return "cpp_fused" in name or "triton_" in name or (name.startswith("aten::") and name not in NO_KERNEL)


def kernel_counts(step) -> tuple[int, int]:
    """(kernels, launches with graphs) of one call of `step`, from torch's profiler: kernels are
    inductor's fused kernels and the aten operators with no kernel-running operator inside them;
    with graphs, each compiled block's forward or backward call is one launch, plus the kernels
    outside them."""
    inductor_config.cpp.enable_kernel_profile = True  # names inductor's C++ kernels in the profile
    with profile() as prof:
        step()
    kernels = outside = graphs = 0
    for event in prof.events():
        if event.name in GRAPH_CALLS:
            graphs += 1
        if not is_kernel(event.name) or any(is_kernel(child.name) for child in event.cpu_children):
            continue
        kernels += 1
        parent = event.cpu_parent
        while parent is not None and parent.name not in GRAPH_CALLS:
            parent = parent.cpu_parent
        outside += parent is None
    return kernels, outside + graphs


def step_cost(run, device: torch.device, fraction: int, steps: int, compile: bool = False,
              capture: bool = False) -> dict:
    """FLOPs, operators and seconds of one training step of the assembled `run` at its longest training lengths;
    with `compile`, also its kernels eager and compiled, and launches with CUDA graphs; with
    `capture` (CUDA), the seconds of the step replayed from CUDA graphs, as training times it."""
    cfg = run.cfg  # one data shard: the step one process takes
    run = replace(run, cfg=replace(cfg, train=replace(cfg.train, batch_size=cfg.train.batch_size // fraction),
                                   data=replace(cfg.data, shards=1)))
    eager = TrainerStep(run, device, capture=False, compile=False)
    flops, ops = FlopCounterMode(display=False), OpCounter()
    with flops, ops:  # also the warm-up of the timed steps
        eager()
    cost = {"flops": flops.get_total_flops() * fraction, "ops": ops.ops}
    if compile:
        cost["kernels eager"] = kernel_counts(eager)[0]
        torch._dynamo.reset()
        compiled = TrainerStep(run, device, capture=False, compile=True)  # the blocks, as train.compile does
        for _ in range(3):  # compiles, then runs warm: the same batch shapes as counted
            compiled()
        cost["kernels compiled"], cost["launches"] = kernel_counts(compiled)
    timed = eager
    if capture and device.type == "cuda":  # as training runs it (train.capture), where the method allows
        recorded = TrainerStep(run, device, capture=True, compile=False)
        recorded()  # records the step's graph
        if recorded.recorded:
            timed, cost["captured"] = recorded, True
    if steps:
        stats = time_one(timed, steps, warmup=0, sync=lambda: sync(device))  # warmed above
        cost["seconds"], cost["timing"] = stats.median * fraction, stats.as_dict(fraction)
    else:
        cost["seconds"] = None
    return cost


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("paper")
    p.add_argument("--scale", default="paper")
    p.add_argument("--tasks", help="comma list (default: the grid's default tasks)")
    p.add_argument("--arms", help="comma list (default: the grid's default arms)")
    p.add_argument("--steps", type=int, default=2, help="timed steps per run (0: count only)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--batch-fraction", type=int, default=1)
    p.add_argument("--tflops", type=float, default=100.0,
                   help="assumed sustained GPU TFLOP/s (100: an A100's bf16 peak of 312 at about a third)")
    p.add_argument("--launch-us", type=float, default=10.0, help="assumed GPU microseconds per operator (eager mode)")
    p.add_argument("--capture", action="store_true",
                   help="on CUDA, time the step replayed from CUDA graphs (train.capture, as training runs it)")
    p.add_argument("--compile", action="store_true",
                   help="also count the kernels of a compiled step; GPU launches are then those with CUDA graphs")
    records.add_arguments(p)
    args = p.parse_args()
    if args.steps < 0 or args.batch_fraction < 1:
        p.error("--steps must be >= 0 and --batch-fraction >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    grid = grids.find(args.paper)
    spec = grid.resolved(args.scale)
    tasks = args.tasks.split(",") if args.tasks else grid.defaults(args.scale, "tasks")
    arms = args.arms.split(",") if args.arms else grid.defaults(args.scale, "arms")
    seeds = spec.get("seeds", 3)
    device = torch.device(args.device)
    with tempfile.TemporaryDirectory() as out:
        jobs = grids.plan(grid, ReproduceRequest(scale=args.scale, tasks=tasks, arms=arms, seeds=1, out=Path(out),
                                                 workers=1, threads=args.threads or 1))
    print(f"{grid.name} at scale {args.scale}: {len(jobs)} runs x {seeds} seeds; device {device}, "
          f"{torch.get_num_threads()} threads; GPU model: max(FLOPs / {args.tflops:g} TFLOP/s, "
          f"ops x {args.launch_us:g} us)")
    kernels = " kernels eager | kernels compiled | launches with graphs |" if args.compile else ""
    print(f"| run | steps | batch | GFLOP/step | ops/step |{kernels} s/step here | hours here | GPU h compute "
          "| GPU h launches | est. GPU hours |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * 3 * args.compile)
    totals = [0.0] * 4  # hours here, compute, launches, estimate
    rows = []
    for job in jobs:
        run = new_run(job.preset, job.overrides)
        steps, batch = run.cfg.train.steps, run.cfg.train.batch_size
        cost = step_cost(run, device, args.batch_fraction, args.steps, args.compile, args.capture)
        flops, ops, seconds = cost["flops"], cost["ops"], cost["seconds"]
        launches = cost["launches"] if args.compile else ops
        runs = steps * seeds / 3600
        hours = [seconds * runs if seconds is not None else 0.0, flops / (args.tflops * 1e12) * runs,
                 launches * args.launch_us * 1e-6 * runs]
        hours.append(max(hours[1], hours[2]))
        totals = [t + h for t, h in zip(totals, hours)]
        name = Path(job.folder).name.rsplit("-s", 1)[0] + (" (captured)" if cost.get("captured") else "")
        measured = f"{seconds:.2f} | {hours[0]:,.0f}" if seconds is not None else " | "
        counted = ("kernels eager", "kernels compiled", "launches") if args.compile else ()
        counts = "".join(f" {cost[k]} |" for k in counted)
        print(f"| {name} | {steps} | {batch} | {flops / 1e9:.1f} | {ops} |{counts} {measured} | {hours[1]:,.2f} | "
              f"{hours[2]:,.1f} | {hours[3]:,.1f} |", flush=True)
        rows.append({"run": name, "steps": steps, "batch": batch, **cost, "hours here": hours[0],
                     "GPU hours compute": hours[1], "GPU hours launches": hours[2], "GPU hours estimate": hours[3]})
    print(f"| **total** ({seeds} seeds) | | | | |{' |' * 3 * args.compile} | {totals[0]:,.0f} | {totals[1]:,.1f} "
          f"| {totals[2]:,.0f} | {totals[3]:,.0f} |")
    records.write(__file__, args, {"grid": grid.name, "runs": len(jobs), "seeds": seeds, "rows": rows,
                                   "totals": dict(zip(("hours here", "GPU hours compute", "GPU hours launches",
                                                       "GPU hours estimate"), totals))}, device=str(device))


if __name__ == "__main__":
    main()
