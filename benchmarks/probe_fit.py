"""The halting probe's fit on distinct samples (each weighing how often it was drawn) against the
fit on every drawn sample, on a trained looped run's frozen states: CPU seconds of each fit, and
how often their "done" decisions agree on test batches at a few lengths (and agree with T(n)).

The two minimise the same loss, so they differ by rounding only; the distinct fit has fewer rows
wherever a length has fewer distinct inputs than PROBE_SAMPLES (Parity up to length 8).

    python benchmarks/probe_fit.py RUN [--lengths 6,12,18,24]

RUN: a looped run folder, e.g. runs/demo/runs/parity-looped-s0 after `make demo`.
"""
from __future__ import annotations

import argparse
import time

import torch

from lengthgen.evaluation.evaluate import eval_batches, load_run
from lengthgen.methods.looped import halting


def fit_every_row(model, batches) -> halting.HaltProbe:
    """The probe fitted on every drawn sample, duplicates included (fit_halt_probe before it
    weighed distinct samples)."""
    xs, ys = zip(*(halting.probe_data(model, b) for b in batches))
    x = torch.cat([a.flatten(0, 1) for a in xs])
    torch.manual_seed(0)
    probe = halting.HaltProbe(x.shape[1] // 2)
    probe.mean.copy_(x.mean(0))
    probe.std.copy_(x.std(0) + 1e-6)
    halting.train_probe(lambda: [probe(x)], [torch.cat([a.flatten() for a in ys])], probe.parameters())
    return probe


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run")
    parser.add_argument("--lengths", default="6,12,18,24")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg, task, _, model, _ = load_run(args.run, torch.device("cpu"))
    model.eval()
    batches = [task.sample(halting.PROBE_SAMPLES, n, torch.Generator().manual_seed(n))
               for n in range(cfg.task.train_min, cfg.task.train_max + 1)]
    began = time.process_time()
    distinct = halting.fit_halt_probe(model, batches)
    seconds_distinct = time.process_time() - began
    began = time.process_time()
    every = fit_every_row(model, batches)
    seconds_every = time.process_time() - began
    print(f"fit, CPU s: every drawn sample {seconds_every:.1f}, distinct samples {seconds_distinct:.1f} "
          f"({seconds_every / seconds_distinct:.2f}x)")
    print("length | decisions equal | every-row fit right | distinct fit right")
    for n in map(int, args.lengths.split(",")):
        x, done = halting.probe_data(model, next(eval_batches(task, n, 256, 256, 7, torch.device("cpu"))))
        a, b = every(x) > 0, distinct(x) > 0
        print(f"{n} | {float((a == b).float().mean()):.4f} | {float((a == done).float().mean()):.4f} | "
              f"{float((b == done).float().mean()):.4f}")


if __name__ == "__main__":
    main()
