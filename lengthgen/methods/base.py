"""The Method base: what callers may ask of a method (its capabilities), and the defaults a method
overrides; and what several families share (`loss_weight`, `steps_at`). Each family of methods has a
module of its own that imports this base (next_token.py, ppc.py, encoder.py, recurrent.py, and
looped/methods.py), and lengthgen.methods.registry imports them all to fill `METHODS`, without an
import cycle."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lengthgen.config.schema import Config
from lengthgen.model.positions import PositionalScheme
from lengthgen.model.transformer import Transformer
from lengthgen.tasks import IGNORE, Batch, Task, measure


class Method:
    """What callers may ask of a method instead of comparing names:
    `has_stop_rules`: `predict_stop(model, batch, rule)` reads out a looped model under a
    rule of lengthgen.methods.looped.stop_rules, and `--stop` / `--per-step` apply;
    `stops(texts)` / `read_out(model, batch, task, stops, per_step)`: the read-outs evaluation
    labels its rows by, and their metrics on a batch (with the per-iteration curve of a method
    with stop rules): evaluation asks these, and knows no stop rule;
    `accepts_position_ids`: the model reads `Batch.position_ids` (task or transform IDs);
    `has_halt_head`: the model has a halting head that the `halt` rule reads;
    `needs_answer_region`: the method works on one answer after the question (whole-answer
    prediction, pause tokens), so tasks scored inside the sequence (Task.answer_region
    False, e.g. flip-flop) do not suit it;
    `has_positions`: the model reads the positional scheme of model.position; a model without
    positions (the recurrent baselines) refuses every scheme but NoPE, the one that does nothing;
    `needs_target_ids`: the method learns the next token's position ID (`Batch.target_ids`),
    so the task must supply coupled IDs;
    `model_batch(batch)`: the batch as the model reads it (for sizing position tables);
    `finish(model, cfg, task, device)`: work on the trained model before its last checkpoint;
    `metric_names` / `metrics(model, batch)`: the method's own evaluation metrics, per sample;
    `bidirectional`: the method can run an encoder (model.causal = false): it reads whole answers
    from blank slots, never decodes, and no column of a row sees padding or another row's tokens;
    `capturable`: `fixed_shape_loss(model, batch, iterations)` is the loss with no host sync, of
    a batch padded to a fixed width and run `iterations(batch)` or more loop iterations, which
    a CUDA graph can record (lengthgen.accel.captured);
    `stackable`: that loss also runs under torch.func.vmap, so seeds can train as one stacked
    model (lengthgen.accel.stacked)."""

    name = ""
    has_stop_rules = False
    has_halt_head = False  # the model has a trained halting head (the `halt` stop rule)
    accepts_position_ids = True
    has_positions = True
    needs_answer_region = False
    needs_target_ids = False
    capturable = True
    stackable = True  # torch's LSTM and RNN kernels have no vmap rule: the recurrent baselines set False
    bidirectional = False  # model.causal = false accepted (lengthgen.methods.encoder)
    metric_names: tuple[str, ...] = ()

    def __init__(self, cfg: Config | None = None):
        """A method holds its own settings, read from the config it trains (defaults without one)."""

    @classmethod
    def check(cls, cfg: Config, task: Task, transform: type, scheme: type) -> None:
        """ValueError (naming the key) if this method cannot run the config's task, position
        transform and positional scheme (classes); methods add their own rules."""
        if cls.needs_answer_region and not task.answer_region:
            raise ValueError(f"method {cfg.method} predicts one answer after the question; {task.name} is scored "
                             "inside the sequence (use a next-token method such as ntp)")
        if transform.changes_ids and not cls.accepts_position_ids:
            raise ValueError(f"data.position_transform {transform.name!r} needs a method that reads position IDs; "
                             f"{cfg.method} lays out its own")
        if not cls.has_positions and scheme is not PositionalScheme:
            raise ValueError(f"model.position {cfg.model.position!r}: method {cfg.method} has no positions to encode "
                             "(a recurrent model reads its tape in order); leave model.position at nope")

    def metrics(self, model: nn.Module, batch: Batch) -> dict[str, Tensor]:
        """{name: (B,) float} for every name in `metric_names`."""
        return {}

    def stops(self, texts: list[str] | None = None) -> list[str | None]:
        """The read-outs evaluation labels its rows by: [None], the method's own prediction. A
        method without stop rules ignores `texts` (the CLI and the grid refuse them)."""
        return [None]

    def read_out(self, model: nn.Module, batch: Batch, task: Task, stops: list[str | None],
                 per_step: bool = False) -> tuple[list[tuple[dict[str, Tensor], Tensor | None]], dict[str, Tensor] | None]:
        """Each read-out of `stops` (`stops()`) on one batch: ({metric: (B,)}, the iteration each
        sample was read out at (B,), None without iterations); and with `per_step` the batch's
        curve {column: (T,) sum over its samples after each iteration}, None for a method
        without stop rules."""
        values = self.values(model, batch, task, self.predict(model, batch))
        return [(values, None) for _ in stops], None

    def values(self, model: nn.Module, batch: Batch, task: Task, pred: Tensor) -> dict[str, Tensor]:
        """Every metric of the prediction `pred` (B, L), per sample: the task's (`tasks.measure`)
        and the method's own (`metrics`)."""
        return {**measure(task, pred, batch), **self.metrics(model, batch)}

    def build_model(self, cfg: Config, task: Task) -> nn.Module:
        return Transformer(cfg.model, task.vocab_size)

    def model_batch(self, batch: Batch) -> Batch:
        return batch

    def finish(self, model: nn.Module, cfg: Config, task: Task, device: torch.device) -> None:
        """Called once when training ends, before the last checkpoint is written."""

    def logits(self, model: nn.Module, batch: Batch) -> Tensor:  # (B, L, V)
        raise NotImplementedError

    def last_logits(self, model: nn.Module, batch: Batch, last: Tensor) -> Tensor:  # (B, V)
        """The logits at column last[b] of each row: a per-token measurement scores one position per
        row (lengthgen.evaluation.language_model). A method that can skip the read-out elsewhere overrides it."""
        return self.logits(model, batch)[torch.arange(len(last), device=last.device), last]

    def loss(self, model: nn.Module, batch: Batch) -> Tensor:
        logits = self.logits(model, batch)
        return F.cross_entropy(logits.flatten(0, 1).float(), batch.targets.flatten(), ignore_index=IGNORE)

    def iterations(self, batch: Batch) -> int:
        """Loop iterations a batch (on the CPU) needs; 0 for a method without a loop."""
        return 0

    def fixed_shape_loss(self, model: nn.Module, batch: Batch, iterations: int) -> Tensor:
        return self.loss(model, batch)

    @torch.no_grad()
    def predict(self, model: nn.Module, batch: Batch) -> Tensor:
        """(B, L) predicted token at every position; only scored ones count."""
        return self.logits(model, batch).argmax(-1)


def loss_weight(option: str, value) -> float:
    """A method's loss weight option: a finite number >= 0 (ValueError naming it otherwise)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
        raise ValueError(f"{option} must be a finite number >= 0, got {value!r}")
    return float(value)


def steps_at(task: Task, length: int) -> int:
    """T(length): the largest n_steps over a fixed sample (it varies with the
    sample for multiplication, whose T is len(a) * n). The depth ntp-loop runs at, and the loop
    count a looped run is sized and exported by."""
    return int(task.sample(256, length, torch.Generator().manual_seed(0)).n_steps.max())
