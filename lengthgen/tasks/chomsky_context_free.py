"""The deterministic context-free tasks of the Chomsky-hierarchy suite (Delétang et al., ICLR 2023),
as the authors' released generators (tasks/dcf/) define them.

    stack_manipulation           "1 0 PUSH0 PUSH1 POP ="  ->  "0 0 1 # 0 0"
        the stack (given bottom to top) after the actions, top to bottom, the end token #, then 0s
        to n + 1 tokens; scored (chomsky_accuracy) up to the #
    reverse_string               "01101="      ->  "10110"
    modular_arithmetic_brackets  "(3*(2))="    ->  "1"    (+ - * mod 5, the authors' registered mult=True)
    solve_equation               "(3-(x))~1="  ->  "2"    (the digit x stands for; ~ is the equation's
        own '=', the authors' token 10, kept apart from lengthgen's '=' that ends every question)

T(n) = n (lengthgen.tasks.chomsky_common).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Batch, prefix_mask, reverse_prefix, uniform_below
from .chomsky_common import END, ChomskyTask, Symbols, uniform_in
from .chomsky_regular import DIGITS5

PLUS, MINUS, TIMES, OPEN, CLOSE = 5, 6, 7, 8, 9  # the authors' ids in modular_arithmetic_brackets


class StackManipulation(ChomskyTask):
    """A stack of s ~ U{1..n-1} bits then n - s actions (POP, PUSH0, PUSH1 uniform; POP on an empty
    stack ignored): the final stack top to bottom, then #, then 0s (n + 1 answer tokens)."""
    name = "stack_manipulation"
    sep = " "
    tokens = ("0", "1", "POP", "PUSH0", "PUSH1", END, "=")  # the authors' input ids 0-4, then their end class
    answer_symbols = 3
    end = END
    example = "1 0 PUSH0 PUSH1 POP = -> 0 0 1 # 0 0"

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, width = self.lengths_of(batch_size, length)
        s = uniform_in(1, (n - 1).clamp(min=1), generator)  # n = 1: one bit, no action (the authors' case)
        bits = torch.randint(0, 2, (batch_size, width), generator=generator)
        actions = torch.randint(2, 5, (batch_size, width), generator=generator)
        j = torch.arange(width)[None, :]
        x = torch.where(j < s[:, None], bits, actions)  # (B, W) the authors' ids
        stack = final_stack(x, n, prefix_mask(n, width))  # (B, W + 1) classes 0, 1, 2 = end
        answer = torch.where(stack == 2, self.token_id(END), self.ids(stack))
        return self.finish(self.ids(x), n, answer, n + 1, n)


def final_stack(x: Tensor, n: Tensor, valid: Tensor) -> Tensor:
    """(B, W + 1) the final stack top to bottom, 2 (end), then 0s, of the ops x (B, W): 0/1 and
    3/4 push 0/1, 2 pops. Height h_t = S_t - min(0, min S) (pops on empty ignored), and the bit at
    level k is the one pushed last when the height rose to k."""
    batch, width = x.shape
    push = (x != 2) & valid
    delta = torch.where(push, 1, torch.where(valid, -1, 0))
    walk = delta.cumsum(1)
    height = walk - walk.cummin(1).values.clamp(max=0)  # (B, W)
    value = torch.where(x >= 3, x - 3, x)
    column = torch.arange(width)[None, :].expand(batch, -1)
    last = torch.full((batch, width + 1), -1).scatter_reduce_(
        1, torch.where(push, height, 0), torch.where(push, column, -1), "amax")  # (B, W+1) by level
    top = height.gather(1, (n - 1)[:, None])  # (B, 1) final height
    k = torch.arange(width + 1)[None, :]
    level = (top - k).clamp(min=0)  # output slot k holds level top - k
    bit = value.gather(1, last.gather(1, level).clamp(min=0))  # level 0 (no level) reads anything
    return torch.where(k < top, bit, torch.where(k == top, 2, 0))


class ReverseString(Symbols):
    """The n symbols reversed: "01101=" -> "10110" (`vocab_size` symbols, 2 in the paper)."""
    name = "reverse_string"
    tokens = ("0", "1", "=")
    example = "01101= -> 10110"

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, x = self.draw(batch_size, length, generator)
        return self.finish(self.ids(x), n, self.ids(reverse_prefix(x, n)), n.clone(), n)


