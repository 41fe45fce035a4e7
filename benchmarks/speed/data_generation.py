"""Data generation speed, and its share of a training step.

For every task: samples generated per second at problem length 20 and 200 (batches of 64), and
the share of one training step spent drawing its batch. The step is the trainer's own
(Trainer.step: draw, forward, backward, clipping, AdamW; benchmarks/common/steps.py) for an ntp
decoder of --width and --layers, lengths mixed in the batch as in training (uniform in 1..20); the
draw is the same trainer's (Trainer.draw). The draw and the step take turns
(benchmarks/common/timing.py), so the share is a ratio of two numbers taken side by side on the
same, possibly busy, machine.

    python benchmarks/speed/data_generation.py [--repeats 200] [--width 64] [--layers 2]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: lengthgen and benchmarks

from benchmarks.common import records  # noqa: E402
from benchmarks.common.steps import TrainerStep  # noqa: E402
from benchmarks.common.timing import alternate  # noqa: E402
from lengthgen.assembly.runs import new_run  # noqa: E402
from lengthgen.tasks import TASKS  # noqa: E402


def measure(name: str, args) -> dict:
    run = new_run(None, [f"task.name={name}", "task.train_min=1", "task.train_max=20",
                         "data.length_sampling=per_sample", f"train.batch_size={args.batch}",
                         f"model.d_model={args.width}", f"model.n_layer={args.layers}", f"model.n_head={args.heads}",
                         "train.device=cpu"])
    g = torch.Generator().manual_seed(0)
    warmup = max(3, args.repeats // 10)
    rate = alternate({n: (lambda n=n: run.task.sample(args.batch, n, g)) for n in (20, 200)}, args.repeats, warmup)
    step = TrainerStep(run, "cpu")
    share = alternate({"data": lambda: step.batches(), "step": step}, max(20, args.repeats // 4), warmup)
    return {"samples_per_s": {n: args.batch / rate.median(n) for n in (20, 200)},
            "data_ms": 1000 * share.median("data"), "step_ms": 1000 * share.median("step"),
            "share": share.ratio("data", "step"),
            "timings": {**{f"sample@{n}": rate[n].as_dict(1000) for n in (20, 200)}, **share.as_dict(1000)}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--width", type=int, default=64, help="model width of the training step")
    p.add_argument("--layers", type=int, default=2, help="model depth of the training step")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--tasks", default=",".join(TASKS), help="comma-separated (default: every task)")
    records.add_arguments(p)
    args = p.parse_args()
    if min(args.repeats, args.batch, args.width, args.layers, args.heads) < 1 or args.width % args.heads:
        p.error("--repeats, --batch, --width, --layers and --heads must be >= 1, and --heads must divide --width")
    unknown = [t for t in args.tasks.split(",") if t not in TASKS]
    if unknown:
        p.error(f"unknown task {unknown[0]!r}; one of: {', '.join(TASKS)}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; batch {args.batch}; "
          f"training step: ntp decoder width {args.width}, {args.layers} layers, lengths mixed in 1..20; medians")
    print(f"{'task':<15} {'samples/s @20':>14} {'samples/s @200':>15} {'data ms':>8} {'step ms':>8} {'data share':>10}")
    results = {}
    for name in args.tasks.split(","):
        r = results[name] = measure(name, args)
        print(f"{name:<15} {r['samples_per_s'][20]:>14,.0f} {r['samples_per_s'][200]:>15,.0f} {r['data_ms']:>8.2f} "
              f"{r['step_ms']:>8.2f} {r['share']:>9.1%}", flush=True)
    records.write(__file__, args, results, device="cpu")


if __name__ == "__main__":
    main()
