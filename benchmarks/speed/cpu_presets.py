"""A training step of each family's CPU preset: the path before, the trainer's eager step and the
step compiled whole, on a CPU.

The eager path is the trainer's step (Trainer.step, lengthgen.training.trainer: the method's loss on
the packed batch, backward, clipping, AdamW; benchmarks/common/steps.py), with the blocks' linear
layers on oneDNN where this machine takes them (lengthgen.accel.onednn_linear). The path before is
the same step with torch's own matmul (`aten`: MKL), timed only where the oneDNN path is on. The
compiled path is the
trainer's step taking the body of a recorded step (lengthgen.accel.captured) where it would replay a
CUDA graph: the batch padded to its shape bucket, the method's fixed-shape loss compiled whole by
inductor (lengthgen.accel.compiling.compile_step), backward, clipping and the fused AdamW. Both start
from the same weights and take turns on the same batches (benchmarks/common/timing.py), drawn at the
preset's longest training length (the length a run spends most of its steps at once its curriculum
ends). Prints per case: ms per step each way (median), the speed-ups over the path before (or over
eager where the oneDNN path is off), the seconds the first compiled call took (the compilation of
that shape), and whether the losses agree on the first batch (same weights, before any updates).

Methods whose loss reads shapes on the host (recurrent models, ntp-pause) or that attend both ways
over padded rows (the Chomsky grid's encoder) have no fixed-shape loss: they show the eager step
alone, as training runs them.

With --profile CASE it prints instead where one eager step of that case spends its time (torch
profiler: the operators by their own time, and how many aten operators the step dispatches).

With --authors PATH (the folder benchmarks/authors/looped_tf.py describes: looped-tf/src and its
dependency folder) it also times the looped Parity and Addition paper steps against the authors'
released step, in this process, taking turns: lengthgen's is the trainer's eager step of
looped/paper/<task> at the curriculum's end, theirs the body of their training loop at their final
curriculum length (the same longest length), each drawing its own batch of lengths mixed from 1,
as each loop does. --threads sets both sides' torch threads.

    python benchmarks/speed/cpu_presets.py [--steps 8] [--threads 1] [--cases looped-parity,ntp-parity]
    python benchmarks/speed/cpu_presets.py --profile looped-parity
    python benchmarks/speed/cpu_presets.py --cases '' --authors .authors --steps 6 [--threads 2]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: lengthgen and benchmarks

from benchmarks.common import records  # noqa: E402
from benchmarks.common.steps import TrainerStep, UnrecordedSteps  # noqa: E402
from benchmarks.common.timing import alternate, time_one  # noqa: E402
from lengthgen.accel import onednn_linear  # noqa: E402
from lengthgen.assembly.runs import new_run  # noqa: E402

CASES = {  # one preset per family (and the next-token baseline the looped grid compares against)
    "looped-parity": ("looped/cpu/parity", []),
    "ntp-parity": ("core/parity-ntp", []),
    "tra-flipflop": ("tra/cpu/flipflop", ["model.position=tra"]),
    "rope-flipflop": ("tra/cpu/flipflop", ["model.position=rope"]),
    "sparse-parity": ("sparsity/cpu/sparse_parity", []),
    "coupled-addition": ("sparsity/cpu/addition", []),
    "chomsky-encoder": ("chomsky/cpu/parity_check", []),
    "chomsky-stack-rnn": ("chomsky/cpu/reverse_string", ["method=stack-rnn", "model.causal=true", "model.d_model=256"]),
}


class Case:
    """One preset's two copies of the same model, each a TrainerStep: `eager(batch)` and
    `whole(batch)` each take a training step. `compile` False: the fixed-shape loss uncompiled
    (what a test compares, compiling nothing)."""

    def __init__(self, preset: str, overrides: list[str], compile: bool = True):
        run = new_run(preset, ["train.device=cpu", *overrides])
        self.run, device = run, torch.device("cpu")
        self.eager = TrainerStep(run, device, capture=False, compile=False)
        self.eager_state = self.eager.state
        self.before = without_onednn(TrainerStep(run, device, capture=False, compile=False)) \
            if onednn_linear.enabled else None
        self.fixed = run.method.capturable and hasattr(self.eager_state.model, "blocks")
        if self.fixed:
            self.whole = TrainerStep(run, device, capture=False, compile=False)
            self.whole_state, op = self.whole.state, run.cfg.optim
            # the fused AdamW: one kernel per list of tensors, as a recorded step's optimizer runs
            optimizer = torch.optim.AdamW(self.whole_state.optimizer.param_groups, lr=op.lr,
                                          betas=tuple(op.betas), weight_decay=op.weight_decay, fused=True)
            self.steps = UnrecordedSteps(run.method, self.whole_state.model, optimizer, op.grad_clip,
                                         run.cfg.train.precision, device, compile)
            self.whole.replay_with(self.steps)

    def batch(self):
        """A batch at the preset's longest training length, from the eager copy's data stream."""
        return self.eager.batches(self.run.cfg.task.train_max)

    def losses_agree(self, batch) -> str:
        """The eager loss and the compiled fixed-shape loss on the same weights and batch."""
        loss = self.steps.whole or self.run.method.fixed_shape_loss
        with torch.no_grad():
            a = float(self.run.method.loss(self.eager_state.model, batch[0]))
            b = float(loss(self.eager_state.model, *self.steps.bucket(batch[0])))
        return f"{'yes' if abs(a - b) <= 1e-4 * max(1.0, abs(a)) else 'NO'} ({a:.5f} / {b:.5f})"


def without_onednn(step):
    """`step`, taken with torch's own matmul for the linear layers (the path before oneDNN's)."""
    def call(*args):
        before, onednn_linear.enabled = onednn_linear.enabled, False
        try:
            return step(*args)
        finally:
            onednn_linear.enabled = before
    return call


def timed(step, batch) -> float:
    """Seconds of one call: the first compiled step, whose time is its shape's compilation."""
    start = time.perf_counter()
    step(batch)
    return time.perf_counter() - start


