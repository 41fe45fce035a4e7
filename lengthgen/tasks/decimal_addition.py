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
starts at 1. Cho et al.'s code numbers addition the same way (its comment: "least
significant digit has least position ID"); their N x 2 multiplication is numbered as
the mirror image (decimal_multiplication).

`operands = "different"`: one operand has n digits and the other 1..n (uniform, either
one first), as in "653+49="; the sum still has n + 1 digits. Coupling aligns digits of
equal significance wherever they sit, the case Predictive Position Coupling is tested on.

`operands = "independent"`: Cho et al.'s data law. In training (`sample_range` over
low..high) each operand's digit count is drawn on its own, uniform over low..high, its
leading digit nonzero (a 1-digit operand is uniform over 0..9); the shorter one is
zero-padded to the longer, whose digit count is the sample's length n. Over 1..30
digits that makes n 20.5 on average (15.5 with one uniform n) and 31 % of the operand
digits zeros (10 %). At a given length n (evaluation) both operands have exactly n
digits, as Cho et al. test.

`abacus = true` gives the batch Abacus position IDs (McLeish et al., 2024) instead: each
number's digits are counted from its own units digit, 1, 2, ... in a, in b and in the sum, so the
IDs restart at every number; "+", "=", a BOS and padding take 0. Read through a `learned`
table, with the `random_offset` transform (keep_zero) standing in for Abacus's random training
offset. For addition they differ from coupled IDs only in the operators' ID (0, not START) and
in counting from 1; the IDs depend on where each number starts, which the task knows, so they
are the task's, as coupled IDs are.

`index_hints = true` writes Zhou et al.'s index hints (lengthgen/tasks/hints.py): each digit of a,
b and the sum is preceded by a letter naming its significance, the same letter in the three numbers,
from a first letter drawn per sample ("c6b5a3+c0b4a9=" -> "a2b0c7d0" for the example, offset 0);
52 letters, so lengths up to 51. The hints are tokens, not position IDs: refused with `coupled` and
`abacus`.

`bos = true` opens the question with a BOS (the EOS token, as Cho et al.'s tokenizer
does) whose coupled ID is 0, kept at 0 by random_offset's keep_zero, as in their code;
`eos = true` ends the answer with a scored EOS, whose ID (as a next-ID target) is 0 too.

T(n) = n looped steps.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import EOS, IGNORE, Batch, make_batch, prefix_mask, uniform_below
from .hints import HINTS, Hinted, check_hinted, draw_offsets, with_hints

START = 1  # the operators' ID in evaluation; 0 stays for padding
OPERANDS = ("equal", "different", "independent")


def exact_digits(digits: Tensor, count: Tensor, generator: torch.Generator) -> Tensor:
    """digits (B, W), units first, kept in the first count[b] columns and zeroed past them, the
    leading one (column count - 1) redrawn from 1..9 where count > 1: a number of exactly
    count[b] digits, uniform over them."""
    lead = 1 + torch.randint(0, 9, count.shape, generator=generator)
    column = torch.arange(digits.shape[1])[None, :]
    digits = torch.where((column == count[:, None] - 1) & (count[:, None] > 1), lead[:, None], digits)
    return digits * prefix_mask(count, digits.shape[1])


