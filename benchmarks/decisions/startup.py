"""Decided 2026-11-27: torch._dynamo loads only where a model compiles (a start 3.20 s, 5.62 s with it: 1.75x).

A lengthgen process's start: the seconds from launch to a finished `lengthgen eval` of a missing
folder (every module an evaluation loads, then a one-line error), against the same with
torch._dynamo loaded as well, as it was when the model code applied torch.compiler.disable at
import. Every command, analysis script and reproduction worker pays its start once.

The two take turns (benchmarks/common/timing.py), after one start of each that reads the files
from disk: the median of each, its quartiles, and their ratio.

    python benchmarks/decisions/startup.py [--repeats 7]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: benchmarks.common

from benchmarks.common import records  # noqa: E402
from benchmarks.common.timing import alternate  # noqa: E402

LENGTHGEN = "from lengthgen.cli import main; main(['eval', '/nonexistent-run'])"
WITH_DYNAMO = "import torch._dynamo; " + LENGTHGEN


def start(code: str):
    def run() -> None:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        if "does not exist" not in done.stderr:
            raise SystemExit(f"startup: unexpected output: {done.stderr.strip()[-300:]}")
    return run


def positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"needs a positive integer, got {text!r}")
    return int(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=positive, default=7)
    records.add_arguments(parser)
    args = parser.parse_args()
    timings = alternate({"now": start(LENGTHGEN), "with torch._dynamo": start(WITH_DYNAMO)}, args.repeats, warmup=1)
    a, b = timings["now"], timings["with torch._dynamo"]
    print(f"start to a one-line error, median of {args.repeats}: {a.median:.2f} s (quartiles {a.q1:.2f}-{a.q3:.2f}); "
          f"with torch._dynamo loaded {b.median:.2f} s ({b.q1:.2f}-{b.q3:.2f}; "
          f"{timings.ratio('with torch._dynamo', 'now'):.2f}x)")
    records.write(__file__, args, {"timings": timings.as_dict(), "ratio": timings.ratio("with torch._dynamo", "now")})


if __name__ == "__main__":
    main()
