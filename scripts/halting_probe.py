"""Can a halting probe read "done" off a trained looped model's states? Fit one after training.

    python scripts/halting_probe.py RUN [LENGTH ...]

The model is frozen. The probe of `looped-halt-probe` (lengthgen.halting.fit_probe_on_lengths:
an MLP on the mean states over the answer and over the question, "done" = t >= T(n), fitted on
the training lengths) is fitted here on any looped run. At each test LENGTH (default 1.5x and
2x the training maximum) a sample is read out at the first iteration the probe calls done.
Prints, per length, how often that is exactly T(n) and the exact match there next to the
oracle's. A probe that fits the training lengths but misses T(n) beyond them says the states
hold no length-general "done" signal for a head to find.
"""
from __future__ import annotations

import torch

from lengthgen.evaluate import eval_batches
from lengthgen.halting import fit_probe_on_lengths, probe_data
from lengthgen.looped import per_sample_steps
from lengthgen.stop_passes import trace
from run_args import open_run


@torch.no_grad()
def main() -> None:
    _, lengths, cfg, task, _, model = open_run("halting_probe", [], looped=True)
    lengths = lengths or [int(1.5 * cfg.task.train_max), 2 * cfg.task.train_max]
    cpu = torch.device("cpu")
    probe = fit_probe_on_lengths(model, task, range(cfg.task.train_min, cfg.task.train_max + 1), cpu)
    print(f"probe fitted on lengths {cfg.task.train_min}-{cfg.task.train_max}")
    print("| length | stops at T(n) | exact match at the probe's step | at T(n) (oracle) |\n|---:|---:|---:|---:|")
    for n in [cfg.task.train_max, *lengths]:
        batch = next(eval_batches(task, n, 512, 512, cfg.eval.seed, cpu))
        x, _ = probe_data(model, batch)
        right = trace(model, batch, len(x)).exact  # (T, B)
        done = probe(x) > 0
        first = torch.where(done.any(0), done.float().argmax(0), len(x) - 1)  # (B,) 0-based
        steps = per_sample_steps(batch)
        print(f"| {n} | {(first + 1 == steps).float().mean():.3f} | {right.gather(0, first[None])[0].float().mean():.3f}"
              f" | {right.gather(0, (steps - 1)[None])[0].float().mean():.3f} |")


if __name__ == "__main__":
    main()
