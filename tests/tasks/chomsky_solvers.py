"""Brute-force solvers of the Chomsky-hierarchy tasks, written from the tasks' definitions with
plain Python (loops, eval, Python ints), independently of lengthgen's vectorised generators.

Each takes the authors' input ids of one sample (a list) and returns their output ids (a list:
one class for the classification tasks), or raises AssertionError where the input is not one the
authors' generator can draw. Helpers to read a lengthgen batch in the authors' ids are here too.
"""
from __future__ import annotations

import math

from lengthgen.tasks import SPECIALS
from lengthgen.tasks.chomsky_common import END

END_CLASS = 2  # the authors' end-token class in stack_manipulation and binary_*


def as_authors(task, batch, i: int) -> tuple[list[int], list[int]]:
    """(inputs, outputs) of sample i in the authors' ids: task tokens are in their input order,
    answer tokens are their classes ("#" = 2)."""
    q = int(batch.question_len[i])
    x = [int(t) - len(SPECIALS) for t in batch.inputs[i, :q - 1]]
    answer = [task.vocab[int(t)] for t in batch.targets[i][batch.targets[i] != -100]]
    return x, [END_CLASS if t == END else int(t) for t in answer]


def le_bits(value: int, width: int = 0) -> list[int]:
    """Little-endian bits, zero-filled to `width`; zero is [0] (Python's f'{0:b}')."""
    text = format(value, "b").zfill(width)
    return [int(c) for c in reversed(text)]


def le_value(bits: list[int]) -> int:
    return sum(b << k for k, b in enumerate(bits))


def even_pairs(x):
    assert set(x) <= {0, 1}
    return [sum(x[k] != x[k + 1] for k in range(len(x) - 1)) % 2]


def parity_check(x):
    assert set(x) <= {0, 1}
    return [sum(x) % 2]


def cycle_navigation(x):
    assert set(x) <= {0, 1, 2}
    position = 0
    for move in x:
        position = (position + move - 1) % 5
    return [position]


def modular_arithmetic(x):
    assert len(x) % 2 == 1
    assert all(v < 5 for v in x[0::2]) and all(v in (5, 6, 7) for v in x[1::2])
    return [eval("".join("01234+-*"[v] for v in x)) % 5]


def stack_manipulation(x):
    assert x and x[0] in (0, 1) and all(v in (2, 3, 4) for v in x[[v >= 2 for v in x].index(True):]) \
        if any(v >= 2 for v in x) else len(x) == 1
    stack = []
    for v in x:
        if v in (0, 1):
            stack.append(v)
        elif v == 2:
            if stack:
                stack.pop()
        else:
            stack.append(v - 3)
    out = stack[::-1] + [END_CLASS]
    return out + [0] * (len(x) + 1 - len(out))


def reverse_string(x):
    return x[::-1]


def modular_arithmetic_brackets(x):
    text = "".join("01234+-*()"[v] for v in x)
    assert all(a + b not in text for a in "+-*" for b in "+*)")  # no empty operand
    return [eval(text) % 5]


def solve_equation(x):
    if len(x) < 3:
        assert x == [0] * len(x)
        return [0]
    text = "".join("01234+-()x="[v] for v in x)
    expression, value = text.split("=")
    assert len(value) == 1 and text.count("x") == 1 and "*" not in text
    roots = [d for d in range(5) if eval(expression.replace("x", f"({d})")) % 5 == int(value)]
    assert len(roots) == 1, (text, roots)
    return roots


def duplicate_string(x):
    return x + x


def missing_duplicate_string(x):
    if len(x) == 1:
        assert x == [1]
        return [1]
    half = len(x) // 2
    body, pad = x[:2 * half], x[2 * half:]
    assert pad == [3] * (len(x) % 2) and body.count(2) == 1 and set(body) <= {0, 1, 2}
    hole = body.index(2)
    other = hole + half if hole < half else hole - half
    for k in range(half):
        if hole not in (k, k + half):
            assert body[k] == body[k + half]
    return [body[other]]


def odds_first(x):
    return x[1::2] + x[0::2]


def binary(x, multiply: bool):
    n = len(x)
    if n <= 2:  # the authors' dummies: a number in 0..2^n - 2, no operator
        assert set(x) <= {0, 1} and le_value(x) <= 2 ** n - 2
        result = [0] * (n - 1) if multiply else le_bits(le_value(x))
    else:
        assert x.count(2) == 1 and 0 < x.index(2) < n - 1
        a, b = le_value(x[:x.index(2)]), le_value(x[x.index(2) + 1:])
        assert a > 0 and b > 0
        result = le_bits(a * b if multiply else a + b)
    out = result + [END_CLASS]
    return out + [0] * (n + (0 if multiply else 1) - len(out))


def compute_sqrt(x):
    value = int("".join(map(str, x)), 2)
    assert value >= 1
    return [int(c) for c in format(math.isqrt(value), "b").zfill(math.ceil(len(x) / 2))]


def bucket_sort(x):
    return sorted(x)


SOLVERS = {"even_pairs": even_pairs, "modular_arithmetic": modular_arithmetic, "parity_check": parity_check,
           "cycle_navigation": cycle_navigation, "stack_manipulation": stack_manipulation,
           "reverse_string": reverse_string, "modular_arithmetic_brackets": modular_arithmetic_brackets,
           "solve_equation": solve_equation, "duplicate_string": duplicate_string,
           "missing_duplicate_string": missing_duplicate_string, "odds_first": odds_first,
           "binary_addition": lambda x: binary(x, False), "binary_multiplication": lambda x: binary(x, True),
           "compute_sqrt": compute_sqrt, "bucket_sort": bucket_sort}

# T_out(n), the output length, and the input length each task's generator gives at length n
OUTPUT_LENGTH = {"stack_manipulation": lambda n: n + 1, "reverse_string": lambda n: n,
                 "duplicate_string": lambda n: 2 * n, "odds_first": lambda n: n, "binary_addition": lambda n: n + 1,
                 "binary_multiplication": lambda n: n, "compute_sqrt": lambda n: (n + 1) // 2,
                 "bucket_sort": lambda n: n}


def output_length(name: str, n: int) -> int:
    return OUTPUT_LENGTH.get(name, lambda n: 1)(n)


def input_length(name: str, n: int) -> int:
    return n - 1 if name == "modular_arithmetic" and n % 2 == 0 else n
