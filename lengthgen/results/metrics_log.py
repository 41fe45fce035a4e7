"""RUN/metrics.jsonl, the training log: one JSON object per logged step (step, loss, lr,
max_length, samples_per_s, time; tests during training under keys starting with PREFIX), read
back whole or with its damaged lines named."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from lengthgen.errors import UserError

METRICS_LOG = "metrics.jsonl"
PREFIX = "test@"  # keys of tests during training: test@max (the current curriculum maximum), test@24, test@24/confidence:+20


def read_metrics(path: Path, skip_damaged: bool = False) -> list[dict]:
    """The rows of a metrics.jsonl. A run killed mid-write leaves a partial last line: it is dropped
    with a note (resume drops the lines after the checkpoint anyway). A bad line anywhere else means
    the file was damaged by something else: an error naming the line, or with `skip_damaged` (a
    report's curves, which can use the rest) a note naming the file and the lines skipped."""
    try:
        text = Path(path).read_bytes().decode("utf-8", errors="replace")  # bad bytes spoil only their line
    except FileNotFoundError:
        return []
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    rows, bad = [], []
    for number, line in lines:
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if isinstance(row, dict) and isinstance(row.get("step"), int) and isinstance(row.get("time", 0), (int, float)):
            rows.append(row)
        elif number == lines[-1][0] and row is None:
            print(f"lengthgen: note: dropped the unfinished last line {number} of {path}", file=sys.stderr)
        elif skip_damaged:
            bad.append(number)
        else:
            what = "not valid JSON" if row is None else "not a metrics row (an object with an integer step)"
            raise UserError(f"{path} line {number} is {what}")
    if bad:
        print(f"lengthgen: note: skipped {len(bad)} damaged line(s) of {path} (first: line {bad[0]})", file=sys.stderr)
    return rows
