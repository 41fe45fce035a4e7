"""Induct: associative recall, what followed the query symbol (the TRA paper's induct task).

    question "cadbe?d="  ->  answer "b"

The question is a string of n + 1 symbols over `symbols` letters (option,
default 16), then "?", a query symbol and "=". The query is the symbol at a
position p uniform over 0..n-1, and it occurs nowhere else in the string (every
other symbol is drawn uniformly from the remaining `symbols - 1`), so the answer,
the symbol after it, is unique: an induction head finds the query's earlier
occurrence and copies its successor. The TRA paper's exact format is not public:
this one is the project's (docs/tasks.md).

T(n) = n looped steps.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Batch, Task, end_with, make_batch, uniform_below
from .copy_symbols import letters


def put(tokens: Tensor, at: Tensor, values: Tensor) -> Tensor:
    """(B, W + 1): row b of tokens (B, W) with values[b] written at column at[b]."""
    out = torch.nn.functional.pad(tokens, (0, 1))
    return out.scatter_(1, at[:, None], values[:, None])


class Induct(Task):
    name = "induct"
    tokens = letters(16, name) + ("?", "=")  # the default; __init__ sets its own
    answer_symbols = 15  # the answer is never the query symbol
    eos = False
    example = "cadbe?d= -> b"

    def __init__(self, *, symbols: int = 16):
        if isinstance(symbols, int) and not isinstance(symbols, bool) and symbols < 2:
            raise ValueError(f"induct: symbols must be >= 2 (the answer differs from the query), got {symbols}")
        self.tokens = letters(symbols, self.name) + ("?", "=")
        self.answer_symbols = symbols - 1

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, width = self.lengths_of(batch_size, length)
        S, a = self.answer_symbols + 1, self.token_id("a")
        query = torch.randint(0, S, (batch_size,), generator=generator)  # (B,)
        at = uniform_below(n, generator)  # (B,) the query's position, uniform over 0..n-1
        others = torch.randint(0, S - 1, (batch_size, width + 1), generator=generator)
        others = others + (others >= query[:, None]).long()  # every symbol but the query, uniformly
        column = torch.arange(width + 1)[None, :]
        string = torch.where(column == at[:, None], query[:, None], others) + a  # (B, width + 1)
        question = end_with(put(put(string, n + 1, torch.full_like(n, self.token_id("?"))), n + 2, query + a),
                            n + 3, self.token_id("="))
        answer = string.gather(1, (at + 1)[:, None])  # (B, 1): the symbol after the query's occurrence
        return make_batch(question, n + 4, answer, torch.ones_like(n), lengths=n, n_steps=n.clone(), eos=self.eos)
