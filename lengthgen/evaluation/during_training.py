"""Tests during training (`train.test_interval`): exact match at the curriculum's current
maximum and at `train.test_lengths`, every `test_interval` steps, written beside the loss in
metrics.jsonl. The released looped-tf code tests this way every 1000 steps (512 samples at the
current longest training length and at the test length); here the samples are the evaluator's
fixed test set of each length (eval.seed), so a curve compares one set of problems over time.

The weights tested are those evaluated after training (the EMA when train.ema > 0, once it has
started: train.ema_start). Testing reads no training random stream, so a run with tests trains
the same weights as one without. train.test_options sets task options of the tested samples
(the released Multiplication tests fix the short factor: {min_a_bits = 2}); train.test_offset
moves the tests to steps offset, offset + interval, ... (the released ones: 1, 1001, ...).
"""
from __future__ import annotations

import torch

from lengthgen.assembly import Run
from lengthgen.config.schema import Config, TrainConfig, parse_lengths
from lengthgen.evaluation.evaluate import rules_at
from lengthgen.runtime.devices import autocast
from lengthgen.results.metrics_log import PREFIX
from lengthgen.tasks import Task, task_of



def due(tr: TrainConfig, step: int) -> bool:
    """Whether the tests run after `step`: steps test_offset + k * test_interval (k >= 0, step >= 1)."""
    return tr.test_interval > 0 and step >= max(tr.test_offset, 1) and (step - tr.test_offset) % tr.test_interval == 0


def key(length: str, stop: str | None) -> str:
    return PREFIX + length + ("" if stop in (None, "oracle") else f"/{stop}")


@torch.no_grad()
def run_tests(run: Run, tested: Task, model, current_max: int, device: torch.device) -> dict:
    """{key: exact match} at the current maximum and at each of train.test_lengths, on samples
    of `tested` (the run's task with train.test_options), position IDs as evaluation reads them."""
    cfg, method, transform = run.cfg, run.method, run.transform
    # train.test_stops, else the oracle, for methods with stop rules (the others ignore them); the
    # method reads out in its own eval.confidence_precision
    stops, tr = method.stops(cfg.train.test_stops), cfg.train
    lengths = [("max", current_max)] + [(str(n), n) for n in (parse_lengths(tr.test_lengths) if tr.test_lengths else [])]
    training = model.training
    model.eval()
    out = {}
    with torch.random.fork_rng(devices=[]), autocast(device, tr.precision):
        for name, n in lengths:
            results, _ = rules_at(tested, method, model, n, tr.test_samples, cfg.eval.batch_size, cfg.eval.seed,
                                  device, stops, transform=transform, draws=cfg.eval.position_draws)
            out.update({key(name, stop): results[stop]["accuracy"] for stop in stops})
    model.train(training)
    return out


def training_tests(run: Run, device: torch.device) -> list:
    """The hooks a run's config asks of training (given to lengthgen.training.trainer.train by its
    caller, so training imports nothing from evaluation): its tests, where train.test_interval > 0."""
    return [TestsDuringTraining(run, device)] if run.cfg.train.test_interval > 0 else []


class TestsDuringTraining:
    """The trainer's hook (lengthgen.training.trainer.Trainer): due every test_interval steps
    from test_offset, and after the last step."""

    def __init__(self, run: Run, device: torch.device):
        self.run, self.cfg, self.device = run, run.cfg, device
        tr = run.cfg.train  # the tested samples' task: the run's, these options replacing its own
        self.tested = task_of(run.cfg.task, **tr.test_options) if tr.test_options else run.task

    def due(self, step: int, last: bool) -> bool:
        return due(self.cfg.train, step) or last

    def __call__(self, weights, current_max: int) -> dict:
        return run_tests(self.run, self.tested, weights, current_max, self.device)
