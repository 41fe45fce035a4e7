"""Next-token prediction with a decoder, and its two baselines of the looped paper.

`ntp` is plain next-token prediction. Its exact match is computed from one teacher-forced pass:
if the argmax at every scored position is right, greedy decoding reproduces the answer token by
token (each step sees only correct earlier tokens), and if any is wrong greedy decoding goes wrong
at the first such position. So the two exact-match scores are identical, and one pass costs a
fraction of T decoding passes. `token_accuracy` is the teacher-forced per-token accuracy.

`ntp-loop` runs next-token prediction through the looped block (lengthgen.methods.looped.block)
a fixed T(train_max) times, with input injection like the looped model, so only the output format
and the adaptive depth differ; `ntp-pause` puts T(n) BLANK pause tokens between question and answer
(`pause_batch`).
"""
from __future__ import annotations

import torch
from torch import Tensor

from lengthgen.methods.base import Method, steps_at
from lengthgen.methods.looped.block import LoopedTransformer
from lengthgen.tasks import BLANK, IGNORE, PAD, Batch


class NextTokenPrediction(Method):
    name = "ntp"

    def logits(self, model, batch):
        return model(batch.inputs, batch.position_ids)

    def last_logits(self, model, batch, last):
        # the read-out at one column per row: with a large vocabulary it costs as much as the blocks
        ids = model.position_ids_for(batch.inputs, batch.position_ids)
        h = model.run_blocks(model.embed(batch.inputs, ids), ids)  # (B, T, D)
        return model.head(h[torch.arange(len(last), device=last.device), last])  # (B, V)


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
