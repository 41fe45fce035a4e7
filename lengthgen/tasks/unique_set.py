"""Unique Set: the distinct symbols of the input, in order of first appearance.

    question "3 17 3 9 ="  ->  answer "3 17 9"

The question is n symbols drawn uniformly from `symbols` values (default 50,
tokens "0", "1", ...), then "=". Tokens are separated by spaces in text.
Answer lengths differ between samples of the same n.

`coupled = true` adds coupled position IDs: input symbol p takes 2 + p, "=" the start ID
1, each answer symbol the ID of the input occurrence it copies (its first), padding and
EOS 0. Which input an answer token copies depends on the content, not on n: the case
Predictive Position Coupling is for (`target_ids`: each scored position's next ID).

T(n) = n looped steps (one per input symbol).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import IGNORE, MAX_VOCAB, Batch, Task, end_with, make_batch, prefix_mask


class UniqueSet(Task):
    name = "unique_set"
    sep = " "
    tokens = tuple(str(s) for s in range(50)) + ("=",)  # the default; __init__ sets its own
    answer_symbols = 50
    example = "3 17 3 9 = -> 3 17 9"

    def __init__(self, *, symbols: int = 50, coupled: bool = False):
        if not isinstance(symbols, int) or isinstance(symbols, bool) or not 1 <= symbols <= MAX_VOCAB:
            raise ValueError(f"unique_set: symbols must be an integer in 1..{MAX_VOCAB} (the vocabulary "
                             f"is an embedding table), got {symbols!r}")
        if not isinstance(coupled, bool):
            raise ValueError(f"unique_set: coupled must be true or false, got {coupled!r}")
        self.coupled = coupled
        self.symbols = symbols
        self.tokens = tuple(str(s) for s in range(symbols)) + ("=",)
        self.answer_symbols = symbols

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, width = self.lengths_of(batch_size, length)
        x = torch.randint(0, self.symbols, (batch_size, width), generator=generator)  # row b: n[b] symbols
        valid = prefix_mask(n, width) if isinstance(length, Tensor) else None
        # first occurrences: in stable sorted order a value starts a new run
        keyed = x if valid is None else x.masked_fill(~valid, self.symbols)  # padding sorts last
        sorted_x, order = torch.sort(keyed, dim=1, stable=True)
        starts = torch.ones_like(sorted_x, dtype=torch.bool)
        starts[:, 1:] = sorted_x[:, 1:] != sorted_x[:, :-1]
        first = torch.zeros_like(starts).scatter_(1, order, starts)  # (B, max n) in input order
        if valid is not None:
            first &= valid
        # compact the kept symbols to the left, keeping their order
        pos = torch.arange(width)
        keep = torch.sort(torch.where(first, pos, pos + width), dim=1).indices
        symbol0 = self.token_id("0")
        answer = x.gather(1, keep) + symbol0
        question = end_with(x + symbol0, n, self.token_id("="))
        batch = make_batch(question, n + 1, answer, first.sum(1), lengths=n, n_steps=n.clone())
        if self.coupled:
            self.couple(batch, keep)
        return batch

    @staticmethod
    def couple(batch: Batch, keep: Tensor) -> None:
        """Coupled IDs from `keep` (B, W): the input position of each answer symbol."""
        q, a = batch.question_len[:, None], batch.scored.sum(1, keepdim=True) - 1  # a: answer symbols
        j = torch.arange(batch.inputs.shape[1])[None, :]
        source = torch.cat([keep, keep[:, :1]], 1)  # one spare column: the EOS's (its ID is 0 anyway)
        copied = 2 + source.gather(1, (j - q).clamp(0, source.shape[1] - 1))  # ID of the answer symbol at j
        ids = torch.where(j < q - 1, 2 + j, torch.where(j == q - 1, 1, copied))
        batch.position_ids = ids.masked_fill(j >= batch.widths[:, None], 0)
        following = 2 + source.gather(1, (j - q + 1).clamp(0, source.shape[1] - 1))  # the next answer symbol's
        batch.target_ids = torch.where(j - q + 1 >= a, 0, following).masked_fill(~batch.scored, IGNORE)