def measure(name: str, steps: int) -> dict:
    preset, overrides = CASES[name]
    case = Case(preset, overrides)
    row = {"case": name, "preset": preset}
    variants = {"aten": case.before} if case.before else {}
    variants["eager"] = case.eager
    base = next(iter(variants))  # the speed-ups are over the path before, where it is timed
    if case.fixed:
        first = case.batch()
        row["compile s"] = timed(case.whole, first)  # the training graph of this shape
        row["losses agree"] = case.losses_agree(first)  # the eager copies have not updated yet
        for step in variants.values():
            step(first)
        variants["compiled"] = case.whole
        if not case.whole.recorded:  # the body failed and the trainer went eager: say so, not a speed-up
            row["note"] = "the compiled step failed (the note above): both ran eagerly"
    timings = alternate(variants, steps, warmup=1 if case.fixed else 2, draw=case.batch)
    for name in variants:
        row[f"{name} ms"] = 1000 * timings.median(name)
        if name != base:
            row[f"{name} speed-up"] = timings.ratio(base, name)
    row["timings"] = timings.as_dict(1000)
    return row


def profile(name: str) -> dict:
    """The operators of one eager step of `name`, by their own time; printed, and returned for the record."""
    from torch.profiler import ProfilerActivity, profile as profiled
    case = Case(*CASES[name])
    step_ms = 1000 * time_one(case.eager, 3, warmup=2, draw=case.batch).median
    with profiled(activities=[ProfilerActivity.CPU]) as prof:
        case.eager(case.batch())
    events = prof.key_averages()
    aten = sum(e.count for e in events if e.key.startswith("aten::"))
    print(f"{name}: {step_ms:.1f} ms a step, {aten} aten operators dispatched")
    print(events.table(sort_by="self_cpu_time_total", row_limit=12))
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]
    return {"profile": name, "step_ms": step_ms, "aten_operators": aten,
            "self_ms": {e.key: e.self_cpu_time_total / 1000 for e in top}}


PAPER = {"parity": "looped/paper/parity", "addition": "looped/paper/addition"}


