"""Copy Symbols: repeat a string of symbols (the TRA paper's copy task).

    question "cabba="  ->  answer "cabba"

The question is n symbols drawn uniformly from `symbols` letters (option,
default 16: a..p), then "="; the answer is the same n symbols. The TRA paper's
exact format is not public: this one is the project's (docs/tasks.md). Unlike
`copy` (bits), a wrong symbol here is one of `symbols - 1`.

T(n) = n looped steps (one per symbol).
"""
from __future__ import annotations

import string

import torch
from torch import Tensor

from .base import Batch, Task, end_with, make_batch

LETTERS = string.ascii_lowercase


def letters(symbols: int, task: str) -> tuple[str, ...]:
    """The first `symbols` letters, checked: 1..26 (one character per token)."""
    if not isinstance(symbols, int) or isinstance(symbols, bool) or not 1 <= symbols <= len(LETTERS):
        raise ValueError(f"{task}: symbols must be an integer in 1..{len(LETTERS)}, got {symbols!r}")
    return tuple(LETTERS[:symbols])


class CopySymbols(Task):
    name = "copy_symbols"
    tokens = letters(16, name) + ("=",)  # the default; __init__ sets its own
    answer_symbols = 16
    eos = False  # the question fixes the answer length
    example = "cabba= -> cabba"

    def __init__(self, *, symbols: int = 16):
        self.tokens = letters(symbols, self.name) + ("=",)
        self.answer_symbols = symbols

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, width = self.lengths_of(batch_size, length)
        symbols = torch.randint(0, self.answer_symbols, (batch_size, width), generator=generator)
        tokens = symbols + self.token_id("a")  # row b uses its first n[b]; make_batch reads no further
        return make_batch(end_with(tokens, n, self.token_id("=")), n + 1, tokens, n.clone(),
                          lengths=n, n_steps=n.clone(), eos=self.eos)
