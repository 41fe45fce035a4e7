"""Copy: repeat the input bits.

    question "0110="  ->  answer "0110"

`coupled = true` adds coupled position IDs (Cho et al. 2024): input bit i and answer
bit i share the ID 2 + i, "=" takes the start ID 1, padding 0; `target_ids` (each scored
position's next ID) serve Predictive Position Coupling.

T(n) = n looped steps (one per input bit).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import IGNORE, Batch, Task, end_with, make_batch


class Copy(Task):
    name = "copy"
    tokens = ("0", "1", "=")
    answer_symbols = 2
    eos = False  # the question fixes the answer length
    example = "0110= -> 0110"

    def __init__(self, *, coupled: bool = False):
        if not isinstance(coupled, bool):
            raise ValueError(f"copy: coupled must be true or false, got {coupled!r}")
        self.coupled = coupled

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, bits = self.random_bits(batch_size, length, generator)  # (B,), (B, max n)
        zero, equals = self.token_id("0"), self.token_id("=")
        tokens = bits + zero  # row b uses its first n[b] bits; make_batch reads no further
        batch = make_batch(end_with(tokens, n, equals), n + 1, tokens, n.clone(),
                           lengths=n, n_steps=n.clone(), eos=self.eos)
        if self.coupled:
            q = batch.question_len[:, None]
            j = torch.arange(batch.inputs.shape[1])[None, :]
            ids = torch.where(j < q - 1, 2 + j, torch.where(j == q - 1, 1, 2 + j - q))  # bit i -> 2 + i
            batch.position_ids = ids.masked_fill(j >= batch.widths[:, None], 0)
            batch.target_ids = (3 + j - q).masked_fill(~batch.scored, IGNORE)  # the next answer bit's ID
        return batch
