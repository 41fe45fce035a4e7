"""The regular tasks of the Chomsky-hierarchy suite (Delétang et al., ICLR 2023), as the authors'
released generators (google-deepmind/neural_networks_chomsky_hierarchy, tasks/regular/) define
them: each answer is one token (one output slot), read after the n input tokens.

    even_pairs          "001110="     ->  "0"   (one 01 and one 10: even)
    modular_arithmetic  "3*4-2="      ->  "0"   (3*4-2 = 10 = 0 mod 5)
    parity_check        "10110="      ->  "1"   (three ones: odd)
    cycle_navigation    "22012="      ->  "2"   (moves -1/0/+1 for 0/1/2 on a 5-cycle from 0)

Inputs are the authors' ids written as tokens in their order (cycle_navigation's "0 1 2" are the
moves -1, 0, +1; the paper's text relabels them). docs/tasks.md lists where lengthgen differs.

T(n) = n (lengthgen.tasks.chomsky_common).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Batch, prefix_mask
from .chomsky_common import ChomskyTask

DIGITS5 = ("0", "1", "2", "3", "4")
LOG2_MOD5 = torch.tensor([0, 0, 1, 3, 2])  # 2^LOG2_MOD5[d] = d mod 5 for d = 1..4 (2 generates Z5*)
POW2_MOD5 = torch.tensor([1, 2, 4, 3])


class EvenPairs(ChomskyTask):
    """Whether the number of unequal adjacent pairs (01 and 10) is odd: "001110=" -> "0"."""
    name = "even_pairs"
    tokens = ("0", "1", "=")
    example = "001110= -> 0"

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, bits = self.random_bits(batch_size, length, generator)
        pairs = (bits[:, 1:] != bits[:, :-1]) & prefix_mask(n - 1, bits.shape[1] - 1)
        answer = self.ids(pairs.sum(1, keepdim=True) % 2)
        return self.finish(self.ids(bits), n, answer, torch.ones_like(n), n)


class ParityCheck(ChomskyTask):
    """Whether the number of ones is odd: "10110=" -> "1"."""
    name = "parity_check"
    tokens = ("0", "1", "=")
    example = "10110= -> 1"

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, bits = self.random_bits(batch_size, length, generator)
        return self.finish(self.ids(bits), n, self.ids(bits.sum(1, keepdim=True) % 2), torch.ones_like(n), n)


class CycleNavigation(ChomskyTask):
    """The position on a 5-cycle after moves 0 = -1, 1 = stay, 2 = +1 from 0: "22012=" -> "2"."""
    name = "cycle_navigation"
    tokens = DIGITS5 + ("=",)
    answer_symbols = 5
    example = "22012= -> 2"

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, width = self.lengths_of(batch_size, length)
        moves = torch.randint(0, 3, (batch_size, width), generator=generator)
        moves = moves.masked_fill(~prefix_mask(n, width), 1)  # past n[b]: stay
        answer = self.ids((moves - 1).sum(1, keepdim=True) % 5)
        return self.finish(self.ids(moves), n, answer, torch.ones_like(n), n)


class ModularArithmetic(ChomskyTask):
    """An expression over digits 0-4 and + - * (products first), mod 5: "3*4-2=" -> "0". An even
    n draws n - 1 tokens, as the authors' generator does (their paper says n + 1)."""
    name = "modular_arithmetic"
    tokens = DIGITS5 + ("+", "-", "*", "=")  # the authors' ids; their blank '_' (8) is never drawn
    answer_symbols = 5
    example = "3*4-2= -> 0"

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, width = self.lengths_of(batch_size, length)
        size = n - (n % 2 == 0).long()  # odd: digits at even positions, operators between
        terms = (width + 1) // 2
        digits = torch.randint(0, 5, (batch_size, terms), generator=generator)
        ops = torch.randint(0, 3, (batch_size, max(terms - 1, 0)), generator=generator)  # + - *
        x = torch.stack([digits, torch.nn.functional.pad(ops + 5, (0, 1))], 2).flatten(1)[:, :width]
        value = evaluate(digits, ops, (size + 1) // 2)
        return self.finish(self.ids(x), size, self.ids(value[:, None]), torch.ones_like(n), n)


def evaluate(digits: Tensor, ops: Tensor, count: Tensor) -> Tensor:
    """(B,) value mod 5 of d0 o0 d1 o1 ... over the first count[b] digits (ops 0 +, 1 -, 2 *):
    each product's digits multiply as 0 (any zero) or 2^(sum of their discrete logs), signed by
    the + or - before it."""
    batch, terms = digits.shape
    before = torch.nn.functional.pad(ops, (1, 0))  # the operator before each digit (+ before the first)
    starts = before != 2
    term = starts.long().cumsum(1) - 1  # (B, terms) each digit's product
    valid = prefix_mask(count, terms)
    zeros = torch.zeros(batch, terms, dtype=torch.long).scatter_add_(1, term, (valid & (digits == 0)).long())
    logs = torch.zeros(batch, terms, dtype=torch.long).scatter_add_(1, term, LOG2_MOD5[digits] * valid)
    used = torch.zeros(batch, terms, dtype=torch.long).scatter_add_(1, term, valid.long())
    sign = torch.zeros(batch, terms, dtype=torch.long).scatter_add_(1, term, (starts & (before == 1)).long())
    product = torch.where(zeros > 0, 0, POW2_MOD5[logs % 4]) * (1 - 2 * sign)
    return (product * (used > 0)).sum(1) % 5
