"""Task registry: `TASKS` by name and `get_task(name, **options)`."""
from __future__ import annotations

import difflib

from lengthgen import register
from .addition import Addition
from .base import BLANK, EOS, IGNORE, PAD, SPECIALS, Batch, Task, TrailingPad, measure, score
from .binary_sum import BinarySum
from .chomsky_context_free import ModularArithmeticBrackets, ReverseString, SolveEquation, StackManipulation
from .chomsky_context_sensitive import (BinaryAddition, BinaryMultiplication, BucketSort, ComputeSqrt, DuplicateString,
                                        MissingDuplicateString, OddsFirst)
from .chomsky_regular import CycleNavigation, EvenPairs, ModularArithmetic, ParityCheck
from .copy import Copy
from .copy_symbols import CopySymbols
from .counting import Counting
from .decimal_addition import DecimalAddition
from .decimal_multiplication import DecimalMultiplication
from .flipflop import FlipFlop
from .induct import Induct
from .long_multiplication import LongMultiplication
from .multi_operand_addition import MultiOperandAddition
from .multiplication import Multiplication
from .parity import Parity
from .selective_copy import SelectiveCopy
from .sparse_parity import SparseParity
from .text import Text
from .unique_set import UniqueSet

# The Chomsky-hierarchy suite (Delétang et al., ICLR 2023) under the authors' task names, by level
CHOMSKY = {
    cls.name: cls for cls in (EvenPairs, ModularArithmetic, ParityCheck, CycleNavigation,  # regular
                              StackManipulation, ReverseString, ModularArithmeticBrackets, SolveEquation,  # DCF
                              DuplicateString, MissingDuplicateString, OddsFirst, BinaryAddition,  # CS
                              BinaryMultiplication, ComputeSqrt, BucketSort)
}
# The built-ins, registered as plugins are (lengthgen.register), in the order listings show them
TASKS = register.TASKS
TASKS.base = Task
for _cls in (Parity, Copy, Addition, BinarySum, Multiplication, UniqueSet, CopySymbols, Induct, FlipFlop, SparseParity,
             DecimalAddition, DecimalMultiplication, MultiOperandAddition, LongMultiplication, SelectiveCopy, Counting,
             Text, *CHOMSKY.values()):
    TASKS.add(_cls.name, _cls)


def task_of(cfg, **options) -> Task:
    """The task of a config's [task] table (a TaskConfig), `options` replacing some of its options,
    with scored PADs after each answer when it asks for them (`trailing_pad`, `pad_to_row`)."""
    task = get_task(cfg.name, **{**cfg.options, **options})
    return TrailingPad(task, cfg.trailing_pad, cfg.pad_to_row) if cfg.trailing_pad or cfg.pad_to_row else task


def get_task(name: str, **options) -> Task:
    """An instance of the task `name`; unknown options raise TypeError."""
    if name not in TASKS:
        close = difflib.get_close_matches(str(name), TASKS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"unknown task {name!r}{hint}; choose from {', '.join(TASKS)}")
    return TASKS[name](**options)


__all__ = ["TASKS", "CHOMSKY", "get_task", "task_of", "Batch", "Task", "measure", "score", "IGNORE", "PAD", "EOS",
           "BLANK", "SPECIALS",
           "Parity", "Copy", "Addition", "BinarySum", "Multiplication", "UniqueSet",
           "CopySymbols", "Induct", "FlipFlop", "SparseParity", "DecimalAddition",
           "DecimalMultiplication", "MultiOperandAddition", "LongMultiplication", "SelectiveCopy", "Counting", "Text"]
