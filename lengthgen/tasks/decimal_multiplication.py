"""Decimal N x M Multiplication in Cho et al.'s format (NeurIPS 2024), with optional coupling.

    question "0312*47="  ->  answer "466410"   (312 x 47 = 14664, n + M digits, units first)

a has n digits and b has M (option `b_digits`, default 2: Cho et al.'s N x 2), both
zero-padded (each uniform over 0..10^digits - 1); the product has n + M digits, least
significant first.

`coupled = true` gives coupled position IDs as in decimal_addition: the digits of
significance i in a, b and the product take START + 1 + i, "*" and "=" take START (1),
padding 0; `target_ids` hold each scored position's next ID (Predictive Position Coupling).
Cho et al.'s code numbers N x M the other way round, the mirror image: the operators take
the largest ID and IDs fall with significance. The coupling, tokens of equal
significance sharing one ID, is the same, and so are the ID differences up to sign.

`leading_zero = false` is Cho et al.'s data law: a has exactly n digits, its leading one
nonzero (1-digit a uniform over 0..9); b keeps its M digits zero-padded. `bos` and
`eos` frame the sequence as in decimal_addition.

T(n) = n looped steps.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import EOS, IGNORE, Batch, Task, make_batch, prefix_mask
from .decimal_addition import START, check_flag, exact_digits


MAX_B_DIGITS = 1000


class DecimalMultiplication(Task):
    name = "decimal_multiplication"
    tokens = tuple("0123456789") + ("*", "=")
    answer_symbols = 10
    eos = False  # the question fixes the answer length: n + M digits (option eos = true: a scored EOS)
    example = "0312*47= -> 466410"

    def __init__(self, *, b_digits: int = 2, coupled: bool = False, leading_zero: bool = True,
                 bos: bool = False, eos: bool = False):
        # b is the short factor (N x 2 in the grids): past 1,000 digits a batch's schoolbook products take
        # seconds (1.2 s for 256 samples at 10,000, measured) and validation would seem to hang
        if not isinstance(b_digits, int) or isinstance(b_digits, bool) or not 1 <= b_digits <= MAX_B_DIGITS:
            raise ValueError(f"decimal_multiplication: b_digits must be an integer in [1, {MAX_B_DIGITS:,}], "
                             f"got {b_digits!r}")
        for flag, value in (("coupled", coupled), ("leading_zero", leading_zero), ("bos", bos), ("eos", eos)):
            check_flag(self.name, flag, value)
        self.m, self.coupled, self.leading_zero, self.bos, self.eos = b_digits, coupled, leading_zero, bos, eos

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, width = self.lengths_of(batch_size, length)
        m = self.m
        a = torch.randint(0, 10, (batch_size, width), generator=generator) * prefix_mask(n, width)  # units first
        if not self.leading_zero:
            a = exact_digits(a, n, generator)
        b = torch.randint(0, 10, (batch_size, m), generator=generator)
        # schoolbook: column i of the product sums a[i - j] * b[j], then the carries run up
        columns = torch.zeros(batch_size, width + m, dtype=torch.long)
        for j in range(m):
            columns[:, j:j + width] += a * b[:, j:j + 1]
        product = torch.zeros_like(columns)
        carry = torch.zeros(batch_size, dtype=torch.long)
        for i in range(width + m):
            total = columns[:, i] + carry
            product[:, i], carry = total % 10, total // 10
        digit = self.token_id("0")
        # question row b: a's n digits most significant first, "*", b's M digits, "="
        j = torch.arange(width + m + 2)[None, :]
        times, equals = n[:, None], n[:, None] + m + 1
        from_a = a.gather(1, (times - 1 - j).clamp(0, width - 1))
        from_b = b.gather(1, (equals - 1 - j).clamp(0, m - 1))
        question = torch.where(j < times, from_a, from_b) + digit
        question = torch.where(j == times, self.token_id("*"), torch.where(j == equals, self.token_id("="), question))
        batch = make_batch(question, n + m + 2, product + digit, n + m, lengths=n, n_steps=n.clone(),
                           eos=self.eos, bos=self.bos)
        if self.coupled:
            self.couple(batch, int(self.bos))
        return batch

    @staticmethod
    def couple(batch: Batch, bos: int = 0) -> None:
        """IDs as decimal_addition's: a BOS (the first `bos` columns) and padding 0, an EOS target 0."""
        n, q = batch.lengths[:, None], batch.question_len[:, None] - bos
        j = torch.arange(batch.inputs.shape[1])[None, :] - bos  # columns counted from after the BOS
        significance = torch.where(j < n, n - 1 - j, torch.where(j < q - 1, q - 2 - j, j - q))
        ids = torch.where((j == n) | (j == q - 1), START, START + 1 + significance)
        batch.position_ids = ids.masked_fill((j < 0) | (j + bos >= batch.widths[:, None]), 0)
        targets = (START + 2 + j - q).masked_fill(batch.targets == EOS, 0)
        batch.target_ids = targets.masked_fill(~batch.scored, IGNORE)
