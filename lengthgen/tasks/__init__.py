"""Task registry: `TASKS` by name and `get_task(name, **options)`."""
from __future__ import annotations

import difflib

from .addition import Addition
from .base import BLANK, EOS, IGNORE, PAD, SPECIALS, Batch, Task, TrailingPad, measure, score
from .binary_sum import BinarySum
from .copy import Copy
from .copy_symbols import CopySymbols
from .counting import Counting
from .decimal_addition import DecimalAddition
from .decimal_multiplication import DecimalMultiplication
from .flipflop import FlipFlop
from .induct import Induct
from .multiplication import Multiplication
from .parity import Parity
from .selective_copy import SelectiveCopy
from .sparse_parity import SparseParity
from .text import Text
from .unique_set import UniqueSet

TASKS: dict[str, type[Task]] = {
    cls.name: cls for cls in (Parity, Copy, Addition, BinarySum, Multiplication, UniqueSet, CopySymbols, Induct,
                              FlipFlop, SparseParity, DecimalAddition, DecimalMultiplication, SelectiveCopy,
                              Counting, Text)
}


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


__all__ = ["TASKS", "get_task", "task_of", "Batch", "Task", "measure", "score", "IGNORE", "PAD", "EOS", "BLANK", "SPECIALS",
           "Parity", "Copy", "Addition", "BinarySum", "Multiplication", "UniqueSet",
           "CopySymbols", "Induct", "FlipFlop", "SparseParity", "DecimalAddition",
           "DecimalMultiplication", "SelectiveCopy", "Counting", "Text"]
