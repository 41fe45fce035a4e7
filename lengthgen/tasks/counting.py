"""Counting: the value of a variable after a program of sets, increments and no-ops (the CoPE
paper's counting task, Golovneva et al., 2024, as its released generator writes it).

    question "a = 0 ; pass; pass; a ++; b = 0 ; a ++; print a ="  ->  answer "2"

A program of n statements over `variables` variables (option, default 3: a, b, c; the paper
reports 1, 3 and 5): `v = 0 ;` sets v to zero, `v ++;` adds one to it, `pass;` does nothing;
then `print v =` asks the value of a variable the program has set, the answer (0..10). Tokens
are the words of the released tokenizer (the text split on spaces): `pass;` and `++;` are one
token each; in text they are separated by spaces.

The law is the released generator's (facebookresearch/RAM, projects/cope/scripts/count_data_gen.py):
each statement is drawn with weights set 1, pass 50, increment 7; a set picks its variable
uniformly among all, an increment among those already set, and an increment that is impossible
(no variable set yet, or the one picked already at 10) is drawn again, statement and variable;
the printed variable is uniform among those set, and a program that sets none is drawn again.
Here those redraws are taken exactly rather than by retrying: every statement before the first
set is a pass, the first set's place follows the geometric law (1/51 a statement) truncated to
the n statements, and after it each statement is drawn from the weights conditioned on being
possible. The released generator draws n uniform in 3..512 and trains on the last 512 tokens of
each program; here n is the problem length, and nothing is trimmed. Its question ends with
"print v"; lengthgen's questions end with "=".

T(n) = n looped steps (one per statement).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Batch, Task, make_batch, prefix_mask
from .copy_symbols import LETTERS

SET, PASS, INCREMENT = 0, 1, 2
WEIGHT_SET, WEIGHT_PASS, WEIGHT_INCREMENT = 1, 50, 7  # the released OP_WEIGHTS
MAX_VALUE = 10  # the released MAX_VAL: no increment past it
WIDE = 4  # tokens of the longest statement, "v = 0 ;"
WORDS = ("=", ";", "++;", "pass;", "print") + tuple(str(v) for v in range(MAX_VALUE + 1))  # after the variables


def uniform(shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    """Uniform floats in [0, 1) from one torch.randint draw (53 random bits each)."""
    return torch.randint(0, 2**53, shape, generator=generator).double() / 2**53


def nth_true(mask: Tensor, r: Tensor) -> Tensor:
    """(B,) the column of the r[b]-th (from 0) True in row b of mask (B, V)."""
    return (mask.long().cumsum(1) <= r[:, None]).sum(1)


class Counting(Task):
    name = "counting"
    sep = " "
    tokens = tuple(LETTERS[:3]) + WORDS  # the default; __init__ sets its own
    answer_symbols = MAX_VALUE + 1
    eos = False  # one answer token
    example = "a = 0 ; pass; pass; a ++; b = 0 ; a ++; print a = -> 2"

    def __init__(self, *, variables: int = 3):
        if not isinstance(variables, int) or isinstance(variables, bool) or not 1 <= variables <= len(LETTERS):
            raise ValueError(f"counting: variables must be an integer in 1..{len(LETTERS)}, got {variables!r}")
        self.variables = variables
        self.tokens = tuple(LETTERS[:variables]) + WORDS

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, width = self.lengths_of(batch_size, length)
        first = self.first_set(n, uniform((batch_size,), generator))
        ops, names, values, is_set = self.run(n, first, uniform((batch_size, width), generator),
                                              uniform((batch_size, width), generator))
        printed = nth_true(is_set, (uniform((batch_size,), generator) * is_set.sum(1)).long())
        answer = values.gather(1, printed[:, None]) + self.token_id("0")
        question, question_len = self.render(ops, names, n, printed)
        return make_batch(question, question_len, answer, torch.ones_like(n), lengths=n, n_steps=n.clone(),
                          eos=self.eos)

    @staticmethod
    def first_set(n: Tensor, u: Tensor) -> Tensor:
        """(B,) the first set's statement: P(t) ∝ q^t over 0..n-1, q = 50/51 (a pass before it), by
        inverting the truncated geometric law's distribution function at u."""
        q = WEIGHT_PASS / (WEIGHT_SET + WEIGHT_PASS)
        t = torch.log1p(-u * (1 - q ** n.double())) / torch.log(torch.tensor(q, dtype=torch.float64))
        return torch.minimum(t.floor().long().clamp(min=0), n - 1)

    def run(self, n: Tensor, first: Tensor, op_u: Tensor, pick_u: Tensor) -> tuple[Tensor, ...]:
        """Run the statements one column at a time, every sample at once: (ops (B, W), their
        variables (B, W), the final values (B, V), which variables are set (B, V))."""
        batch, width = op_u.shape
        values = torch.zeros(batch, self.variables, dtype=torch.long)
        is_set = torch.zeros(batch, self.variables, dtype=torch.bool)
        ops = torch.full((batch, width), PASS)
        names = torch.zeros(batch, width, dtype=torch.long)
        for t in range(width):
            op = self.statement(values, is_set, op_u[:, t])
            op = torch.where(t == first, SET, torch.where((t > first) & (t < n), op, PASS))
            pick = self.variable(op, values, is_set, pick_u[:, t])
            chosen = torch.nn.functional.one_hot(pick, self.variables).bool()
            values = torch.where(chosen & (op == SET)[:, None], 0, values + (chosen & (op == INCREMENT)[:, None]))
            is_set |= chosen & (op == SET)[:, None]
            ops[:, t], names[:, t] = op, pick
        return ops, names, values, is_set

    @staticmethod
    def statement(values: Tensor, is_set: Tensor, u: Tensor) -> Tensor:
        """(B,) the next statement's kind given the state, from a uniform u: the weights conditioned
        on the statement being possible. A retried increment picks a variable uniformly among the
        set ones and succeeds if it is below the cap: it keeps the weight 7 * open / set."""
        open_ = is_set & (values < MAX_VALUE)
        increment = WEIGHT_INCREMENT * open_.sum(1) / is_set.sum(1).clamp(min=1)
        x = u * (WEIGHT_SET + WEIGHT_PASS + increment)
        return torch.where(x < WEIGHT_SET, SET, torch.where(x < WEIGHT_SET + WEIGHT_PASS, PASS, INCREMENT))

    def variable(self, op: Tensor, values: Tensor, is_set: Tensor, u: Tensor) -> Tensor:
        """(B,) the statement's variable, from a uniform u: a set's uniform among all, an
        increment's among the set ones below the cap; a pass's is never read."""
        open_ = is_set & (values < MAX_VALUE)
        pick = torch.where(op == SET, (u * self.variables).long(), nth_true(open_, (u * open_.sum(1)).long()))
        return pick.clamp(max=self.variables - 1)

    def render(self, ops: Tensor, names: Tensor, n: Tensor, printed: Tensor) -> tuple[Tensor, Tensor]:
        """The program's tokens, then "print v =": (B, L) right-padded, and each row's length."""
        batch, width = ops.shape
        name = names + self.token_id("a")
        words = torch.stack([torch.where(ops == PASS, self.token_id("pass;"), name),
                             torch.where(ops == SET, self.token_id("="), self.token_id("++;")),
                             torch.full_like(ops, self.token_id("0")), torch.full_like(ops, self.token_id(";"))], 2)
        count = torch.where(ops == SET, WIDE, torch.where(ops == INCREMENT, 2, 1)) * prefix_mask(n, width)
        start = count.cumsum(1) - count  # each statement's first token
        size = int(count.sum(1).max()) + 3
        place = start[:, :, None] + torch.arange(WIDE)
        place = torch.where(torch.arange(WIDE) < count[:, :, None], place, size)  # unused words: a spare column
        out = torch.zeros(batch, size + 1, dtype=torch.long).scatter_(1, place.flatten(1), words.flatten(1))
        end = count.sum(1)[:, None]
        tail = torch.stack([torch.full_like(printed, self.token_id("print")), printed + self.token_id("a"),
                            torch.full_like(printed, self.token_id("="))], 1)
        out.scatter_(1, end + torch.arange(3), tail)
        return out[:, :size], end[:, 0] + 3