def bracket_expressions(n: Tensor, mult: bool, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(codes (B, W), values (B,)) of the authors' bracket grammar at exact lengths n (>= 1): n = 1..4
    give d, -d, (d), (-d); longer, (L op R) with |L| uniform in 1..n-4. One pass per tree level
    for the whole batch: each pending node, keyed by its first column, writes its brackets and
    operator and hands its two children to the next level; values are combined bottom-up."""
    batch, width = len(n), int(n.max())
    sink = width  # a spare column for writes that do not happen
    out = torch.zeros(batch, width + 1, dtype=torch.long)
    value = torch.zeros(batch, width + 1, dtype=torch.long)
    pending = torch.zeros(batch, width + 1, dtype=torch.long)
    pending[:, 0] = n
    start = torch.arange(width + 1)[None, :].expand(batch, -1)
    levels = []
    while bool((pending > 0).any()):
        size = pending
        digit = torch.randint(0, 5, size.shape, generator=generator)
        op = torch.randint(0, 3 if mult else 2, size.shape, generator=generator) + PLUS
        left = 1 + uniform_below((size - 4).clamp(min=1), generator)
        leaf, inner = (size >= 1) & (size <= 4), size >= 5

        def put(where: Tensor, offset: Tensor, code) -> None:
            out.scatter_(1, torch.where(where, start + offset, sink), torch.as_tensor(code).expand(batch, width + 1))

        put(leaf, (size >= 2).long() + (size == 4).long(), digit)
        put((size == 2) | (size == 4), (size == 4).long(), MINUS)
        put(size >= 3, torch.zeros_like(size), OPEN)
        put(size >= 3, size - 1, CLOSE)
        put(inner, 1 + left, op)
        value = torch.where(leaf, torch.where((size == 2) | (size == 4), (-digit) % 5, digit), value)
        pending = torch.zeros_like(pending)
        pending.scatter_(1, torch.where(inner, start + 1, sink), torch.where(inner, left, 0))
        pending.scatter_(1, torch.where(inner, start + 2 + left, sink), torch.where(inner, size - 3 - left, 0))
        pending[:, sink] = 0
        levels.append((inner, left, op))
    for inner, left, op in reversed(levels):
        a = value.gather(1, (start + 1).clamp(max=sink))
        b = value.gather(1, (start + 2 + left).clamp(max=sink))
        combined = torch.where(op == PLUS, a + b, torch.where(op == MINUS, a - b, a * b)) % 5
        value = torch.where(inner, combined, value)
    return out[:, :width], value[:, 0]


class ModularArithmeticBrackets(ChomskyTask):
    """A bracketed expression over digits 0-4 and + - * of exactly n tokens, mod 5:
    "(3*(2))=" -> "1". `mult = false` leaves * out (the authors' class default; their
    experiments register mult = True, the default here)."""
    name = "modular_arithmetic_brackets"
    tokens = DIGITS5 + ("+", "-", "*", "(", ")", "=")  # the authors' ids 0-9 (their 10, 'x', never drawn)
    answer_symbols = 5
    example = "(3*(2))= -> 1"

    def __init__(self, *, mult: bool = True):
        if not isinstance(mult, bool):
            raise ValueError(f"{self.name}: mult must be true or false, got {mult!r}")
        self.mult = mult

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, _ = self.lengths_of(batch_size, length)
        codes, value = bracket_expressions(n, self.mult, generator)
        return self.finish(self.ids(codes), n, self.ids(value[:, None]), torch.ones_like(n), n)


SOLVE_CODES = torch.tensor([0, 1, 2, 3, 4, 5, 6, 7, 7, 8])  # bracket codes -> solve_equation ids (no *)
X, EQUALS = 9, 10  # the authors' ids of the unknown and of the equation's '='


class SolveEquation(ChomskyTask):
    """A +/- bracket expression of n - 2 tokens with one digit replaced by x, then ~ and its value
    mod 5: the digit x stands for. "(3-(x))~1=" -> "2". n < 3: n "0" tokens, answer 0 (the
    authors' dummy samples)."""
    name = "solve_equation"
    tokens = DIGITS5 + ("+", "-", "(", ")", "x", "~", "=")  # the authors' ids 0-10
    answer_symbols = 5
    example = "(3-(x))~1= -> 2"

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, width = self.lengths_of(batch_size, length)
        m = (n - 2).clamp(min=1)
        codes, value = bracket_expressions(m, False, generator)  # (B, max m)
        codes = SOLVE_CODES[codes]
        first = uniform_below(m, generator)  # a uniform column, then forward (cyclically) to a digit
        j = torch.arange(codes.shape[1])[None, :]
        distance = torch.where((codes < 5) & (j < m[:, None]), (j - first[:, None]) % m[:, None], 2 * width)
        place = distance.argmin(1, keepdim=True)
        solution = codes.gather(1, place)
        codes = codes.scatter(1, place, X)
        x = torch.nn.functional.pad(codes, (0, 2))
        x = x.scatter(1, m[:, None], EQUALS).scatter(1, m[:, None] + 1, value[:, None])
        dummy = (n < 3)[:, None]
        x, solution = x.masked_fill(dummy, 0), solution.masked_fill(dummy, 0)
        return self.finish(self.ids(x), n, self.ids(solution), torch.ones_like(n), n)
