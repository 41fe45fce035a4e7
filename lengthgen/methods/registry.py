"""Methods: named recipes over a model, a loss and a prediction rule.

A method builds its model, computes the training loss of a Batch and predicts
the answer tokens at the scored positions. Every method is compared on the
same metric: exact match of the whole answer (its tokens, and the EOS of tasks
whose answer length varies).

`ntp` is plain next-token prediction with a decoder. Its exact match is
computed from one teacher-forced pass: if the argmax at every scored
position is right, greedy decoding reproduces the answer token by token (each
step sees only correct earlier tokens), and if any is wrong greedy decoding
goes wrong at the first such position. So the two exact-match scores are
identical, and one pass costs a fraction of T decoding passes.
`token_accuracy` is the teacher-forced per-token accuracy.

`looped` / `looped-wo-injection` are the looped transformer with whole-answer
prediction and step-dependent supervision (lengthgen.methods.looped.block); `predict` stops
at the oracle T(n), `predict_stop` takes any rule of lengthgen.methods.looped.stop_rules.
Baselines: `ntp-loop` (next-token prediction through the looped block run a
fixed T(train_max) times, with input injection like the looped model, so only
the output format and the adaptive depth differ) and `ntp-pause` (T(n) BLANK
pause tokens between question and answer, see `pause_batch`).

`ppc` is Predictive Position Coupling (Golowich et al., ICML 2025): ntp that also
predicts each next token's coupled position ID, decoded greedily with those IDs.

`rnn`, `lstm`, `stack-rnn`, `tape-rnn` are Delétang et al.'s recurrent baselines
(lengthgen.methods.recurrent); the `Method` base they share with these is lengthgen.methods.base.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lengthgen import register
from lengthgen.config.schema import Config
from lengthgen.methods.base import Method
from lengthgen.methods.encoder import Encoder
from lengthgen.methods.looped.block import (LoopedTransformer, fixed_shape_loss, looped_loss, oracle_logits,
                                           per_sample_steps)
from lengthgen.methods.looped.halting import (Clock, HaltingLooped, HaltProbe, clock_loss, fit_probe_on_lengths,
                                              halt_loss, uncertain_loss)
from lengthgen.methods.looped import fixed_steps
from lengthgen.methods.looped.stop_passes import confidence_precision
from lengthgen.methods.looped.stop_rules import parse_rule, predict_stop, read_out
from lengthgen.methods.recurrent import LSTMMethod, RNNMethod, StackRNNMethod, TapeRNNMethod
from lengthgen.model.positions import SCHEMES
from lengthgen.model.transformer import Transformer
from lengthgen.tasks import BLANK, IGNORE, PAD, Batch, Task


class NextTokenPrediction(Method):
    name = "ntp"

    def logits(self, model, batch):
        return model(batch.inputs, batch.position_ids)

    def last_logits(self, model, batch, last):
        # the read-out at one column per row: with a large vocabulary it costs as much as the blocks
        ids = model.position_ids_for(batch.inputs, batch.position_ids)
        h = model.run_blocks(model.embed(batch.inputs, ids), ids)  # (B, T, D)
        return model.head(h[torch.arange(len(last), device=last.device), last])  # (B, V)


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
        """(pred (B, L), read-out step (B,)) under a stop rule (text or StopRule), see lengthgen.methods.looped.stop_rules."""
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


def steps_at(task: Task, length: int) -> int:
    """T(length): the largest n_steps over a fixed sample (it varies with the
    sample for multiplication, whose T is len(a) * n)."""
    return int(task.sample(256, length, torch.Generator().manual_seed(0)).n_steps.max())


class NTPLoop(Method):
    """Next-token prediction through the looped block, looped T(train_max) times for every token."""
    name = "ntp-loop"

    def __init__(self, cfg=None):
        super().__init__(cfg)
        self.n_loops = 0  # T(task.train_max), worked out with the model (build_model): not a weight

    def build_model(self, cfg, task):
        self.n_loops = steps_at(task, cfg.task.train_max)
        return LoopedTransformer(cfg.model, task.vocab_size, injection=True)

    def logits(self, model, batch):
        return model(batch.inputs, batch.position_ids, n_steps=self.n_loops)


def pause_batch(batch: Batch, n_pause: Tensor | None = None) -> Batch:
    """Insert n_pause[b] (default T(n) = n_steps) BLANK pause tokens after the
    question of row b. The pauses join the question (question_len grows), so
    the scored region, answer + EOS, shifts right by n_pause[b]. Vectorised."""
    if batch.position_ids is not None:
        raise ValueError("ntp-pause does not support explicit position_ids")
    p = (batch.n_steps if n_pause is None else n_pause).clamp(min=0)[:, None]  # (B, 1)
    q = batch.question_len[:, None]  # (B, 1)
    B, L = batch.inputs.shape
    scored_end = q + batch.scored.sum(1, keepdim=True) - 1 + p  # (B, 1) one past the last scored column
    width = int(scored_end.max())
    j = torch.arange(width, device=p.device)[None, :]  # (1, W')
    src = (j - p).clamp(0, L - 1)  # (B, W') column of the original batch after the pauses
    shifted_in = torch.where(j - p < L, batch.inputs.gather(1, src), PAD)
    inputs = torch.where(j < q, batch.inputs.gather(1, j.clamp(max=L - 1).expand(B, -1)),
                         torch.where(j < q + p, BLANK, shifted_in))
    targets = torch.where((j >= q - 1 + p) & (j < scored_end), batch.targets.gather(1, src), IGNORE)
    return Batch(inputs=inputs, targets=targets, question_len=batch.question_len + p[:, 0],
                 lengths=batch.lengths, n_steps=batch.n_steps)


class NTPPause(Method):
    name = "ntp-pause"
    capturable = False  # pause_batch reads the paused width on the host
    accepts_position_ids = False  # pause_batch lays the sequence out anew
    needs_answer_region = True

    def model_batch(self, batch):
        return pause_batch(batch)

    def logits(self, model, batch):
        """(B, L, V) in the original layout: scored position j of row b reads
        the paused logits at j + n_pause[b]."""
        paused = pause_batch(batch)
        logits = model(paused.inputs)  # (B, W', V)
        j = torch.arange(batch.inputs.shape[1], device=logits.device)[None, :]
        p = batch.n_steps.clamp(min=0)[:, None]
        src = torch.where(j >= batch.question_len[:, None] - 1, j + p, j).clamp(max=logits.shape[1] - 1)
        return logits.gather(1, src[:, :, None].expand(-1, -1, logits.shape[2]))


class PredictivePositionCoupling(Method):
    """Next-token prediction plus a second head on the same hidden state that predicts the
    position ID of the next token, trained on the task's coupled IDs (`Batch.target_ids`)
    with cross-entropy added to the token loss times its option `id_loss_weight` (method_options). At inference
    every generated token takes the ID the model predicted for it: greedy decoding with a
    KV cache (lengthgen.model.generate), so exact match is that of real generation."""

    name = "ppc"
    needs_target_ids = True
    metric_names = ("id_accuracy",)

    def __init__(self, cfg=None, id_loss_weight: float = 1.0):
        super().__init__(cfg)
        self.id_loss_weight = loss_weight("id_loss_weight", id_loss_weight)

    @classmethod
    def check(cls, cfg, task, transform, scheme):
        """The task supplies the next IDs, the transform moves them with the rest, the scheme decodes
        with a KV cache and shows the model where a random start put the IDs."""
        super().check(cfg, task, transform, scheme)
        batch = task.sample(2, cfg.task.train_min, torch.Generator().manual_seed(0))
        if batch.target_ids is None:
            raise ValueError(f"method {cfg.method} predicts coupled position IDs, which {task.name} with options "
                             f"{cfg.task.options or '{}'} does not supply (is there a coupled option?)")
        if not transform.shifts_all_ids:
            raise ValueError(f"method {cfg.method} needs a data.position_transform that moves a next token's ID "
                             f"with the rest (none or random_offset), not {transform.name}")
        if not scheme.cacheable():
            cached = [name for name, s in SCHEMES.items() if s.cacheable()]
            raise ValueError(f"method {cfg.method} decodes with a KV cache, which model.position {cfg.model.position} "
                             f"cannot use; use {', '.join(cached)}")
        # the ID head names absolute IDs: a scheme that never adds them to the input (RoPE sees only
        # differences) cannot tell one random start from another, so its targets become guesses
        if transform.random_start and not scheme.adds_ids:
            absolute = [name for name, s in SCHEMES.items() if s.adds_ids]
            raise ValueError(f"method {cfg.method} predicts absolute position IDs, which model.position "
                             f"{cfg.model.position} never shows the model, so data.position_transform "
                             f"{transform.name} makes them unpredictable; use {' or '.join(absolute)} positions, "
                             "or no transform")

    def build_model(self, cfg, task):
        model = Transformer(cfg.model, task.vocab_size)
        model.id_head = nn.Linear(cfg.model.d_model, cfg.model.max_positions, bias=False)  # ID classes 0..max-1
        return model

    def hidden(self, model, batch) -> Tensor:  # (B, L, D) after the final norm
        ids = model.position_ids_for(batch.inputs, batch.position_ids)
        return model.ln_f(model.run_blocks(model.embed(batch.inputs, ids), ids))

    def logits(self, model, batch):  # the token logits of a teacher-forced pass
        return model.read_out(self.hidden(model, batch))

    def loss(self, model, batch):
        if batch.target_ids is None:
            raise ValueError("ppc needs a task that supplies coupled position IDs (e.g. task.options.coupled = true)")
        h = self.hidden(model, batch)
        tokens = F.cross_entropy(model.read_out(h).flatten(0, 1).float(), batch.targets.flatten(), ignore_index=IGNORE)
        ids = F.cross_entropy(model.id_head(h).flatten(0, 1).float(), batch.target_ids.flatten(), ignore_index=IGNORE)
        return tokens + self.id_loss_weight * ids

    @torch.no_grad()
    def metrics(self, model, batch):
        """id_accuracy: the share of a sample's answer positions whose next ID the ID head
        predicts right, given the true tokens and IDs before it (teacher-forced)."""
        scored = batch.target_ids != IGNORE
        hit = (model.id_head(self.hidden(model, batch)).argmax(-1) == batch.target_ids) & scored
        return {"id_accuracy": hit.sum(1).float() / scored.sum(1).clamp(min=1)}

    @torch.no_grad()
    def predict(self, model, batch):
        from lengthgen.model.generate import generate_answers
        return generate_answers(model, batch, next_id=predicted_id)


def predicted_id(model, hidden: Tensor, last_id: Tensor) -> Tensor:
    """PPC's ID for the next token: the argmax of the ID head on the last hidden state."""
    return model.id_head(model.ln_f(hidden)).argmax(-1)


# The built-ins, registered as plugins are (lengthgen.register), in the order listings show them
METHODS = register.METHODS
METHODS.base = Method
for _cls in (NextTokenPrediction, Looped, LoopedNoInjection, LoopedHalt, LoopedHaltProbe, LoopedUncertain, LoopedClock,
             NTPLoop, NTPPause, PredictivePositionCoupling, Encoder,
             RNNMethod, LSTMMethod, StackRNNMethod, TapeRNNMethod):  # the last four: Delétang et al.'s baselines
    METHODS.add(_cls.name, _cls)


def get_method(name: str, cfg: Config | None = None) -> Method:
    """The method `name`, holding its settings from `cfg` and its options from cfg.method_options
    (its defaults without one)."""
    return METHODS[name](cfg, **(cfg.method_options if cfg is not None else {}))


def loss_weight(option: str, value) -> float:
    """A method's loss weight option: a finite number >= 0 (ValueError naming it otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise ValueError(f"{option} must be a finite number >= 0, got {value!r}")
    return float(value)
