"""Tests during training (`tests.interval`): exact match at the curriculum's current
maximum and at `tests.lengths`, every `tests.interval` steps, written beside the loss in
metrics.jsonl. The released looped-tf code tests this way every 1000 steps (512 samples at the
current longest training length and at the test length); here the samples are the evaluator's
fixed test set of each length (eval.seed), so a curve compares one set of problems over time.

The weights tested are those evaluated after training (the EMA when optim.ema > 0, once it has
started: optim.ema_start). Testing reads no training random stream, so a run with tests trains
the same weights as one without. tests.options sets task options of the tested samples
(the released Multiplication tests fix the short factor: {min_a_bits = 2}); tests.offset
moves the tests to steps offset, offset + interval, ... (the released ones: 1, 1001, ...).
"""
from __future__ import annotations

import torch

from lengthgen.assembly.runs import Run
from lengthgen.config.schema import Config, TrainTestsConfig, parse_lengths
from lengthgen.evaluation.evaluate import Measure, rules_at
from lengthgen.runtime.devices import autocast
from lengthgen.results.metrics_log import PREFIX
from lengthgen.tasks import Task, task_of



def due(te: TrainTestsConfig, step: int) -> bool:
    """Whether the tests run after `step`: steps tests.offset + k * tests.interval (k >= 0, step >= 1)."""
    return te.interval > 0 and step >= max(te.offset, 1) and (step - te.offset) % te.interval == 0


def key(length: str, stop: str | None) -> str:
    return PREFIX + length + ("" if stop in (None, "oracle") else f"/{stop}")


@torch.no_grad()
def run_tests(run: Run, tested: Task, model, current_max: int, device: torch.device) -> dict:
    """{key: exact match} at the current maximum and at each of tests.lengths, on samples
    of `tested` (the run's task with tests.options), position IDs as evaluation reads them."""
    cfg, method, transform = run.cfg, run.method, run.transform
    # tests.stops, else the oracle, for methods with stop rules (the others ignore them); the
    # method reads out in its own eval.confidence_precision
    stops, te = method.stops(cfg.tests.stops), cfg.tests
    lengths = [("max", current_max)] + [(str(n), n) for n in (parse_lengths(te.lengths) if te.lengths else [])]
    training = model.training
    model.eval()
    out = {}
    ctx = Measure(method, model, te.samples, cfg.eval.batch_size, cfg.eval.seed, device, stops, transform=transform,
                  draws=cfg.eval.position_draws)
    with torch.random.fork_rng(devices=[]), autocast(device, cfg.train.precision):
        for name, n in lengths:
            results, _ = rules_at(ctx, tested, n)
            out.update({key(name, stop): results[stop]["accuracy"] for stop in stops})
    model.train(training)
    return out


def training_tests(run: Run, device: torch.device) -> list:
    """The hooks a run's config asks of training (given to lengthgen.training.trainer.train by its
    caller, so training imports nothing from evaluation): its tests, where tests.interval > 0."""
    return [TestsDuringTraining(run, device)] if run.cfg.tests.interval > 0 else []


class TestsDuringTraining:
    """The trainer's hook (lengthgen.training.trainer.Trainer): due every tests.interval steps
    from tests.offset, and after the last step."""

    def __init__(self, run: Run, device: torch.device):
        self.run, self.cfg, self.device = run, run.cfg, device
        te = run.cfg.tests  # the tested samples' task: the run's, these options replacing its own
        self.tested = task_of(run.cfg.task, **te.options) if te.options else run.task

    def due(self, step: int, last: bool) -> bool:
        return due(self.cfg.tests, step) or last

    def __call__(self, weights, current_max: int) -> dict:
        return run_tests(self.run, self.tested, weights, current_max, self.device)
