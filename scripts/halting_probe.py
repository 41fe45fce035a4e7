"""Can a halting probe read "done" off a trained looped model's states? Fit some after training.

    python scripts/halting_probe.py RUN [LENGTH ...] [--steps N]

The model is frozen. Four probes are fitted on its states at the training lengths, labelled
"done" at every iteration t >= T(n) (up to T(n) + 4), and each is then used as a stop rule:

- mlp:        the probe of `looped-halt-probe` (lengthgen.methods.looped.halting.fit_probe_on_lengths), an MLP
              on the mean state over the answer and over the question;
- linear:     a linear probe on the same features;
- mlp+change: the MLP on those features and on their change since the previous iteration;
- token-min:  an MLP on each question token's state (the '=' included), the sample done when
              every token says done (the least of the token logits): a signal that each
              token has been "used" would carry to any length.

At each test LENGTH (default 1.5x and 2x the training maximum) a sample is read out at the
first iteration the probe calls done, else at the `halt` rule's last one (2 T(n)). Prints, per
probe and length, how often that is exactly T(n), the exact match there next to the oracle's,
and the mean iteration used. Probes that fit the training lengths but miss T(n) beyond them say
the states hold no length-general "done" signal for a head to find. --steps: the probes'
full-batch Adam steps (default 1000).
"""
from __future__ import annotations

import sys

import torch
from torch import Tensor, nn

from lengthgen.evaluation.evaluate import eval_batches
from lengthgen.methods.looped.block import per_sample_steps
from lengthgen.methods.looped.halting import PROBE_EXTRA, PROBE_SAMPLES, fit_probe_on_lengths, probe_data, train_probe
from lengthgen.methods.looped.stop_passes import start_blanked, trace
from lengthgen.methods.looped.stop_rules import default_t_max
from run_args import open_run

PROBES = ("mlp", "linear", "mlp+change", "token-min")


@torch.no_grad()
def features(probe: str, model, batch, extra: int) -> tuple[Tensor, Tensor | None, Tensor]:
    """(T, B, F) or, for token-min, (T, B, L, D) features after iterations 1 .. max T_i + extra;
    the (B, L) question mask of token-min (None otherwise); (T, B) bool labels t >= T_i."""
    if probe != "token-min":
        x, done = probe_data(model, batch, extra)
        if probe == "mlp+change":
            x = torch.cat([x, x - torch.cat([torch.zeros_like(x[:1]), x[:-1]])], -1)
        return x, None, done
    (h, e, pos), w = start_blanked(model, batch)
    scored, steps, states = batch.scored[:, :w], per_sample_steps(batch), []
    for _ in range(int(steps.max()) + extra):
        h = model.step(h, e, pos)
        states.append(h.float())
    done = torch.arange(1, len(states) + 1)[:, None] >= steps[None]
    first = scored.float().argmax(1)  # the '=' (the first scored position)
    return torch.stack(states), torch.arange(w)[None] <= first[:, None], done


class Probe(nn.Module):
    """A linear or MLP probe on standardised features; with a question mask, the least logit
    over the question's tokens."""

    def __init__(self, x: Tensor, hidden: int):
        super().__init__()
        self.mean, self.std = x.mean(0), x.std(0) + 1e-6
        d = x.shape[1]
        self.net = nn.Linear(d, 1) if not hidden else nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, 1))

    def forward(self, x: Tensor, question: Tensor | None) -> Tensor:
        z = self.net((x - self.mean) / self.std)[..., 0]
        return z if question is None else z.masked_fill(~question, float("inf")).amin(-1)


def fit(probe: str, model, task, lengths: range, steps: int):
    """A function (features, question mask) -> (T, B) logits, fitted on the training lengths."""
    if probe == "mlp":
        library = fit_probe_on_lengths(model, task, lengths, torch.device("cpu"), steps)
        return lambda x, _: library(x)
    data = [features(probe, model, task.sample(PROBE_SAMPLES, n, torch.Generator().manual_seed(n)), PROBE_EXTRA)
            for n in lengths]
    rows = torch.cat([x[:, q].flatten(0, 1) if q is not None else x.flatten(0, 1) for x, q, _ in data])  # what is standardised
    torch.manual_seed(0)
    net = Probe(rows, 0 if probe == "linear" else 128)
    train_probe(lambda: [net(x, q) for x, q, _ in data], [y for *_, y in data], net.parameters(), steps)
    return net


def adam_steps() -> int:
    """The value of --steps (removed from sys.argv, which open_run reads), default 1000."""
    if "--steps" not in sys.argv:
        return 1000
    i = sys.argv.index("--steps")
    value = sys.argv[i + 1] if i + 1 < len(sys.argv) else ""
    if not (value.isascii() and value.isdigit() and int(value) > 0):
        sys.exit(f"halting_probe: --steps needs a positive integer, got {value!r}")
    del sys.argv[i:i + 2]
    return int(value)


@torch.no_grad()
def main() -> None:
    adam = adam_steps()
    _, lengths, cfg, task, _, model = open_run("halting_probe", [], looped=True)
    lengths = lengths or [int(1.5 * cfg.task.train_max), 2 * cfg.task.train_max]
    train = range(cfg.task.train_min, cfg.task.train_max + 1)
    print(f"probes fitted on lengths {train.start}-{train.stop - 1}")
    print("| probe | length | stops at T(n) | exact match at the probe's step | at T(n) (oracle) | mean step |\n"
          "|---|---:|---:|---:|---:|---:|")
    tests = [next(eval_batches(task, n, 512, 512, cfg.eval.seed, torch.device("cpu")))
             for n in [cfg.task.train_max, *lengths]]
    for probe in PROBES:
        rule = fit(probe, model, task, train, adam)
        for n, batch in zip([cfg.task.train_max, *lengths], tests):
            # the `halt` rule's window: a probe that never fires stops at its last iteration
            x, question, _ = features(probe, model, batch, default_t_max(batch) - int(per_sample_steps(batch).max()))
            right = trace(model, batch, len(x)).exact  # (T, B)
            done = rule(x, question) > 0
            first = torch.where(done.any(0), done.float().argmax(0), len(x) - 1)  # (B,) 0-based
            steps = per_sample_steps(batch)
            print(f"| {probe} | {n} | {(first + 1 == steps).float().mean():.3f} "
                  f"| {right.gather(0, first[None])[0].float().mean():.3f} "
                  f"| {right.gather(0, (steps - 1)[None])[0].float().mean():.3f} | {(first + 1).float().mean():.2f} |",
                  flush=True)


if __name__ == "__main__":
    main()
