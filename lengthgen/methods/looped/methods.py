"""The looped methods: the looped transformer with whole-answer prediction and step-dependent
supervision (lengthgen.methods.looped.block), read out under any stop rule
(lengthgen.methods.looped.stop_rules).

`looped` / `looped-wo-injection`: the block with and without input injection; `predict` stops at the
oracle T(n), `predict_stop` takes any rule. The trained stops add a loss on every iteration
(lengthgen.methods.looped.halting): `looped-halt` (a halting head), `looped-clock` (a clock of the
phase t / T(n)), `looped-uncertain` (unconfident before T(n)); `looped-halt-probe` trains as
`looped` and fits a halting probe on the frozen model afterwards.
"""
from __future__ import annotations

import torch
from torch import Tensor

from lengthgen.methods.base import Method, loss_weight
from lengthgen.methods.looped import fixed_steps
from lengthgen.methods.looped.block import (LoopedTransformer, fixed_shape_loss, looped_loss, oracle_logits,
                                           per_sample_steps)
from lengthgen.methods.looped.halting import (Clock, HaltingLooped, HaltProbe, clock_loss, fit_probe_on_lengths,
                                              halt_loss, uncertain_loss)
from lengthgen.methods.looped.stop_passes import confidence_precision
from lengthgen.methods.looped.stop_rules import parse_rule, predict_stop, read_out
from lengthgen.tasks import Batch


class Looped(Method):
    name = "looped"
    has_stop_rules = True
    needs_answer_region = True
    injection = True
    loss_scheme = "prefix"  # or "max" (the authors' way): same loss and gradients, more compute

    def build_model(self, cfg, task):
        return LoopedTransformer(cfg.model, task.vocab_size, injection=self.injection)

    def logits(self, model, batch):  # each sample after its own T(n) iterations
        return oracle_logits(model, batch, self.loss_scheme)

    def __init__(self, cfg=None):
        super().__init__(cfg)
        # the precision of the confidence losses the stop rules compare (stop_passes.confidence_precision)
        self.confidence_precision = cfg.eval.confidence_precision if cfg is not None else "float64"

    def loss(self, model, batch):  # the same value as Method.loss, without padding the logits
        return looped_loss(model, batch, self.loss_scheme)

    def iterations(self, batch):
        return int(per_sample_steps(batch).max())

    def fixed_shape_loss(self, model, batch, iterations):
        return fixed_shape_loss(model, batch, iterations)

    def predict_stop(self, model, batch: Batch, rule="oracle") -> tuple[Tensor, Tensor]:
        """(pred (B, L), read-out step (B,)) under a stop rule (text or StopRule), see
        lengthgen.methods.looped.stop_rules."""
        return predict_stop(model, batch, rule)

    def stops(self, texts=None):
        """Each rule of `texts` once (default the oracle), ValueError for one this method cannot
        read out under (`halt` without a halting head) or that does not parse."""
        stops = list(dict.fromkeys(texts or ["oracle"]))
        for stop in stops:
            parse_rule(stop).check(self)
        return stops

    @torch.no_grad()
    def read_out(self, model, batch, task, stops, per_step=False):
        """The rules read out of one shared pass where they can be (stop_rules.read_out)."""
        with confidence_precision(self.confidence_precision):
            return read_out(self, model, batch, task, stops, per_step)


class StoppingLoss(Looped):
    """A looped method with a stopping loss on every iteration, weighted by its option
    `halt_loss_weight` (method_options); `fixed_step_loss`: the same loss at fixed shapes
    (lengthgen.methods.looped.fixed_steps)."""
    fixed_step_loss = None

    def __init__(self, cfg=None, halt_loss_weight: float = 1.0):
        super().__init__(cfg)
        self.halt_loss_weight = loss_weight("halt_loss_weight", halt_loss_weight)

    def weighted(self, stopping_loss):
        return lambda *args: self.halt_loss_weight * stopping_loss(*args)

    def fixed_shape_loss(self, model, batch, iterations):
        return fixed_shape_loss(model, batch, iterations, self.weighted(type(self).fixed_step_loss))


class LoopedNoInjection(Looped):
    name = "looped-wo-injection"
    injection = False


class LoopedHalt(StoppingLoss):
    """The looped model with a halting head trained on every iteration (lengthgen.methods.looped.halting);
    the `halt` stop rule reads it."""
    name = "looped-halt"
    fixed_step_loss = fixed_steps.halt_loss
    has_halt_head = True

    def build_model(self, cfg, task):
        return HaltingLooped(cfg.model, task.vocab_size, injection=self.injection)

    def loss(self, model, batch):
        return looped_loss(model, batch, self.loss_scheme, self.weighted(halt_loss))


class LoopedClock(StoppingLoss):
    """The looped model with a clock trained on every iteration to read the phase pi t / T(n)
    (lengthgen.methods.looped.halting.clock_loss); the `halt` stop rule stops where the clock implies t = T."""
    name = "looped-clock"
    fixed_step_loss = fixed_steps.clock_loss
    has_halt_head = True

    def build_model(self, cfg, task):
        return HaltingLooped(cfg.model, task.vocab_size, injection=self.injection, head=Clock)

    def loss(self, model, batch):
        return looped_loss(model, batch, self.loss_scheme, self.weighted(clock_loss))


class LoopedHaltProbe(Looped):
    """Plain `looped` training (the head has no loss, so the block trains bit for bit as
    `looped`), then a halting probe fitted on the frozen model's states at the training
    lengths (lengthgen.methods.looped.halting.fit_halt_probe); the `halt` stop rule reads it."""
    name = "looped-halt-probe"
    has_halt_head = True

    def build_model(self, cfg, task):  # no gradient for the probe while the block trains (nor DDP's reduction)
        model = HaltingLooped(cfg.model, task.vocab_size, injection=self.injection, head=HaltProbe)
        model.halt_head.requires_grad_(False)
        return model

    def finish(self, model, cfg, task, device):
        was_training = model.training
        model.eval()
        lengths = range(cfg.task.train_min, cfg.task.train_max + 1)
        model.halt_head.load_state_dict(fit_probe_on_lengths(model, task, lengths, device).state_dict())
        model.train(was_training)


class LoopedUncertain(StoppingLoss):
    """The looped model trained to be unconfident before T(n) (lengthgen.methods.looped.halting); the
    `first-confident` stop rule reads it."""
    name = "looped-uncertain"
    fixed_step_loss = fixed_steps.uncertain_loss

    def loss(self, model, batch):
        return looped_loss(model, batch, self.loss_scheme, self.weighted(uncertain_loss))
