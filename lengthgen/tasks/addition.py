"""Addition of two n-bit binary numbers, most significant bit first.

    question "101+011="  ->  answer "1000"   (5 + 3 = 8, written with n + 1 bits)

Both operands have exactly n bits (leading zeros allowed, each uniform in
[0, 2^n)); the answer is the (n + 1)-bit sum, zero-padded, MSB first.

`index_hints = true` writes Zhou et al.'s index hints (lengthgen/tasks/hints.py): each bit of a, b
and the sum is preceded by a letter naming its significance, the same letter in the three numbers,
from a first letter drawn per sample ("c1b0a1+c0b1a1=" -> "d1c0b0a0" for the example, offset 0);
52 letters, so lengths up to 51.

T(n) = n looped steps. This follows the authors' released code; the paper's
Proposition 3.4 says n + 1 steps instead.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Batch, make_batch, reverse_prefix
from .decimal_addition import check_flag
from .hints import HINTS, Hinted, check_hinted, draw_offsets, with_hints


def add_bits(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Binary sum of two (B, W) 0/1 bit tensors, least significant bit first.

    Returns (sum bits (B, W), carry out (B,)). Carry-lookahead without a loop:
    the carry out of bit i is the 'generate' bit of the last position j <= i
    that does not propagate (x_j == y_j), or 0 if every bit up to i propagates.
    """
    generate = x & y
    propagate = x ^ y
    pos = torch.arange(x.shape[1], device=x.device).expand_as(x)
    last = torch.where(propagate == 0, pos, -1).cummax(dim=1).values  # (B, W)
    carry_out = generate.gather(1, last.clamp(min=0)) * (last >= 0)  # carry out of bit i
    carry_in = torch.nn.functional.pad(carry_out[:, :-1], (1, 0))
    return propagate ^ carry_in, carry_out[:, -1]


class Addition(Hinted):
    name = "addition"
    tokens = ("0", "1", "+", "=")
    answer_symbols = 2
    eos = False  # the question fixes the answer length
    example = "101+011= -> 1000"

    def __init__(self, *, index_hints: bool = False):
        check_flag(self.name, "index_hints", index_hints)
        self.index_hints = index_hints
        if index_hints:
            self.tokens = Addition.tokens + HINTS

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, width = self.lengths_of(batch_size, length)
        if self.index_hints:
            check_hinted(self.name, n)
        a, b = torch.randint(0, 2, (2, batch_size, width), generator=generator)  # MSB first, n[b] bits
        if isinstance(length, Tensor):  # LSB first, zero beyond n[b]
            a_lsb, b_lsb = reverse_prefix(a, n), reverse_prefix(b, n)
        else:
            a_lsb, b_lsb = a.flip(1), b.flip(1)
        total, carry = add_bits(a_lsb, b_lsb)  # no carry leaves bit n[b] when n[b] < width
        total = torch.cat([total, carry[:, None]], dim=1)  # (B, width + 1): n[b] + 1 bits
        answer = reverse_prefix(total, n + 1) if isinstance(length, Tensor) else total.flip(1)
        # question: a, '+', b, '=' -- laid out per sample by one gather from this row
        zero = self.token_id("0")
        plus = torch.full((batch_size, 1), self.token_id("+"))
        equals = torch.full((batch_size, 1), self.token_id("="))
        question = torch.cat([a + zero, plus, b + zero, equals], dim=1)  # (B, 2 width + 2)
        if isinstance(length, Tensor):
            j = torch.arange(2 * width + 2)[None, :]
            m = n[:, None]
            source = torch.where(j < m, j, j - m + width)  # a, then '+' and b
            source = torch.where(j == 2 * m + 1, 2 * width + 1, source)  # '='
            question = question.gather(1, source.clamp(max=2 * width + 1))
        question_len, answer, answer_len = 2 * n + 2, answer + zero, n + 1
        if self.index_hints:
            question, question_len, answer, answer_len = self.hinted(question, answer, n, generator)
        return make_batch(question, question_len, answer, answer_len, lengths=n, n_steps=n.clone(), eos=self.eos)

    def hinted(self, question: Tensor, answer: Tensor, n: Tensor, generator: torch.Generator):
        """Question and answer (MSB first) with each bit after the hint of its significance."""
        m, hint = n[:, None], self.token_id(HINTS[0]) + draw_offsets(n, generator)
        j = torch.arange(question.shape[1])[None, :]
        significance = torch.where(j < m, m - 1 - j, 2 * m - j).masked_fill((j == m) | (j == 2 * m + 1), -1)
        question, question_len = with_hints(question, 2 * n + 2, significance, hint)
        k = torch.arange(answer.shape[1])[None, :]
        answer, answer_len = with_hints(answer, n + 1, (m - k).expand_as(answer), hint)
        return question, question_len, answer, answer_len
