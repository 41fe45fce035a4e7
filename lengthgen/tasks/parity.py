"""Parity: is the number of ones odd?

    question "10110="  ->  answer "1"   (three ones: odd)

T(n) = n looped steps (one per input bit).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Batch, Task, end_with, make_batch


class Parity(Task):
    name = "parity"
    tokens = ("0", "1", "=")
    answer_symbols = 2
    eos = False  # the question fixes the answer length
    example = "10110= -> 1"

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, bits = self.random_bits(batch_size, length, generator)  # (B,), (B, max n)
        zero, equals = self.token_id("0"), self.token_id("=")
        question = end_with(bits + zero, n, equals)
        answer = (bits.sum(1, keepdim=True) % 2) + zero  # (B, 1)
        return make_batch(question, n + 1, answer, torch.ones_like(n), lengths=n, n_steps=n.clone(), eos=self.eos)
