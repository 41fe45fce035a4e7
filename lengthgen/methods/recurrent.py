"""The recurrent and memory-augmented baselines of Delétang et al. (ICLR 2023) as methods: `rnn`,
`lstm`, `stack-rnn`, `tape-rnn` (models in lengthgen.model.recurrent, equations and defaults in
docs/chomsky.md).

The authors' protocol: the model reads the whole tape, the n input tokens followed by T_out empty
output slots, and is scored at the slots; it never sees an answer token. lengthgen's batch is
`question = answer` with the targets from the '=' on (lengthgen.tasks.base), so the tape is the
batch with the '=' and every answer input blanked (`slots_tape`: the '=' column is the first
slot), and the logits at column j are read against the targets at j, as whole-answer methods do.
For a Chomsky task that is the authors' tape exactly; for any other task with an answer region
it is the same protocol (question, then one BLANK slot per scored position).

A recurrent model has no positions: the methods take no position IDs (a task's coupled IDs are
ignored, a transform that changes them is refused) and refuse every model.position but nope. They
read model.d_model as the hidden width and no other model key.
"""
from __future__ import annotations

from torch import Tensor, nn

from lengthgen.methods.base import Method
from lengthgen.model.recurrent import LSTM, RNN, Recurrent, StackRNN, TapeRNN
from lengthgen.tasks import Batch
from lengthgen.tasks.chomsky_common import slots_tape


class RecurrentMethod(Method):
    """A recurrent model read at the output slots of the authors' tape (module docstring).
    Capturable: the tape is built on the device without host syncs, the model is causal (extra
    PAD columns change nothing before them) and a stack deeper than the steps taken changes
    nothing (tests/accel/test_captured.py)."""

    model_class: type[Recurrent] = RNN
    needs_answer_region = True
    accepts_position_ids = False
    has_positions = False

    def build_model(self, cfg, task) -> nn.Module:
        return self.model_class(cfg.model, task.vocab_size)

    def model_batch(self, batch: Batch) -> Batch:
        return slots_tape(batch)

    def logits(self, model, batch: Batch) -> Tensor:  # (B, L, V), column j scored against targets[:, j]
        # the input length l of each row (the Tape-RNN's jump): the question without its '='
        return model(slots_tape(batch).inputs, batch.question_len - 1)


class RNNMethod(RecurrentMethod):
    name = "rnn"
    model_class = RNN
    stackable = False  # torch's fused RNN kernel has no vmap rule


class LSTMMethod(RecurrentMethod):
    name = "lstm"
    model_class = LSTM
    stackable = False  # torch's fused LSTM kernel has no vmap rule


class StackRNNMethod(RecurrentMethod):
    name = "stack-rnn"
    model_class = StackRNN


class TapeRNNMethod(RecurrentMethod):
    name = "tape-rnn"
    model_class = TapeRNN
    # its ring has as many cells as the batch's padded width, and a head that wanders past the
    # written cells wraps around it: padding a batch can change the loss, so no shape buckets
    capturable = False
