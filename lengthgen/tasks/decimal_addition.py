"""Decimal Addition in Cho et al.'s format (NeurIPS 2024), with optional position coupling.

    question "653+049="  ->  answer "2070"   (653 + 49 = 702, written units first, n + 1 digits)

Both operands have n digits (zero-padded: leading zeros allowed, each operand uniform over
0..10^n - 1); the sum has n + 1 digits, least significant first, so each sum digit
follows the digits it depends on.

`coupled = true` gives the batch coupled position IDs (and `target_ids`, each scored
position's next ID, for Predictive Position Coupling): tokens of one role share an ID.
The digits of significance i in a, b and the sum all take start + 1 + i; "+" and "=" take
the start ID (1); padding takes 0. Training shifts them with the `random_offset`
transform (keep_zero), so every ID up to its max_position is trained; evaluation
starts at 1. Cho et al.'s code numbers the other way (the operators last, significance
decreasing); the coupling, tokens of equal significance sharing one ID, is the same.

`operands = "different"`: one operand has n digits and the other 1..n (uniform, either
one first), as in "653+49="; the sum still has n + 1 digits. Coupling aligns digits of
equal significance wherever they sit, the case Predictive Position Coupling is tested on.

T(n) = n looped steps.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import IGNORE, Batch, Task, assemble, prefix_mask, uniform_below

START = 1  # the operators' ID in evaluation; 0 stays for padding


class DecimalAddition(Task):
    name = "decimal_addition"
    tokens = tuple("0123456789") + ("+", "=")
    answer_symbols = 10
    eos = False  # the question fixes the answer length: n + 1 digits
    example = "653+049= -> 2070"

    def __init__(self, *, coupled: bool = False, operands: str = "equal"):
        if not isinstance(coupled, bool):
            raise ValueError(f"decimal_addition: coupled must be true or false, got {coupled!r}")
        if operands not in ("equal", "different"):
            raise ValueError(f"decimal_addition: operands must be 'equal' or 'different', got {operands!r}")
        self.coupled, self.operands = coupled, operands

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, width = self.lengths_of(batch_size, length)
        a = torch.randint(0, 10, (batch_size, width), generator=generator)  # least significant first
        b = torch.randint(0, 10, (batch_size, width), generator=generator)
        la, lb = n.clone(), n.clone()  # digits of a and of b
        if self.operands == "different":  # one operand has n digits, the other 1..n, either first
            short, a_short = 1 + uniform_below(n, generator), torch.randint(0, 2, n.shape, generator=generator) == 1
            la, lb = torch.where(a_short, short, n), torch.where(a_short, n, short)
        a, b = a * prefix_mask(la, width), b * prefix_mask(lb, width)
        total = torch.zeros(batch_size, width + 1, dtype=torch.long)
        carry = torch.zeros(batch_size, dtype=torch.long)
        for i in range(width):  # a carry chain: one column at a time, every sample at once
            column = a[:, i] + b[:, i] + carry
            total[:, i], carry = column % 10, column // 10
        total[:, width] = carry  # rows with n < width wrote their last carry at column n already
        digit = self.token_id("0")
        # question row b: a's digits most significant first, "+", b's, "="
        j = torch.arange(2 * width + 2)[None, :]
        plus, equals = la[:, None], (la + lb + 1)[:, None]
        significance = torch.where(j < plus, plus - 1 - j, equals - 1 - j)  # of the digit at column j
        from_a = a.gather(1, significance.clamp(0, width - 1))
        from_b = b.gather(1, significance.clamp(0, width - 1))
        question = torch.where(j < plus, from_a, from_b) + digit
        question = torch.where(j == plus, self.token_id("+"), torch.where(j == equals, self.token_id("="), question))
        batch = assemble(question, la + lb + 2, total + digit, n + 1, lengths=n, n_steps=n.clone(), eos=self.eos)
        if self.coupled:
            batch.position_ids = self.coupled_ids(batch, la)
            # scored column j predicts the sum digit of significance j - (q - 1): ID START + 2 + j - q
            j = torch.arange(batch.inputs.shape[1])[None, :]
            batch.target_ids = (START + 2 + j - batch.question_len[:, None]).masked_fill(~batch.scored, IGNORE)
        return batch

    @staticmethod
    def coupled_ids(batch: Batch, la: Tensor) -> Tensor:
        """(B, L): significance i -> START + 1 + i in a, b and the sum; "+" and "=" -> START;
        columns past a sample's inputs -> 0. `la`: the digits of a (B,)."""
        la, q = la[:, None], batch.question_len[:, None]
        j = torch.arange(batch.inputs.shape[1])[None, :]
        significance = torch.where(j < la, la - 1 - j, torch.where(j < q - 1, q - 2 - j, j - q))
        ids = START + 1 + significance
        ids = torch.where((j == la) | (j == q - 1), START, ids)
        return ids.masked_fill(j >= batch.widths[:, None], 0)
