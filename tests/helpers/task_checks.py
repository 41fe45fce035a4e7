"""Brute-force solvers and layout checks shared by the task tests."""
from __future__ import annotations

import math
import re

import torch

from lengthgen.tasks import EOS, IGNORE, PAD, SPECIALS, Batch, Task

ORDER = ["parity", "copy", "addition", "binary_sum", "multiplication", "unique_set", "copy_symbols", "induct",
         "sparse_parity", "decimal_addition", "decimal_multiplication", "multi_operand_addition", "long_multiplication",
         "selective_copy", "counting"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
HINTS = LETTERS + LETTERS.upper()  # index hints, in order


# ---------------------------------------------------------------- brute force
# Each solver parses the question text and returns (answer text, T(n)) with plain
# Python, or raises AssertionError if the question does not have the right form.

def _match(pattern: str, question: str) -> re.Match:
    m = re.fullmatch(pattern, question)
    assert m, f"question {question!r} does not match {pattern!r}"
    return m


def solve_parity(q: str, n: int) -> tuple[str, int]:
    bits = _match(rf"([01]{{{n}}})=", q).group(1)
    return str(bits.count("1") % 2), n


def solve_copy(q: str, n: int) -> tuple[str, int]:
    return _match(rf"([01]{{{n}}})=", q).group(1), n


def solve_addition(q: str, n: int) -> tuple[str, int]:
    a, b = _match(rf"([01]{{{n}}})\+([01]{{{n}}})=", q).groups()
    return format(int(a, 2) + int(b, 2), f"0{n + 1}b"), n


def solve_binary_sum(q: str, n: int) -> tuple[str, int]:
    bits = _match(rf"([01]{{{n}}})=", q).group(1)
    return format(bits.count("1"), "b")[::-1], n


def solve_multiplication(q: str, n: int, max_a_bits: int = 2) -> tuple[str, int]:
    a, b = _match(rf"([01]{{1,{max_a_bits}}})\*([01]{{{n}}})=", q).groups()
    width = len(a) + len(b)
    return format(int(a, 2) * int(b, 2), f"0{width}b")[::-1], len(a) * n


def solve_unique_set(q: str, n: int, symbols: int = 50) -> tuple[str, int]:
    parts = _match(rf"((?:\d+ ){{{n}}})=", q).group(1).split()
    assert len(parts) == n and all(0 <= int(p) < symbols and str(int(p)) == p for p in parts)
    seen: list[str] = []
    for p in parts:
        if p not in seen:
            seen.append(p)
    return " ".join(seen), n


def solve_copy_symbols(q: str, n: int, symbols: int = 16) -> tuple[str, int]:
    return _match(rf"([{LETTERS[:symbols]}]{{{n}}})=", q).group(1), n


def solve_induct(q: str, n: int, symbols: int = 16) -> tuple[str, int]:
    text, query = _match(rf"([{LETTERS[:symbols]}]{{{n + 1}}})\?([{LETTERS[:symbols]}])=", q).groups()
    assert text.count(query) == 1 and text.index(query) < n, (q, "the query must occur once, with a successor")
    return text[text.index(query) + 1], n


def solve_flipflop(q: str, n: int) -> tuple[str, int]:
    """The read bits of a sequence written without its last bit: every read but the last
    must already show the last written bit; the first instruction is w, the last r."""
    m = _match(rf"w[01](?:[wri][01]){{{n - 2}}}r", q)
    pairs = [m.group(0)[k:k + 2] for k in range(0, 2 * n - 2, 2)]
    written, reads = None, []
    for instruction, bit in pairs:
        if instruction == "w":
            written = bit
        elif instruction == "r":
            assert bit == written, (q, "a read shows another bit than the last write")
            reads.append(bit)
    return "".join(reads) + written, n


def solve_sparse_parity(q: str, n: int, k_max: int = 4, k: int | None = None,
                        layout: str = "blocks") -> tuple[str, int]:
    """n bits, then n selectors with k '+' (the fixed k, or 1..min(k_max, n)): XOR of the selected bits.
    layout "pairs": bit, selector, bit, selector, ..."""
    if layout == "pairs":
        pairs = _match(rf"((?:[01][+-]){{{n}}})=", q).group(1)
        bits, selectors = pairs[0::2], pairs[1::2]
    else:
        bits, selectors = _match(rf"([01]{{{n}}})([+-]{{{n}}})=", q).groups()
    chosen = [b for b, s in zip(bits, selectors) if s == "+"]
    assert len(chosen) == k if k is not None else 1 <= len(chosen) <= min(k_max, n), (q, "wrong number selected")
    return str(chosen.count("1") % 2), n


def solve_decimal_addition(q: str, n: int) -> tuple[str, int]:
    a, b = _match(rf"(\d{{{n}}})\+(\d{{{n}}})=", q).groups()
    return str(int(a) + int(b)).zfill(n + 1)[::-1], n


def solve_hinted_addition(q: str, n: int, base: int = 10, units_first: bool = True,
                          operands: str = "equal") -> tuple[str, int]:
    """A question written with index hints (a letter before every digit): the hints of each operand
    must name its digits' significances from one offset shared by both, the sum's n + 1 digits are
    computed on the digits alone and written with the same hints ("c6b5a3+c0b4a9=" -> "a2b0c7d0")."""
    numbers = _match(r"((?:[a-zA-Z][0-9])+)\+((?:[a-zA-Z][0-9])+)=", q).groups()
    parsed = [(number[0::2], number[1::2]) for number in numbers]  # (hints, digits)
    offset = HINTS.index(parsed[0][0][-1])  # the units digit's hint
    for hints, digits in parsed:
        assert all(d in "0123456789"[:base] for d in digits), (q, "not a digit")
        assert [HINTS.index(h) for h in hints] == [offset + len(hints) - 1 - k for k in range(len(hints))], \
            (q, "hints do not name the significances from the shared offset")
    lengths = [len(digits) for _, digits in parsed]
    assert lengths == [n, n] if operands == "equal" else max(lengths) == n, (q, lengths)
    assert offset + n < len(HINTS), (q, "more hints than letters")
    total = sum(int(digits, base) for _, digits in parsed)
    sum_digits = [str(total // base ** s % base) for s in range(n + 1)]  # units first
    assert total < base ** (n + 1)
    order = range(n + 1) if units_first else range(n, -1, -1)
    return "".join(HINTS[offset + s] + sum_digits[s] for s in order), n


def solve_selective_copy(q: str, n: int, symbols: int = 16, blank_ratio: float = 1.0) -> tuple[str, int]:
    """n symbols and round-half-up(blank_ratio * n) blanks '.', in any order: the symbols."""
    text = _match(rf"([{LETTERS[:symbols]}.]*)=", q).group(1)
    content = text.replace(".", "")
    assert len(content) == n and text.count(".") == math.floor(blank_ratio * n + 0.5), (q, "wrong counts")
    return content, n


def solve_counting(q: str, n: int, variables: int = 3) -> tuple[str, int]:
    """Run the n statements (`v = 0 ;`, `v ++;`, `pass;`), then read `print v =`: v must be set,
    and no value may pass 10 (the released generator's cap)."""
    words = q.split(" ")
    assert words[-3] == "print" and words[-1] == "=", (q, "no print at the end")
    names, values, k, statements = LETTERS[:variables], {}, 0, 0
    while k < len(words) - 3:
        if words[k] == "pass;":
            k += 1
        elif words[k] in names and words[k + 1:k + 4] == ["=", "0", ";"]:
            values[words[k]] = 0
            k += 4
        elif words[k] in names and words[k + 1] == "++;":
            assert words[k] in values and values[words[k]] < 10, (q, "an increment the law forbids")
            values[words[k]] += 1
            k += 2
        else:
            raise AssertionError(f"question {q!r}: no statement at word {k}")
        statements += 1
    assert statements == n and words[-2] in values, (q, statements, "wrong count, or an unset variable printed")
    return str(values[words[-2]]), n


def solve_decimal_multiplication(q: str, n: int, b_digits: int = 2) -> tuple[str, int]:
    a, b = _match(rf"(\d{{{n}}})\*(\d{{{b_digits}}})=", q).groups()
    return str(int(a) * int(b)).zfill(n + b_digits)[::-1], n


def solve_multi_operand_addition(q: str, n: int, low: int = 2, high: int = 5, exact: bool = True) -> tuple[str, int]:
    """m operands (low..high) of exactly n digits (exact; else the longest has n), each zero-padded to
    the digits of m * (10^n - 1); the running sums 0, a_1, a_1 + a_2, ... in that width, units first,
    joined by ">"."""
    operands = _match(r"(\d+(?:\+\d+)*)=", q).group(1).split("+")
    m, width, counts = len(operands), len(str(len(operands) * (10 ** n - 1))), [len(str(int(a))) for a in operands]
    assert low <= m <= high and all(len(a) == width for a in operands), (q, "operands")
    assert all(c == n for c in counts) if exact else max(counts) == n, (q, "digit counts")
    sums = [sum(int(a) for a in operands[:k]) for k in range(m + 1)]
    return ">".join(str(s).zfill(width)[::-1] for s in sums), n


def solve_long_multiplication(q: str, n: int, low: int = 1, high: int = 4) -> tuple[str, int]:
    """A (n digits) * B (low..high digits): the partial products A * b_j in n + 1 digits, then the
    running sums of A * (B's last k digits) in n + len(B) digits, all units first."""
    a, b = _match(rf"(\d{{{n}}})\*(\d+)=", q).groups()
    assert low <= len(b) <= high and len(str(int(a))) == n and len(str(int(b))) == len(b), (q, "operands")
    parts = [str(int(a) * int(digit)).zfill(n + 1)[::-1] for digit in b[::-1]]
    sums = [str(int(a) * int(b[len(b) - k:])).zfill(n + len(b))[::-1] for k in range(1, len(b) + 1)]
    return "+".join(parts) + "=" + ">".join(sums), n


SOLVERS = {"parity": solve_parity, "copy": solve_copy, "addition": solve_addition,
           "binary_sum": solve_binary_sum, "multiplication": solve_multiplication,
           "unique_set": solve_unique_set, "copy_symbols": solve_copy_symbols, "induct": solve_induct,
           "sparse_parity": solve_sparse_parity, "decimal_addition": solve_decimal_addition,
           "decimal_multiplication": solve_decimal_multiplication,
           "multi_operand_addition": solve_multi_operand_addition, "long_multiplication": solve_long_multiplication,
           "selective_copy": solve_selective_copy,
           "counting": solve_counting}


# ---------------------------------------------------------------- layout check

def check_layout(task: Task, batch: Batch, n: int | torch.Tensor, empty_ok: bool = False) -> None:
    """Vectorised checks of the Batch layout that do not use to_text.
    n: the problem length of every sample, or a (B,) tensor of per-sample lengths;
    empty_ok: answers may have no token (Binary Sum's released zero), only the EOS."""
    B, L = batch.inputs.shape
    assert batch.targets.shape == (B, L)
    for t in (batch.question_len, batch.lengths, batch.n_steps):
        assert t.shape == (B,) and t.dtype == torch.long
    assert batch.inputs.dtype == torch.long and batch.targets.dtype == torch.long
    assert (batch.lengths == n).all()
    q = batch.question_len[:, None]
    e = int(task.eos)  # one scored EOS after answers whose length varies
    scored_count = batch.scored.sum(1)[:, None]
    a = scored_count - e  # answer tokens
    assert (a >= (0 if empty_ok else 1)).all()
    end = q - 1 + scored_count  # one past the last scored (= last input) column
    assert L == int(end.max())  # no all-padding column
    j = torch.arange(L)[None, :]
    # scored exactly from '=' to the end of the answer
    assert torch.equal(batch.scored, (j >= q - 1) & (j < end))
    # the question: task tokens only, ending with '='
    in_q = j < q
    assert (batch.inputs[in_q] >= len(SPECIALS)).all()
    assert (batch.inputs[in_q] < task.vocab_size).all()
    assert (batch.inputs.gather(1, q - 1) == task.token_id("=")).all()
    # targets: answer tokens, then one EOS if the task has one
    last = end - 1
    assert ((batch.targets.gather(1, last) == EOS) == bool(e)).all()
    answer_targets = batch.scored & (j < end - e)
    assert (batch.targets[answer_targets] >= len(SPECIALS)).all()
    assert (batch.targets[answer_targets] < task.vocab_size).all()
    # inputs in the answer region are the targets shifted by one; PAD afterwards
    in_a = (j >= q) & (j < end)
    shifted = torch.nn.functional.pad(batch.targets[:, :-1], (1, 0), value=IGNORE)
    assert torch.equal(batch.inputs[in_a], shifted[in_a])
    # after the answer: PAD (the EOS is a target only)
    assert (batch.inputs[j >= end] == PAD).all()


def check_answers(task: Task, batch: Batch, n: int | torch.Tensor, solve) -> None:
    n_steps = batch.n_steps.tolist()
    per_sample = n.tolist() if isinstance(n, torch.Tensor) else [n] * len(batch)
    for i in range(len(batch)):
        question, answer = task.to_text(batch, i)
        expected, steps = solve(question, per_sample[i])
        assert answer == expected, (task.name, per_sample[i], question, answer, expected)
        assert n_steps[i] == steps, (task.name, question, n_steps[i], steps)
