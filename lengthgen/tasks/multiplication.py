"""Multiplication of a short number a by an n-bit number b.

    question "11*0101="  ->  answer "111100"   (3 * 5 = 15 = 001111, reversed)

a has 1 or 2 bits (bit-length uniform over min_a_bits..max_a_bits per sample,
bits uniform, leading zeros allowed; the released code tests with a fixed at 2
bits: min_a_bits = 2 in evaluation, e.g. eval.sweep = {min_a_bits = [1, 2]}); b has exactly n bits (uniform, leading zeros
allowed); both are written most significant bit first. The answer is the
product, least significant bit first, zero-padded to len(a) + n bits. Question
and answer lengths therefore differ between samples of the same n.

T(n) = len(a) * n looped steps, per sample.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .addition import add_bits
from .base import MAX_STEPS_PER_LENGTH, Batch, Task, make_batch, reverse_prefix


class Multiplication(Task):
    name = "multiplication"
    tokens = ("0", "1", "*", "=")
    answer_symbols = 2
    eos = False  # the question fixes the answer length
    example = "11*0101= -> 111100"

    def __init__(self, *, max_a_bits: int = 2, min_a_bits: int = 1):
        # T(n) = len(a) x n, and sampling costs len(a) x (len(a) + n): the cap every task's T(n) keeps
        if not isinstance(max_a_bits, int) or isinstance(max_a_bits, bool) \
                or not 1 <= max_a_bits <= MAX_STEPS_PER_LENGTH:
            raise ValueError(f"multiplication: max_a_bits must be an integer in [1, {MAX_STEPS_PER_LENGTH}] "
                             f"(a is a short number; T(n) = len(a) x n), got {max_a_bits!r}")
        if not isinstance(min_a_bits, int) or isinstance(min_a_bits, bool) or not 1 <= min_a_bits <= max_a_bits:
            raise ValueError(f"multiplication: min_a_bits must be an integer in [1, max_a_bits = {max_a_bits}], "
                             f"got {min_a_bits!r}")
        self.max_a_bits, self.min_a_bits = max_a_bits, min_a_bits

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, width = self.lengths_of(batch_size, length)
        m = self.max_a_bits
        a_len = torch.randint(self.min_a_bits, m + 1, (batch_size,), generator=generator)  # (B,)
        a_lsb = torch.randint(0, 2, (batch_size, m), generator=generator)  # a's bits, LSB first
        a_lsb = a_lsb * (torch.arange(m) < a_len[:, None])  # bits beyond len(a) are 0
        b_msb = torch.randint(0, 2, (batch_size, width), generator=generator)  # row b: n[b] bits
        mixed = isinstance(length, Tensor)

        # product, LSB first: sum over the bits k of a of (b << k), width m + max n
        b_lsb = reverse_prefix(b_msb, n) if mixed else b_msb.flip(1)  # zero beyond n[b]
        b_lsb = torch.nn.functional.pad(b_lsb, (0, m))  # (B, width + m)
        product = b_lsb * a_lsb[:, :1]
        for k in range(1, m):  # a handful of shifted additions; no carry leaves width m + n
            product, _ = add_bits(product, b_lsb.roll(k, dims=1) * a_lsb[:, k:k + 1])

        # question: a (MSB first), '*', b, '=' -- laid out per sample by one gather
        zero = self.token_id("0")
        a_msb = a_lsb.gather(1, (a_len[:, None] - 1 - torch.arange(m)).clamp(min=0))
        row = torch.cat([a_msb + zero, torch.full((batch_size, 1), self.token_id("*")),
                         b_msb + zero, torch.full((batch_size, 1), self.token_id("="))], dim=1)
        j = torch.arange(m + width + 2)[None, :]  # target position in the question
        source = torch.where(j < a_len[:, None], j, j - a_len[:, None] + m)  # position in row
        if mixed:  # '=' right after row b's n[b] bits
            source = torch.where(j == (a_len + n + 1)[:, None], m + width + 1, source)
        question = row.gather(1, source.clamp(max=m + width + 1))
        return make_batch(question, a_len + n + 2, product + zero, a_len + n,
                          lengths=n, n_steps=a_len * n, eos=self.eos)