def against_authors(folder: str, steps: int) -> list[dict]:
    """lengthgen's looped paper steps against the authors', taking turns (see the docstring above)."""
    from benchmarks.authors.looped_tf import authors_available, authors_training
    path = Path(folder) / "looped-tf"
    why = authors_available(path, isolated=False)
    if why:
        return [{"task": task, "note": f"authors' step not run: {why}"} for task in PAPER]
    rows = []
    for task, preset in PAPER.items():
        run = new_run(preset, ["train.device=cpu"])
        ours = TrainerStep(run, torch.device("cpu"), capture=False, compile=False)
        with authors_training(path, task, "cpu", length=run.cfg.task.train_max) as (theirs, _, _, info):
            timings = alternate({"lengthgen": lambda: ours(), "authors": lambda: theirs()}, steps, warmup=2)
        rows.append({"task": task, "preset": preset, "length": run.cfg.task.train_max, "authors": info,
                     "lengthgen ms": 1000 * timings.median("lengthgen"), "authors ms": 1000 * timings.median("authors"),
                     "speed-up": timings.ratio("authors", "lengthgen"), "timings": timings.as_dict(1000)})
        print(f"{task} paper step against the authors': done", file=sys.stderr, flush=True)
    return rows


def authors_table(rows: list[dict], threads: int) -> str:
    lines = [f"| paper step ({threads} thread(s)) | longest length | lengthgen ms | authors' ms | speed-up |",
             "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['task']} | {r.get('length', '')} | " + (
            f"{r['lengthgen ms']:.0f} | {r['authors ms']:.0f} | {r['speed-up']:.2f}x |" if "speed-up" in r
            else f" | | {r['note']} |"))
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    """One line per case; the median speed-ups over the cases below (the issue's measure)."""
    lines = ["| case | preset | aten ms | eager ms | eager speed-up | compiled ms | compiled speed-up | compile s "
             "| losses agree |", "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        aten = (f"{r['aten ms']:.1f} | {r['eager ms']:.1f} | {r['eager speed-up']:.2f}x" if "aten ms" in r
                else f"(oneDNN off) | {r['eager ms']:.1f} | ")
        compiled = (f"{r['compiled ms']:.1f} | {r['compiled speed-up']:.2f}x | {r['compile s']:.0f} | "
                    f"{r['losses agree']}" if "compiled ms" in r else "no fixed-shape loss | | | ")
        note = f" {r['note']}" if "note" in r else ""
        lines.append(f"| {r['case']} | {r['preset']} | {aten} | {compiled} |{note}")
    medians = [f"median {name} speed-up over {len(ups)} case(s): {statistics.median(ups):.2f}x "
               f"({min(ups):.2f}x to {max(ups):.2f}x)" for name in ("eager", "compiled")
               if (ups := [r[f"{name} speed-up"] for r in rows if f"{name} speed-up" in r])]
    lines += [""] + medians if medians else []
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8, help="timed steps each way, after the warm-up")
    p.add_argument("--threads", type=int, default=1, help="torch threads (a reproduction's --threads)")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    p.add_argument("--profile", metavar="CASE", help="profile one eager step of CASE instead")
    p.add_argument("--authors", metavar="PATH", help="also time the looped paper steps against the authors' "
                   "released step (PATH holds looped-tf: benchmarks/authors/looped_tf.py)")
    p.add_argument("--cold", action="store_true",
                   help="compile into an empty inductor cache (a fresh machine's compile time); else lengthgen's")
    records.add_arguments(p)
    args = p.parse_args(argv)
    names = [args.profile] if args.profile else [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        p.error(f"unknown case {unknown[0]!r}; one of: {', '.join(CASES)}")
    torch.set_num_threads(args.threads)
    if args.profile:
        records.write(__file__, args, profile(args.profile), device="cpu")
        return
    if args.cold:  # set before anything compiles: inductor pins its cache folder on first use
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="lengthgen-cold-inductor-")
    rows = []
    try:
        for name in names:
            rows.append(measure(name, args.steps))
            print(f"{name}: done", file=sys.stderr, flush=True)
    finally:
        if args.cold:  # hundreds of MB of kernels no later run will read
            shutil.rmtree(os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)
    cache = "an empty inductor cache" if args.cold else "the inductor cache as it was"
    results = {"rows": rows}
    if rows:
        print(f"{args.steps} steps each way, {args.threads} thread(s), at each preset's longest training length, {cache}")
        print(table(rows))
    if args.authors:
        results["authors"] = against_authors(args.authors, args.steps)
        print(authors_table(results["authors"], args.threads))
    records.write(__file__, args, results, device="cpu")


if __name__ == "__main__":
    main()
