"""Binary Sum: the number of ones, in binary, least significant bit first.

    question "10111="  ->  answer "001"   (four ones; 4 = 100 in binary, reversed)

The answer has no trailing (most significant) zeros; a count of zero is
written "0", or, with `empty_zero = true` as in the authors' code (whose
`decimal_to_binary(0)` is empty), not at all: the '=' predicts the end of the
answer at once. Answer lengths differ between samples of the same n.

T(n) = n looped steps (one per input bit).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Batch, Task, end_with, make_batch


class BinarySum(Task):
    name = "binary_sum"
    tokens = ("0", "1", "=")
    answer_symbols = 2
    example = "10111= -> 001"

    def __init__(self, *, empty_zero: bool = False):
        if not isinstance(empty_zero, bool):
            raise ValueError(f"binary_sum: empty_zero must be true or false, got {empty_zero!r}")
        self.empty_zero = empty_zero

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, bits = self.random_bits(batch_size, length, generator)  # (B,), (B, max n)
        zero, equals = self.token_id("0"), self.token_id("=")
        question = end_with(bits + zero, n, equals)
        count = bits.sum(1, keepdim=True)  # (B, 1)
        shifted = count >> torch.arange(bits.shape[1].bit_length())  # (B, K): count >> k
        answer = (shifted & 1) + zero  # LSB first
        answer_len = (shifted > 0).sum(1).clamp(min=0 if self.empty_zero else 1)  # bit length; "0" or nothing for zero
        return make_batch(question, n + 1, answer, answer_len, lengths=n, n_steps=n.clone())