def check_flag(task: str, name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{task}: {name} must be true or false, got {value!r}")


class DecimalAddition(Hinted):
    name = "decimal_addition"
    tokens = tuple("0123456789") + ("+", "=")
    answer_symbols = 10
    eos = False  # the question fixes the answer length: n + 1 digits (option eos = true: a scored EOS)
    example = "653+049= -> 2070"

    def __init__(self, *, coupled: bool = False, operands: str = "equal", bos: bool = False, eos: bool = False,
                 abacus: bool = False, index_hints: bool = False):
        for flag, value in (("coupled", coupled), ("bos", bos), ("eos", eos), ("abacus", abacus),
                            ("index_hints", index_hints)):
            check_flag(self.name, flag, value)
        if coupled and abacus:
            raise ValueError("decimal_addition: coupled and abacus are two layouts of position IDs; choose one")
        if index_hints and (coupled or abacus):  # their IDs count the columns of the plain layout
            raise ValueError("decimal_addition: index_hints marks digits with tokens, coupled and abacus with "
                             "position IDs; choose one")
        if operands not in OPERANDS:
            raise ValueError(f"decimal_addition: operands must be one of {', '.join(OPERANDS)}, got {operands!r}")
        self.coupled, self.operands, self.bos, self.eos, self.abacus = coupled, operands, bos, eos, abacus
        self.index_hints = index_hints
        if index_hints:
            self.tokens = DecimalAddition.tokens + HINTS

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, width = self.lengths_of(batch_size, length)
        if self.index_hints:
            check_hinted(self.name, n)
        if self.operands == "independent":  # at a given length: both operands of exactly n digits
            return self.build(n, n, n, generator)
        a = torch.randint(0, 10, (batch_size, width), generator=generator)  # least significant first
        b = torch.randint(0, 10, (batch_size, width), generator=generator)
        la, lb = n.clone(), n.clone()  # digits of a and of b
        if self.operands == "different":  # one operand has n digits, the other 1..n, either first
            short, a_short = 1 + uniform_below(n, generator), torch.randint(0, 2, n.shape, generator=generator) == 1
            la, lb = torch.where(a_short, short, n), torch.where(a_short, n, short)
        return self.lay_out(a * prefix_mask(la, width), b * prefix_mask(lb, width), la, lb, n, generator)

    @property
    def draws_own_lengths(self) -> bool:
        return self.operands == "independent"

    def sample_range(self, batch_size: int, low: int, high: int, generator: torch.Generator) -> Batch:
        if self.operands != "independent":
            return super().sample_range(batch_size, low, high, generator)
        counts = torch.randint(low, high + 1, (2, batch_size), generator=generator)  # each operand's own
        if self.index_hints:
            check_hinted(self.name, counts.amax(0))
        return self.build(counts.amax(0), counts[0], counts[1], generator)

    def build(self, n: Tensor, da: Tensor, db: Tensor, generator: torch.Generator) -> Batch:
        """Operands of exactly da and db digits, both written with n = max(da, db) (zero-padded)."""
        width = int(n.max())
        a = exact_digits(torch.randint(0, 10, (len(n), width), generator=generator), da, generator)
        b = exact_digits(torch.randint(0, 10, (len(n), width), generator=generator), db, generator)
        return self.lay_out(a, b, n.clone(), n.clone(), n, generator)

    def lay_out(self, a: Tensor, b: Tensor, la: Tensor, lb: Tensor, n: Tensor, generator: torch.Generator) -> Batch:
        """The batch of a + b: a (B, W) and b, units first, shown with la and lb digits (the
        generator draws the index hints' offsets, after every other draw)."""
        batch_size, width = a.shape
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
        question_len, answer, answer_len = la + lb + 2, total + digit, n + 1
        if self.index_hints:  # the operators have no significance; the sum is written units first
            hint = self.token_id(HINTS[0]) + draw_offsets(n, generator)
            question, question_len = with_hints(question, question_len, significance.masked_fill(
                (j == plus) | (j == equals), -1), hint)
            answer, answer_len = with_hints(answer, answer_len, torch.arange(width + 1).expand_as(answer), hint)
        batch = make_batch(question, question_len, answer, answer_len, lengths=n, n_steps=n.clone(),
                           eos=self.eos, bos=self.bos)
        if self.coupled:
            batch.position_ids = self.coupled_ids(batch, la, int(self.bos))
            # scored column j predicts the sum digit of significance j - (q - 1): ID START + 2 + j - q;
            # an EOS target takes 0, as Cho et al.'s EOS does
            j = torch.arange(batch.inputs.shape[1])[None, :]
            ids = (START + 2 + j - batch.question_len[:, None]).masked_fill(batch.targets == EOS, 0)
            batch.target_ids = ids.masked_fill(~batch.scored, IGNORE)
        if self.abacus:  # each number's digits from its units digit: the coupled IDs, operators at 0
            ids = self.coupled_ids(batch, la, int(self.bos))
            batch.position_ids = torch.where(ids > START, ids - START, 0)
        return batch

    @staticmethod
    def coupled_ids(batch: Batch, la: Tensor, bos: int = 0) -> Tensor:
        """(B, L): significance i -> START + 1 + i in a, b and the sum; "+" and "=" -> START;
        a BOS (the first `bos` columns) and columns past a sample's inputs -> 0. `la`: the digits of a (B,)."""
        la, q = la[:, None], batch.question_len[:, None] - bos
        j = torch.arange(batch.inputs.shape[1])[None, :] - bos  # columns counted from after the BOS
        significance = torch.where(j < la, la - 1 - j, torch.where(j < q - 1, q - 2 - j, j - q))
        ids = START + 1 + significance
        ids = torch.where((j == la) | (j == q - 1), START, ids)
        return ids.masked_fill((j < 0) | (j + bos >= batch.widths[:, None]), 0)
