"""Multi-operand addition in Cho et al.'s format (ICLR 2025), with its scratchpad and multi-level coupling.

    question "[BOS]0653+0149+0999="  ->  answer "0000>3560>2080>1081[EOS]"   (653 + 149 + 999 = 1801)

m operands of n digits each (the task's length), each zero-padded to W digits, W the digit count of
m * (10^n - 1) so that every partial sum fits; most significant digit first, joined by "+". The
scratchpad (`scratchpad = true`, the default) writes the cumulative sums s_0 = 0, s_1 = a_1, ...,
s_m = a_1 + ... + a_m, each in W digits, units first, joined by ">": every next digit depends on a
fixed number of earlier tokens (the digit of s_k and of a_(k+1) of equal significance, and the carry),
however many operands there are. `scratchpad = false` writes only the sum s_m (Cho et al. 2024's
multi-operand format). A scored EOS closes the answer (`eos`, default true) and `bos = true` opens the
question with a BOS (the EOS token, as Cho et al.'s bos_to_eos does); their configs use both.

`operands`: how many operands, an int, or [low, high] drawn uniformly per sample (default [2, 5], Cho
et al.'s config; evaluation sweeps it with eval.sweep.operands). In training (`sample_range` over low..high), Cho et
al.'s `partially_uniform` law: with probability 1/2 each operand's digit count is drawn on its own,
uniform over low..high, else one count for all; a count > 1 has a nonzero leading digit; n is the
largest count. At a given length n (evaluation) every operand has exactly n digits (their test sets
draw each count uniformly over a range; one length per row keeps lengthgen's curves).

`coupled`: how many levels of coupled position IDs the batch carries (lengthgen.tasks.coupled_levels):
0 none; 1 the digit's significance i -> 2 + i in every number, "+", "=" and ">" -> 1 (Cho et al.
2024); 2 also the operand or scratchpad step: operand k's digits and the "+" after it -> 1 + k, the
"=" and s_0 -> 1, the ">" before s_k and s_k's digits -> 1 + k (Cho et al. 2025, needs the
scratchpad). BOS, EOS and padding take 0 in every level. Training shifts each level by its own
random start (`random_offset` with `levels`), evaluation starts every level at 1, as their code does
(HanseulJo/position-coupling, MultipleAdditionScratchPadDatasetWithCoupledPositions).

T(n) = n looped steps.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Batch, Task, make_batch
from .coupled_levels import laid_out
from .decimal_addition import check_flag


def count_range(task: str, name: str, value, least: int) -> tuple[int, int]:
    """(low, high) from an int or a [low, high] pair of ints >= least; ValueError naming the option."""
    pair = [value, value] if isinstance(value, int) and not isinstance(value, bool) else value
    if (not isinstance(pair, (list, tuple)) or len(pair) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair)
            or not least <= pair[0] <= pair[1]):
        raise ValueError(f"{task}: {name} must be an integer >= {least} or [low, high] with {least} <= low <= high, "
                         f"got {value!r}")
    return pair[0], pair[1]


def padded_width(operands: Tensor, n: Tensor) -> Tensor:
    """(B,) digits of operands * (10^n - 1): the width that holds every partial sum."""
    return torch.tensor([len(str(m * (10 ** d - 1))) for m, d in zip(operands.tolist(), n.tolist())])


def operand_digits(counts: Tensor, width: int, generator: torch.Generator) -> Tensor:
    """(B, M, width) digits, units first, of numbers of exactly counts[b, k] digits (0: none): the
    leading one nonzero where count > 1, each number uniform over its digit count."""
    digits = torch.randint(0, 10, (*counts.shape, width), generator=generator)
    lead = 1 + torch.randint(0, 9, counts.shape, generator=generator)
    column = torch.arange(width)
    digits = torch.where((column == counts[..., None] - 1) & (counts[..., None] > 1), lead[..., None], digits)
    return digits * (column < counts[..., None])


def normalised(columns: Tensor) -> Tensor:
    """Digits (..., W), units first, of numbers given as column sums (..., W) of any size."""
    digits, carry = torch.empty_like(columns), torch.zeros_like(columns[..., 0])
    for i in range(columns.shape[-1]):
        value = columns[..., i] + carry
        digits[..., i], carry = value % 10, value // 10
    return digits


class MultiOperandAddition(Task):
    name = "multi_operand_addition"
    tokens = tuple("0123456789") + ("+", ">", "=")
    answer_symbols = 10
    example = "0653+0149+0999= -> 0000>3560>2080>1081"

    def __init__(self, *, operands: int | list | None = None, scratchpad: bool = True, coupled: int = 0,
                 bos: bool = False, eos: bool = True):
        for flag, value in (("scratchpad", scratchpad), ("bos", bos), ("eos", eos)):
            check_flag(self.name, flag, value)
        self.operands = count_range(self.name, "operands", [2, 5] if operands is None else operands, 1)
        if coupled not in (0, 1, 2) or isinstance(coupled, bool):
            raise ValueError(f"{self.name}: coupled is the number of coupled ID levels, 0, 1 or 2; got {coupled!r}")
        if coupled == 2 and not scratchpad:
            raise ValueError(f"{self.name}: coupled = 2 couples operands with scratchpad steps; "
                             "it needs scratchpad = true")
        self.scratchpad, self.coupled, self.bos, self.eos = scratchpad, coupled, bos, eos

    @property
    def id_levels(self) -> int:
        return max(self.coupled, 1)

    def draw_operands(self, batch_size: int, generator: torch.Generator) -> Tensor:
        low, high = self.operands
        return torch.randint(low, high + 1, (batch_size,), generator=generator)

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, _ = self.lengths_of(batch_size, length)
        m = self.draw_operands(batch_size, generator)
        return self.build(n[:, None].expand(-1, int(m.max())), m, generator)

    @property
    def draws_own_lengths(self) -> bool:
        return True

    def sample_range(self, batch_size: int, low: int, high: int, generator: torch.Generator) -> Batch:
        m = self.draw_operands(batch_size, generator)
        own = torch.randint(low, high + 1, (batch_size, int(m.max())), generator=generator)
        shared = torch.randint(low, high + 1, (batch_size, 1), generator=generator)
        each = torch.rand(batch_size, 1, generator=generator) < 0.5  # partially_uniform, threshold 0.5
        return self.build(torch.where(each, own, shared), m, generator)

    def build(self, counts: Tensor, m: Tensor, generator: torch.Generator) -> Batch:
        """The batch whose sample b adds m[b] operands of counts[b, k] digits (k < m[b])."""
        B, M = counts.shape
        counts = counts.masked_fill(torch.arange(M)[None, :] >= m[:, None], 0)
        n = counts.amax(1)
        W = padded_width(m, n)
        width = int(W.max())
        a = operand_digits(counts, width, generator)  # (B, M, width) units first, 0 past m
        prefix = torch.cat([torch.zeros(B, 1, width, dtype=torch.long), a.cumsum(1)], 1)  # column sums of s_0..s_M
        sums = normalised(prefix)  # (B, M + 1, width): s_k's digits, units first
        question, q_ids = self.question(a, m, W)
        answer, a_ids = self.answer(sums, m, W)
        batch = make_batch(question, m * (W + 1), answer, self.answer_len(m, W),
                           lengths=n, n_steps=n.clone(), eos=self.eos, bos=self.bos)
        if self.coupled:
            c = self.coupled  # the first c levels
            batch.position_ids = laid_out(batch.question_len, batch.widths, q_ids[:c], a_ids[:c], self.bos)
        return batch

    def answer_len(self, m: Tensor, W: Tensor) -> Tensor:
        return (m + 1) * W + m if self.scratchpad else W

    def question(self, a: Tensor, m: Tensor, W: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Tokens (B, Q) of "a_1+...+a_m=", MSD first, and their IDs per level."""
        B, M, width = a.shape
        j = torch.arange(M * (width + 1))[None, :]
        k, r = j // (W[:, None] + 1), j % (W[:, None] + 1)  # block (operand) and column in it
        digit = r < W[:, None]
        significance = (W[:, None] - 1 - r).clamp(min=0)
        value = a.reshape(B, -1).gather(1, (k.clamp(max=M - 1) * width + significance.clamp(max=width - 1)))
        last = k == m[:, None] - 1
        sep = torch.where(last, self.token_id("="), self.token_id("+"))
        tokens = torch.where(digit, value + self.token_id("0"), sep)
        level0 = torch.where(digit, 2 + significance, 1)
        level1 = torch.where(digit | ~last, 1 + k, 1)  # "=" opens s_0's group
        return tokens, [level0, level1]

    def answer(self, sums: Tensor, m: Tensor, W: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Tokens (B, A) of "s_0>s_1>...>s_m" (or "s_m"), units first, and their IDs per level."""
        B, K, width = sums.shape
        t = torch.arange(K * (width + 1) if self.scratchpad else width)[None, :]
        if self.scratchpad:
            k, r = t // (W[:, None] + 1), t % (W[:, None] + 1)
        else:
            k, r = m[:, None].expand(-1, t.shape[1]), t
        digit = r < W[:, None]
        value = sums.reshape(B, -1).gather(1, k.clamp(max=K - 1) * width + r.clamp(max=width - 1))
        tokens = torch.where(digit, value + self.token_id("0"), self.token_id(">"))
        level0 = torch.where(digit, 2 + r, 1)
        level1 = torch.where(digit, 1 + k, 2 + k)  # ">" opens s_(k+1)'s group
        return tokens, [level0, level1]
