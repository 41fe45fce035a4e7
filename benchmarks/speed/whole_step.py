"""Kernels of a recorded step's loss, eager and compiled whole (train.compile with train.capture).

A recorded step (lengthgen.accel.captured) runs a looped preset's fixed-shape loss: every
sample for the batch's largest T(n) iterations, then the backward. Compiled whole
(lengthgen.accel.compiling.compile_step), inductor fuses the element-wise work of every iteration
and the summing of each looped weight's gradients over the iterations; compiled block by block
(train.compile without capture) it cannot. Prints, for one batch at the preset's longest lengths:
the kernels of the loss and its backward (torch profiler: inductor's fused kernels and the aten
operators that run one, as benchmarks/estimates/paper_hours.py counts them), eager and compiled
whole; the compilation's seconds; the loss and the largest relative gradient difference; ms per
call each way, the two taking turns (benchmarks/common/timing.py). What is timed is the loss and
its backward, the part compile_step compiles: the optimizer's update is the same either way.
Counted on a CPU, inductor fuses as it would for CUDA up to the backend's choices.

With --stack N, the same for N seeds trained stacked (lengthgen.accel.stacked): their losses
under vmap, eager and compiled whole.

    python benchmarks/speed/whole_step.py [--task parity] [--calls 3] [--stack 3]
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: lengthgen and benchmarks

from benchmarks.common import records  # noqa: E402
from benchmarks.common.steps import StackedStep, TrainerStep  # noqa: E402
from benchmarks.common.timing import alternate  # noqa: E402
from benchmarks.estimates.paper_hours import kernel_counts  # noqa: E402
from benchmarks.speed.gpu import LOOPED, load  # noqa: E402
from lengthgen.accel import narrow_attention  # noqa: E402
from lengthgen.accel.captured import WIDTH_MULTIPLE, padded, shape_of  # noqa: E402
from lengthgen.accel.compiling import compile_step  # noqa: E402
from lengthgen.accel.stacked import stacked_batch, step_shape  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--task", default="parity", choices=sorted(LOOPED))
    p.add_argument("--calls", type=int, default=3, help="timed calls each way")
    p.add_argument("--stack", type=int, default=0, help="seeds trained stacked (0: one model)")
    records.add_arguments(p)
    args = p.parse_args()
    if args.calls < 1:
        p.error("--calls must be >= 1")
    narrow_attention.enabled = False  # a compiled graph cannot call it: both ways use SDPA
    device = torch.device("cpu")
    run = load(LOOPED[args.task], device, [])
    if args.stack:
        stacked = StackedStep(run, device, args.stack)
        batches = stacked.batches()
        width, iterations, _ = step_shape(run.method, batches)
        batch = stacked_batch(batches, -(-width // WIDTH_MULTIPLE) * WIDTH_MULTIPLE)
        params, loss, losses = stacked.steps.params, stacked.steps.losses, lambda f: lambda: f(batch, iterations).sum()
    else:
        stepper = TrainerStep(run, device, capture=False, compile=False)
        model, loss = stepper.state.model, run.method.fixed_shape_loss
        params = list(model.parameters())
        batch = stepper.batches()[0]
        width, iterations, _ = shape_of(run.method, batch)
        batch = padded(batch, -(-width // WIDTH_MULTIPLE) * WIDTH_MULTIPLE)
        losses = lambda f: lambda: f(model, batch, iterations)  # noqa: E731

    def step(loss_of):
        def call():
            for p in params:
                p.grad = None
            out = loss_of()
            out.backward()
            return out.detach(), [p.grad.clone() for p in params]
        return call

    eager, whole = step(losses(loss)), step(losses(compile_step(loss)))
    start = time.perf_counter()  # one call, not a timing: the first compiled call is the compilation
    whole()
    compile_s = time.perf_counter() - start
    kernels = {name: kernel_counts(call)[0] for name, call in (("eager", eager), ("compiled whole", whole))}
    (loss_a, grads_a), (loss_b, grads_b) = eager(), whole()
    worst = max(float((a - b).abs().max() / a.abs().max().clamp(min=1e-12)) for a, b in zip(grads_a, grads_b))
    timings = alternate({"eager": eager, "compiled whole": whole}, args.calls, warmup=0)  # both ran above
    ms = {name: 1000 * timings.median(name) for name in timings.stats}
    what = f"{args.task} paper preset" + (f", {args.stack} seeds stacked" if args.stack else "")
    print(f"{what}, one batch of {run.cfg.train.batch_size} at width "
          f"{batch.inputs.shape[-1]}, {iterations} iterations, {torch.get_num_threads()} threads")
    for name in kernels:
        print(f"{name}: {kernels[name]} kernels, {ms[name]:.0f} ms a call")
    print(f"compiling took {compile_s:.1f} s; losses {float(loss_a):.6f} and {float(loss_b):.6f}, "
          f"gradients within {worst:.1e} relative")
    records.write(__file__, args, {
        "width": batch.inputs.shape[-1], "iterations": iterations, "kernels": kernels, "compile_s": compile_s,
        "losses": [float(loss_a), float(loss_b)], "gradients_rel": worst, "ms": ms, "timings": timings.as_dict(1000)})


if __name__ == "__main__":
    main()
