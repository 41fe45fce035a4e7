"""Greedy autoregressive decoding, with a KV cache or by full recomputation.

Exact match of next-token prediction needs no decoding (one teacher-forced pass gives
the same score: docs/architecture.md). Decoding is needed where a generated token's
inputs are not known in advance: with Predictive Position Coupling, each generated
token takes the position ID the model predicted for it. `next_id` chooses that ID:
by default the previous ID + 1 (plain positions); a model with an ID head passes its own.

Rows are decoded in groups of equal question length, so no prompt needs padding.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from lengthgen.model.attention import KVCache
from lengthgen.model.position_transforms import base_ids
from lengthgen.tasks import Batch

# (model, hidden state of the last token (B, D), its position ID (B,)) -> the next token's ID (B,)
NextId = Callable[[torch.nn.Module, Tensor, Tensor], Tensor]


def following_id(model, hidden: Tensor, last_id: Tensor) -> Tensor:
    return last_id + 1


@torch.no_grad()
def greedy(model, prompt: Tensor, prompt_ids: Tensor, steps: int, next_id: NextId = following_id,
           use_cache: bool = True) -> tuple[Tensor, Tensor]:
    """Decode `steps` tokens after `prompt` (B, P) whose IDs are `prompt_ids` (B, P): each
    step appends the argmax token and the ID `next_id` gives it. Returns the generated
    tokens and their IDs, (B, steps) each. Without the cache every step reruns the whole
    sequence: the reference the cache is tested against."""
    tokens, ids = prompt, prompt_ids
    cache = KVCache() if use_cache else None
    new_tokens, new_ids = tokens, ids  # what the next pass runs: all of it, or the new token
    for _ in range(steps):
        h = model.run_blocks(model.embed(new_tokens, new_ids), new_ids, cache=cache)[:, -1]  # (B, D)
        token = model.head(h[:, None])[:, 0].argmax(-1)  # (B,)
        position = next_id(model, h, ids[:, -1])
        tokens, ids = torch.cat([tokens, token[:, None]], 1), torch.cat([ids, position[:, None]], 1)
        new_tokens, new_ids = (token[:, None], position[:, None]) if use_cache else (tokens, ids)
    return tokens[:, prompt.shape[1]:], ids[:, prompt.shape[1]:]


def generate_answers(model, batch: Batch, next_id: NextId = following_id, use_cache: bool = True) -> Tensor:
    """Greedy answers of a batch, as predictions aligned with `batch.targets` (B, L): at a
    scored position j, the token generated after the first j + 1 tokens; so
    `tasks.score(pred, batch)` gives exact match. The question's IDs come from the batch;
    every generated token's from `next_id`."""
    pred = torch.full_like(batch.targets, -1)
    ids = base_ids(batch)
    answer_len = batch.scored.sum(1)  # scored positions: the answer and its EOS, if any
    for q in batch.question_len.unique().tolist():
        rows = (batch.question_len == q).nonzero()[:, 0]
        steps = int(answer_len[rows].max())
        tokens, _ = greedy(model, batch.inputs[rows, :q], ids[rows, :q], steps, next_id, use_cache)
        width = min(steps, pred.shape[1] - (q - 1))
        pred[rows, q - 1:q - 1 + width] = tokens[:, :width]
    return pred
