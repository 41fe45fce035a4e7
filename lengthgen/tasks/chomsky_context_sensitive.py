"""The context-sensitive tasks of the Chomsky-hierarchy suite (Delétang et al., ICLR 2023), as the
authors' released generators (tasks/cs/) define them.

    duplicate_string          "101="       ->  "101101"
    missing_duplicate_string  "1011?1.="   ->  "0"      (w w with one bit hidden by ?, . pads odd n)
    odds_first                "01101="     ->  "10011"  (0-based odd indices first, as the code does)
    binary_addition           "011+11="    ->  "1001#00" (little-endian, "+" counted in n; # ends the sum,
                                                         0s pad it to n + 1; scored up to the #)
    binary_multiplication     "011*11="    ->  "01001#" ("*" for the authors' token 2; n tokens)
    compute_sqrt              "100101="    ->  "110"    (floor sqrt, big-endian, ceil(n/2) bits)
    bucket_sort               "10204="     ->  "00124"  (`vocab_size` 5, the paper's)

T(n) = n (lengthgen.tasks.chomsky_common).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .addition import add_bits
from .base import Batch, prefix_mask, reverse_prefix, uniform_below
from .chomsky_common import END, ChomskyTask, Symbols, bit_length, isqrt_bits, multiply_bits, nonzero_bits, uniform_in


class DuplicateString(Symbols):
    """The n symbols twice: "101=" -> "101101"."""
    name = "duplicate_string"
    tokens = ("0", "1", "=")
    example = "101= -> 101101"

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, x = self.draw(batch_size, length, generator)
        j = torch.arange(2 * x.shape[1])[None, :]
        return self.finish(self.ids(x), n, self.ids(x.gather(1, j % n[:, None])), 2 * n, n)


class OddsFirst(Symbols):
    """The symbols at 0-based odd positions, then those at even ones: "01101=" -> "10011"."""
    name = "odds_first"
    tokens = ("0", "1", "=")
    example = "01101= -> 10011"

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, x = self.draw(batch_size, length, generator)
        j, half = torch.arange(x.shape[1])[None, :], (n // 2)[:, None]
        source = torch.where(j < half, 2 * j + 1, 2 * (j - half))
        return self.finish(self.ids(x), n, self.ids(x.gather(1, source.clamp(max=x.shape[1] - 1))), n.clone(), n)


class BucketSort(Symbols):
    """The n symbols sorted: "10204=" -> "00124"."""
    name = "bucket_sort"
    tokens = ("0", "1", "2", "3", "4", "=")
    answer_symbols = 5
    default_vocab = 5
    example = "10204= -> 00124"

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, x = self.draw(batch_size, length, generator)
        ordered = x.masked_fill(~prefix_mask(n, x.shape[1]), self.symbols).sort(1).values
        return self.finish(self.ids(x), n, self.ids(ordered.clamp(max=self.symbols - 1)), n.clone(), n)


class MissingDuplicateString(ChomskyTask):
    """w w (w: n // 2 uniform bits) with one uniform position replaced by ?, then . if n is odd:
    the hidden bit. "1011?1.=" -> "0". n = 1: "1" -> "1" (the authors' dummy sample)."""
    name = "missing_duplicate_string"
    tokens = ("0", "1", "?", ".", "=")  # the authors' ids 0-3
    example = "1011?1.= -> 0"

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, width = self.lengths_of(batch_size, length)
        half = (n // 2).clamp(min=1)[:, None]
        bits = torch.randint(0, 2, (batch_size, max(width // 2, 1)), generator=generator)
        hole = uniform_below(2 * half[:, 0], generator)[:, None]
        j = torch.arange(width)[None, :]
        x = bits.gather(1, (j % half).clamp(max=bits.shape[1] - 1))
        x = torch.where(j == hole, 2, torch.where(j >= 2 * half, 3, x))  # the pad, where n is odd
        answer = bits.gather(1, hole % half)
        one = (n == 1)[:, None]
        x, answer = torch.where(one, 1, x), answer.masked_fill(one, 1)
        return self.finish(self.ids(x), n, self.ids(answer), torch.ones_like(n), n)


def operands(n: Tensor, width: int, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
    """The authors' binary_* draws: (inputs (B, W) ids 0/1 and 2 for the operator, a, b (B, W) LSB
    first). n >= 3: |a| uniform in 1..n-2, |b| = n - 1 - |a|, each uniform in 1..2^len - 1, written
    little-endian with their leading zeros. n <= 2 (dummies): n bits of a number uniform in
    0..2^n - 2, no operator, b = 0."""
    la = torch.where(n >= 3, uniform_in(1, (n - 2).clamp(min=1), generator), 0)
    a = nonzero_bits(la, width, generator)
    b = nonzero_bits(torch.where(n >= 3, n - 1 - la, 0), width, generator)
    dummy = uniform_below(2 ** n.clamp(max=2) - 1, generator)  # n = 1: 0; n = 2: 0, 1 or 2
    j = torch.arange(width)[None, :]
    small = (n <= 2)[:, None]
    a = torch.where(small, (dummy[:, None] >> j.clamp(max=1)) & 1 & (j < 2), a)
    m = la[:, None]
    x = torch.where(j < m, a, torch.where(j == m, 2, b.gather(1, (j - m - 1).clamp(min=0))))
    return torch.where(small, a, x), a, b


class BinaryAddition(ChomskyTask):
    """a+b little-endian (n tokens with the +): the sum little-endian, #, then 0s to n + 1 tokens.
    "011+11=" -> "1001#00" (6 + 3 = 9). n <= 2: the n bits of a number, answered by the number."""
    name = "binary_addition"
    tokens = ("0", "1", "+", END, "=")  # the authors' input ids 0-2, then their end class
    answer_symbols = 3
    end = END
    example = "011+11= -> 1001#00"

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, width = self.lengths_of(batch_size, length)
        x, a, b = operands(n, width, generator)
        total, carry = add_bits(a, b)
        total = torch.cat([total, carry[:, None]], 1)  # (B, W + 1)
        size = bit_length(total).clamp(min=1)  # zero is written "0"
        return self.finish(self.ids(x), n, self.ended(total, size, n + 1), n + 1, n)

    def ended(self, bits: Tensor, size: Tensor, count: Tensor) -> Tensor:
        """(B, max count) token ids: size[b] bits, the end token, then "0"s."""
        k = torch.arange(int(count.max()))[None, :]
        bits = torch.nn.functional.pad(bits, (0, max(k.shape[1] - bits.shape[1], 0)))[:, :k.shape[1]]
        out = torch.where(k < size[:, None], bits, 0)
        return torch.where(k == size[:, None], self.token_id(END), self.ids(out))


class BinaryMultiplication(BinaryAddition):
    """a*b little-endian (n tokens with the *): the product little-endian, #, then 0s to n tokens.
    "011*11=" -> "01001#" (6 * 3 = 18). n <= 2: answers "#" and "0#" (the authors' dummies)."""
    name = "binary_multiplication"
    tokens = ("0", "1", "*", END, "=")
    example = "011*11= -> 01001#"

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, width = self.lengths_of(batch_size, length)
        x, a, b = operands(n, width, generator)
        product = multiply_bits(a, b).masked_fill((n <= 2)[:, None], 0)
        size = torch.where(n <= 2, n - 1, bit_length(product))
        return self.finish(self.ids(x), n, self.ended(product, size, n), n.clone(), n)


class ComputeSqrt(ChomskyTask):
    """floor(sqrt(N)) of N uniform in 1..2^n - 1, both big-endian, the root in ceil(n/2) bits:
    "100101=" -> "110" (37 -> 6)."""
    name = "compute_sqrt"
    tokens = ("0", "1", "=")
    example = "100101= -> 110"

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, width = self.lengths_of(batch_size, length)
        number = nonzero_bits(n, width, generator)  # LSB first
        root = isqrt_bits(number)
        half = (n + 1) // 2
        return self.finish(self.ids(reverse_prefix(number, n)), n, self.ids(reverse_prefix(root, half)), half, n)
