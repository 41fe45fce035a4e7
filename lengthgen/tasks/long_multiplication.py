"""N x M multiplication written as long multiplication: Cho et al.'s scratchpad (ICLR 2025).

    question "[BOS]653*49="  ->  answer "7785+2162=77850>79913[EOS]"   (653 * 49 = 31997)

A (n digits, the task's length) and B (`multiplier` digits), most significant first, unpadded. The
answer first lists the partial products P_j = A * b_j, b_j B's digit of significance j, each in
n + 1 digits, units first, joined by "+"; after "=" the running sums C_k = P_0 + 10 P_1 + ... +
10^(k-1) P_(k-1), k = 1..M, each in n + M digits, units first, joined by ">"; C_M is the product.
Every next digit depends on a fixed number of earlier tokens: a digit of A, one of B and a carry in a
partial product; a digit of C_(k-1), one of P_(k-1) and a carry in a running sum. A scored EOS closes the
answer (`eos`, default true) and `bos = true` opens the question with a BOS, as Cho et al.'s config does.

`multiplier`: B's digit count, an int or [low, high] drawn uniformly per sample (default [1, 4], Cho
et al.'s config; evaluation sweeps it with eval.sweep.multiplier). A count > 1 has a nonzero leading
digit; A has exactly n digits, n uniform over the training range per sample.

`coupled = true` gives the batch three levels of coupled IDs (lengthgen.tasks.coupled_levels), as
Cho et al.'s MultiplicationScratchPadDatasetWithCoupledPositions lays them out: level 0 numbers A's
and the partial products' digits by significance (2 + i; their separators 1); level 1 numbers B's
digit of significance j and the partial product and running sum it makes (1 + j); level 2 numbers the
partial products' digits by their significance in the product (2 + j + i) and the running sums'
digits by theirs (2 + i), separators 1 + j and 1. A token outside a level takes 0 there, as do BOS,
EOS and padding. Training shifts each level by its own start (`random_offset` with `levels = 3`).

T(n) = n looped steps.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Batch, Task, make_batch
from .coupled_levels import laid_out
from .decimal_addition import check_flag
from .multi_operand_addition import count_range, normalised, operand_digits


class LongMultiplication(Task):
    name = "long_multiplication"
    tokens = tuple("0123456789") + ("*", "+", ">", "=")
    answer_symbols = 10
    example = "653*49= -> 7785+2162=77850>79913"

    def __init__(self, *, multiplier: int | list | None = None, coupled: bool = False, bos: bool = False,
                 eos: bool = True):
        for flag, value in (("coupled", coupled), ("bos", bos), ("eos", eos)):
            check_flag(self.name, flag, value)
        self.multiplier = count_range(self.name, "multiplier", [1, 4] if multiplier is None else multiplier, 1)
        self.coupled, self.bos, self.eos = coupled, bos, eos

    @property
    def id_levels(self) -> int:
        return 3 if self.coupled else 1

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, width = self.lengths_of(batch_size, length)
        low, high = self.multiplier
        d = torch.randint(low, high + 1, (batch_size,), generator=generator)
        a = operand_digits(n[:, None], width, generator)[:, 0]  # (B, width) units first
        b = operand_digits(d[:, None], int(d.max()), generator)[:, 0]
        partial = normalised(torch.nn.functional.pad(a[:, None, :] * b[:, :, None], (0, 1)))  # (B, D, W + 1)
        D, span = b.shape[1], width + b.shape[1]
        shifted = torch.stack([torch.nn.functional.pad(partial[:, j], (j, span - width - 1 - j)) for j in range(D)], 1)
        running = normalised(shifted.cumsum(1))  # (B, D, W + D): C_1..C_D
        question, q_ids = self.question(a, b, n, d)
        answer, a_ids = self.answer(partial, running, n, d)
        answer_len = d * (n + 2) + d * (n + d + 1) - 1
        batch = make_batch(question, n + d + 2, answer, answer_len, lengths=n, n_steps=n.clone(),
                           eos=self.eos, bos=self.bos)
        if self.coupled:
            batch.position_ids = laid_out(batch.question_len, batch.widths, q_ids, a_ids, self.bos)
        return batch

    def question(self, a: Tensor, b: Tensor, n: Tensor, d: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Tokens (B, Q) of "A*B=", most significant first, and their IDs per level."""
        c = torch.arange(a.shape[1] + b.shape[1] + 2)[None, :]
        n, d = n[:, None], d[:, None]
        in_a, in_b, star, equals = c < n, (c > n) & (c <= n + d), c == n, c == n + d + 1
        sig_a, sig_b = (n - 1 - c).clamp(min=0), (n + d - c).clamp(min=0)
        value = torch.where(in_a, a.gather(1, sig_a.clamp(max=a.shape[1] - 1)),
                            b.gather(1, sig_b.clamp(max=b.shape[1] - 1)))
        digits = value + self.token_id("0")
        tokens = torch.where(star, self.token_id("*"), torch.where(equals, self.token_id("="), digits))
        zero = torch.zeros_like(tokens)
        level0 = torch.where(in_a, 2 + sig_a, torch.where(equals, 1, zero))
        level1 = torch.where(in_b, 1 + sig_b, torch.where(equals, 1, zero))
        level2 = torch.where(equals, 1, zero)
        return tokens, [level0, level1, level2]

    def answer(self, partial: Tensor, running: Tensor, n: Tensor, d: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Tokens (B, A) of "P_0+...+P_(M-1)=C_1>...>C_M", units first, and their IDs per level."""
        B, D, wide = running.shape
        t = torch.arange(D * (partial.shape[2] + 1) + D * (wide + 1))[None, :]
        n, d = n[:, None], d[:, None]
        in_p = t < d * (n + 2)
        j, r = t // (n + 2), t % (n + 2)  # partial product j, column r (r = n + 1: the separator after it)
        u = (t - d * (n + 2)).clamp(min=0)
        k, s = u // (n + d + 1), u % (n + d + 1)  # running sum C_(k+1), column s (s = n + d: ">")
        p_wide = partial.shape[2]  # n + 1 digits at the widest row
        p_value = partial.reshape(B, -1).gather(1, j.clamp(max=D - 1) * p_wide + r.clamp(max=p_wide - 1))
        c_value = running.reshape(B, -1).gather(1, k.clamp(max=D - 1) * wide + s.clamp(max=wide - 1))
        p_digit, c_digit = in_p & (r <= n), ~in_p & (s < n + d)
        last = j == d - 1
        sep = torch.where(in_p, torch.where(last, self.token_id("="), self.token_id("+")), self.token_id(">"))
        tokens = torch.where(p_digit, p_value + self.token_id("0"),
                             torch.where(c_digit, c_value + self.token_id("0"), sep))
        # level 0: significance within A * b_j; the running sums are outside it
        level0 = torch.where(p_digit, 2 + r, torch.where(in_p & ~last, 1, 0))
        # level 1: which digit of B (and the sums it closes); a separator opens the next group
        level1 = torch.where(in_p, torch.where(p_digit, 1 + j, torch.where(last, 1, 2 + j)),
                             torch.where(c_digit, 1 + k, 2 + k))
        # level 2: significance within the product
        level2 = torch.where(in_p, torch.where(p_digit, 2 + j + r, torch.where(last, 1, 2 + j)),
                             torch.where(c_digit, 2 + s, 1))
        return tokens, [level0, level1, level2]
