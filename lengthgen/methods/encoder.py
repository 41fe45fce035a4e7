"""`encoder`: whole-answer prediction by one pass of a transformer over the input and blank
answer slots, Delétang et al.'s Transformer (ICLR 2023; their `make_model_with_empty_targets`).

The model reads each row as the suite's tape: the question's tokens, then one BLANK slot per
scored position (the '=' blanked too: `slots_tape`), and is trained by cross-entropy at the slots
on the whole answer at once; it predicts every answer token from that same pass (no decoding, no
teacher forcing). With model.causal = false its attention is bidirectional, as theirs: every
column sees every other column of its row, the slots included.

A bidirectional model would let padding, or a token after a row's last slot (the last answer
token, which the ntp layout keeps as an input), reach the real columns. So each row is run cut to
its own width: rows of one width share a pass (`by_width`), and a batch of one length, which
Delétang et al.'s protocol draws (data.length_sampling = "per_batch") and every evaluation batch
is for their tasks, is a single pass. No CUDA graph capture (a batch padded to a shape bucket
would put padding in the rows).
"""
from __future__ import annotations

import torch
from torch import Tensor

from lengthgen.methods.base import Method
from lengthgen.tasks import Batch
from lengthgen.tasks.chomsky_common import slots_tape


def by_width(batch: Batch) -> list[tuple[Tensor, int]]:
    """[(row indices, width)] for each distinct width of the batch's rows (`Batch.widths`)."""
    widths = batch.widths
    return [((widths == w).nonzero()[:, 0], int(w)) for w in torch.unique(widths).tolist()]


class Encoder(Method):
    name = "encoder"
    needs_answer_region = True
    bidirectional = True
    capturable = False  # shape buckets would pad rows, which bidirectional attention reads

    def model_batch(self, batch):
        return slots_tape(batch)

    def logits(self, model, batch):  # (B, L, V): each row's slots read in one pass cut to its width
        tape = slots_tape(batch)
        B, L = tape.inputs.shape
        groups = by_width(tape)
        if len(groups) == 1:  # one length per batch: one pass
            w = groups[0][1]
            ids = tape.position_ids[:, :w] if tape.position_ids is not None else None
            logits = model(tape.inputs[:, :w], ids)
            return torch.nn.functional.pad(logits, (0, 0, 0, L - w))
        out = None
        for rows, w in groups:
            ids = tape.position_ids[rows, :w] if tape.position_ids is not None else None
            part = model(tape.inputs[rows, :w], ids)  # (n, w, V)
            if out is None:
                out = part.new_zeros(B, L, part.shape[-1])
            out[rows, :w] = part
        return out
