"""The largest counts a trained run may be asked for: loop counts and stop-rule windows, tokens to
generate, a window of text. Each cap is derived from what the run could need (a small multiple of
the largest T(n), answer or window it was trained or is evaluated at), so a mistyped count is one
line at once instead of a loop that runs for hours. `lengthgen eval` checks its stop rules here, and
`lengthgen export` writes the same caps into the exported model's config.json (docs/export.md).
"""
from __future__ import annotations

import re

from lengthgen.errors import UserError
from lengthgen.methods.base import steps_at
from lengthgen.tasks import Task

# A loop count or a stop rule's window may reach LOOP_FACTOR x T(n) + LOOP_SLACK at the longest
# length asked: the confidence rules search 2 T(n) by default, and the released looped code's windows
# are T(n) + 20 or + 30, so twice the default with room for a fixed slack covers every shipped rule.
LOOP_FACTOR = 4
LOOP_SLACK = 64
# Tokens to generate or a window to read: TOKEN_FACTOR x the longest answer (or window) trained or evaluated.
TOKEN_FACTOR = 4


def loop_cap(task: Task, lengths: list[int]) -> int:
    """The most iterations a run asked about `lengths` (those trained and those evaluated) could need."""
    return LOOP_FACTOR * max(steps_at(task, n) for n in lengths) + LOOP_SLACK


def rule_counts(stop: str) -> list[int]:
    """The counts a stop rule names: `fixed:12` -> [12], `confidence-per-sample:+20:3` -> [20, 3]."""
    return [int(n) for n in re.findall(r"\d+", str(stop).partition(":")[2])]


def check_stop_bounds(stops: list, task: Task, lengths: list[int]) -> None:
    """UserError naming the first stop rule whose counts pass loop_cap at the longest of `lengths`."""
    named = [s for s in stops if s is not None and rule_counts(s)]
    if not named:
        return
    cap, longest = loop_cap(task, lengths), max(lengths)
    for stop in named:
        if max(rule_counts(stop)) > cap:
            raise UserError(f"stop rule {stop!r} asks for {max(rule_counts(stop)):,} iterations; this run needs at "
                            f"most {cap:,} ({LOOP_FACTOR} x T(n) + {LOOP_SLACK} at length {longest}, the longest it was "
                            "trained or is evaluated at): give a smaller count, or longer --lengths")


def check_count(name: str, value, cap: int | None = None, why: str = "") -> int:
    """`value` as an int in 1..cap, else a UserError naming `name` (a flag or a keyword): negative,
    zero, fractional, NaN, text and booleans are all refused, each in one line."""
    if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit())):
        raise UserError(f"{name} must be a positive integer, got {value!r}")
    number = int(value)
    if number < 1:
        raise UserError(f"{name} must be a positive integer, got {value!r}")
    if cap is not None and number > cap:
        raise UserError(f"{name} = {number:,} is past what this run could need (at most {cap:,}{why})")
    return number
