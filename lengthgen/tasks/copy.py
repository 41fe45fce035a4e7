"""Copy: repeat the input bits.

    question "0110="  ->  answer "0110"

T(n) = n looped steps (one per input bit).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Batch, Task, assemble, end_with


class Copy(Task):
    name = "copy"
    tokens = ("0", "1", "=")
    answer_symbols = 2
    eos = False  # the question fixes the answer length
    example = "0110= -> 0110"

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, bits = self.random_bits(batch_size, length, generator)  # (B,), (B, max n)
        zero, equals = self.token_id("0"), self.token_id("=")
        tokens = bits + zero  # row b uses its first n[b] bits; assemble reads no further
        return assemble(end_with(tokens, n, equals), n + 1, tokens, n.clone(),
                        lengths=n, n_steps=n.clone(), eos=self.eos)
