"""Data generation speed, and its share of a training step.

For every task: samples generated per second at problem length 20 and 200
(batches of 64), and the share of one training step (sample + forward +
backward + AdamW) spent drawing its batch, with lengths mixed in the batch as
in training (uniform in 1..20). Both are measured in the same run, so the
share is a ratio of two numbers taken on the same, possibly busy, machine.

    python benchmarks/data_generation.py [--repeats 200] [--width 64] [--layers 2]
"""
from __future__ import annotations

import argparse
import time

import torch

from lengthgen import assembly
from lengthgen.tasks import TASKS
from lengthgen.training.run_state import decay_params
from lengthgen.training.trainer import sample_batch


def best_time(fn, repeats: int) -> float:
    """Median seconds per call after a warm-up (the median resists a noisy machine)."""
    for _ in range(max(3, repeats // 10)):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=64, help="model width of the training step")
    p.add_argument("--layers", type=int, default=2, help="model depth of the training step")
    p.add_argument("--heads", type=int, default=4)
    args = p.parse_args()
    if min(args.repeats, args.batch, args.width, args.layers, args.heads) < 1 or args.width % args.heads:
        p.error("--repeats, --batch, --width, --layers and --heads must be >= 1, and --heads must divide --width")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; batch {args.batch}; "
          f"training step: ntp decoder width {args.width}, {args.layers} layers, lengths mixed in 1..20")
    print(f"{'task':<15} {'samples/s @20':>14} {'samples/s @200':>15} {'data ms':>8} {'step ms':>8} {'data share':>10}")
    for name in TASKS:
        run = assembly.assemble(None, [f"task.name={name}", "task.train_max=20", f"model.d_model={args.width}",
                                       f"model.n_layer={args.layers}", f"model.n_head={args.heads}"])
        cfg, task, method = run.cfg, run.task, run.method
        g = torch.Generator().manual_seed(0)
        rate = {n: args.batch / best_time(lambda n=n: task.sample(args.batch, n, g), args.repeats) for n in (20, 200)}
        model = method.build_model(cfg, task)
        opt = torch.optim.AdamW(decay_params(model), lr=1e-4)

        def data() -> None:
            sample_batch(task, args.batch, 1, 20, g, per_sample=True)

        def step() -> None:
            batch = sample_batch(task, args.batch, 1, 20, g, per_sample=True)
            loss = method.loss(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        data_s = best_time(data, args.repeats)
        step_s = best_time(step, max(20, args.repeats // 4))
        print(f"{name:<15} {rate[20]:>14,.0f} {rate[200]:>15,.0f} {data_s * 1e3:>8.2f} {step_s * 1e3:>8.2f} "
              f"{data_s / step_s:>9.1%}")


if __name__ == "__main__":
    main()
