"""Writes tests/tasks/chomsky_reference.json.gz: samples of the authors' own generators
(google-deepmind/neural_networks_chomsky_hierarchy at 2b8eb4b, tasks/), read by test_chomsky.py.

Not a test: it needs JAX, which lengthgen does not. Run it in a throwaway environment with
jax[cpu], chex, dm-tree, tqdm and numpy, the authors' `tasks/` folder importable as
`neural_networks_chomsky_hierarchy.tasks`:

    PYTHONPATH=/tmp/nnch /tmp/jaxenv/bin/python tests/tasks/chomsky_reference.py

Each sample is written "input|output" with the authors' ids as base-16 digits (argmax of their
one-hot tensors). `exact`: 40 samples at each of a range of lengths; `law`: 2000 at one length.
Their experiments' task builders are used (modular_arithmetic_brackets with mult=True), and
modular_arithmetic is built anew for each call: its operators are a generator, spent by the
first jit trace.
"""
from __future__ import annotations

import functools
import gzip
import json
import random
from pathlib import Path

import jax
import numpy as np

from neural_networks_chomsky_hierarchy.tasks.cs import (binary_addition, binary_multiplication, bucket_sort,
                                                        compute_sqrt, duplicate_string, missing_duplicate_string,
                                                        odds_first)
from neural_networks_chomsky_hierarchy.tasks.dcf import (modular_arithmetic_brackets, reverse_string, solve_equation,
                                                         stack_manipulation)
from neural_networks_chomsky_hierarchy.tasks.regular import (cycle_navigation, even_pairs, modular_arithmetic,
                                                             parity_check)

BUILDERS = {
    "even_pairs": even_pairs.EvenPairs, "modular_arithmetic": modular_arithmetic.ModularArithmetic,
    "parity_check": parity_check.ParityCheck, "cycle_navigation": cycle_navigation.CycleNavigation,
    "stack_manipulation": stack_manipulation.StackManipulation, "reverse_string": reverse_string.ReverseString,
    "modular_arithmetic_brackets": functools.partial(modular_arithmetic_brackets.ModularArithmeticBrackets,
                                                     mult=True),
    "solve_equation": solve_equation.SolveEquation, "duplicate_string": duplicate_string.DuplicateString,
    "missing_duplicate_string": missing_duplicate_string.MissingDuplicateString,
    "odds_first": odds_first.OddsFirst, "binary_addition": binary_addition.BinaryAddition,
    "binary_multiplication": binary_multiplication.BinaryMultiplication,
    "compute_sqrt": compute_sqrt.ComputeSqrt, "bucket_sort": bucket_sort.BucketSort,
}
EXACT = list(range(1, 13)) + [20, 41]
LAW = {"even_pairs": 6, "modular_arithmetic": 7, "parity_check": 6, "cycle_navigation": 6,
       "stack_manipulation": 7, "reverse_string": 6, "modular_arithmetic_brackets": 9, "solve_equation": 9,
       "duplicate_string": 6, "missing_duplicate_string": 7, "odds_first": 6, "binary_addition": 7,
       "binary_multiplication": 7, "compute_sqrt": 6, "bucket_sort": 5}
HEX = "0123456789abcdef"


def draw(name: str, count: int, length: int, key: int) -> list[str]:
    batch = BUILDERS[name]().sample_batch(jax.random.PRNGKey(key), count, length)
    inputs = np.asarray(batch["input"]).argmax(-1)
    outputs = np.asarray(batch["output"]).argmax(-1).reshape(count, -1)
    return ["".join(HEX[v] for v in i) + "|" + "".join(HEX[v] for v in o) for i, o in zip(inputs, outputs)]


def main() -> None:
    np.random.seed(0)  # the numpy / python tasks draw from the global generators
    random.seed(0)
    out = {}
    for name in BUILDERS:
        exact = {str(n): draw(name, 40, n, n) for n in EXACT}
        out[name] = {"exact": exact, "law": {str(LAW[name]): draw(name, 2000, LAW[name], 1000)}}
    path = Path(__file__).with_name("chomsky_reference.json.gz")
    with gzip.open(path, "wt") as f:
        json.dump(out, f, separators=(",", ":"))
    print(path, path.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
