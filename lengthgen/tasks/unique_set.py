"""Unique Set: the distinct symbols of the input, in order of first appearance.

    question "3 17 3 9 ="  ->  answer "3 17 9"

The question is n symbols drawn uniformly from `symbols` values (default 50,
tokens "0", "1", ...), then "=". Tokens are separated by spaces in text.
Answer lengths differ between samples of the same n.

T(n) = n looped steps (one per input symbol).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Batch, Task, assemble, end_with, prefix_mask


class UniqueSet(Task):
    name = "unique_set"
    sep = " "
    tokens = tuple(str(s) for s in range(50)) + ("=",)  # the default; __init__ sets its own
    answer_symbols = 50
    example = "3 17 3 9 = -> 3 17 9"

    def __init__(self, *, symbols: int = 50):
        if not isinstance(symbols, int) or isinstance(symbols, bool) or symbols < 1:
            raise ValueError(f"unique_set: symbols must be an integer >= 1, got {symbols!r}")
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
        return assemble(question, n + 1, answer, first.sum(1), lengths=n, n_steps=n.clone())
