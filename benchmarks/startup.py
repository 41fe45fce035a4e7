"""A lengthgen process's start: the seconds from launch to a finished `lengthgen eval` of a missing
folder (every module an evaluation loads, then a one-line error), against the same with
torch._dynamo loaded as well, as it was when the model code applied torch.compiler.disable at
import. Every command, analysis script and reproduction worker pays its start once.

Alternating, in one run: the median of each, and their ratio.

    python benchmarks/startup.py [--repeats 7]
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

LENGTHGEN = "from lengthgen.cli import main; main(['eval', '/nonexistent-run'])"
WITH_DYNAMO = "import torch._dynamo; " + LENGTHGEN


def seconds(code: str) -> float:
    began = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if "does not exist" not in done.stderr:
        raise SystemExit(f"startup: unexpected output: {done.stderr.strip()[-300:]}")
    return time.perf_counter() - began


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"needs a positive integer, got {text!r}")
    return int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive, default=7)
    args = parser.parse_args()
    seconds(LENGTHGEN)  # the first start reads the files from disk; the rest from the page cache
    now, before = [], []
    for _ in range(args.repeats):
        now.append(seconds(LENGTHGEN))
        before.append(seconds(WITH_DYNAMO))
    a, b = statistics.median(now), statistics.median(before)
    print(f"start to a one-line error, median of {args.repeats}: {a:.2f} s; with torch._dynamo loaded {b:.2f} s "
          f"({b / a:.2f}x)")


if __name__ == "__main__":
    main()
