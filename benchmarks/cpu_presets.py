"""A training step of each family's CPU preset, eager against compiled whole, on a CPU.

The eager path is the trainer's step (lengthgen.training.trainer: the method's loss on the packed
batch, backward, clipping, AdamW). The compiled path is the one a recorded step takes on a GPU
(lengthgen.training.captured), without the CUDA graph: the batch padded to its shape bucket, the
method's fixed-shape loss compiled whole by inductor (lengthgen.model.compiling.compile_step),
backward, clipping and the fused AdamW. Both start from the same weights and take turns on the same
batches, drawn at the preset's longest training length (the length a run spends most of its steps
at once its curriculum ends). Prints per case: ms per step each way, the speed-up, the seconds the
first compiled call took (the compilation of that shape), and whether the two losses agree on the
first batch (same weights, before either updates).

Methods whose loss reads shapes on the host (recurrent models, ntp-pause) or that attend both ways
over padded rows (the Chomsky grid's encoder) have no fixed-shape loss: they show the eager step
alone, as training runs them.

With --profile CASE it prints instead where one eager step of that case spends its time (torch
profiler: the operators by their own time, and how many aten operators the step dispatches).

    python benchmarks/cpu_presets.py [--steps 8] [--threads 1] [--cases looped-parity,ntp-parity]
    python benchmarks/cpu_presets.py --profile looped-parity
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lengthgen import assembly  # noqa: E402
from lengthgen.config.presets import EXPERIMENTS  # noqa: E402
from lengthgen.model.compiling import compiled_whole  # noqa: E402
from lengthgen.training.captured import WIDTH_MULTIPLE, padded, shape_of  # noqa: E402
from lengthgen.training.run_state import RunState  # noqa: E402
from lengthgen.training.trainer import backward, sample_batch, update  # noqa: E402

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
    """One preset's two copies of the same model: `eager()` and `whole()` each take a training step."""

    def __init__(self, preset: str, overrides: list[str], seed: int = 0):
        self.run = assembly.assemble(EXPERIMENTS / f"{preset}.toml", ["train.device=cpu", *overrides])
        cfg, device = self.run.cfg, torch.device("cpu")
        self.eager_state = RunState.start(cfg, self.run.method, self.run.task, device)
        self.fixed = self.run.method.capturable and hasattr(self.eager_state.model, "blocks")
        if self.fixed:
            self.whole_state = RunState.start(cfg, self.run.method, self.run.task, device)
            model = self.whole_state.model
            self.loss = compiled_whole(model, self.run.method.fixed_shape_loss)
            op = cfg.optim
            self.optimizer = torch.optim.AdamW(self.whole_state.optimizer.param_groups, lr=op.lr,
                                               betas=tuple(op.betas), weight_decay=op.weight_decay, fused=True)
        for state in (self.eager_state, *([self.whole_state] if self.fixed else [])):
            state.model.train()
        self.data = torch.Generator().manual_seed(seed)

    def batch(self):
        cfg = self.run.cfg
        n = cfg.task.train_max
        return self.run.transform(sample_batch(self.run.task, cfg.train.batch_size, n, n, self.data, False), self.data)

    def eager(self, batch) -> torch.Tensor:
        state, op = self.eager_state, self.run.cfg.optim
        state.optimizer.zero_grad(set_to_none=True)
        loss = backward(lambda b: self.run.method.loss(state.model, b), [batch], self.run.cfg, 0, range(1),
                        torch.device("cpu"))
        update(state.optimizer, state.model, op.lr, op.grad_clip)
        return loss

    def bucket(self, batch):
        width, iterations, _ = shape_of(self.run.method, batch)
        return padded(batch, -(-width // WIDTH_MULTIPLE) * WIDTH_MULTIPLE), iterations

    def whole(self, batch) -> torch.Tensor:
        model, op = self.whole_state.model, self.run.cfg.optim
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(model, *self.bucket(batch))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), op.grad_clip, foreach=True)
        self.optimizer.step()
        return loss.detach()

    def losses_agree(self, batch) -> str:
        """The eager loss and the compiled fixed-shape loss on the same weights and batch."""
        with torch.no_grad():
            a = float(self.run.method.loss(self.eager_state.model, batch))
            b = float(self.loss(self.eager_state.model, *self.bucket(batch)))
        return f"{'yes' if abs(a - b) <= 1e-4 * max(1.0, abs(a)) else 'NO'} ({a:.5f} / {b:.5f})"


def timed(step, batch) -> float:
    start = time.perf_counter()
    step(batch)
    return time.perf_counter() - start


def measure(name: str, steps: int) -> dict:
    preset, overrides = CASES[name]
    case = Case(preset, overrides)
    batches = [case.batch() for _ in range(steps + 2)]
    row = {"case": name, "preset": preset}
    if not case.fixed:
        for batch in batches[:2]:  # warm-up
            case.eager(batch)
        row["eager ms"] = 1000 * sum(timed(case.eager, b) for b in batches[2:]) / steps
        return row
    row["compile s"] = timed(case.whole, batches[0])  # the training graph of this shape
    row["losses agree"] = case.losses_agree(batches[0])  # the eager copy has not updated yet
    case.eager(batches[0])
    case.eager(batches[1])
    case.whole(batches[1])
    eager = whole = 0.0
    for batch in batches[2:]:  # taking turns on the same batches
        eager += timed(case.eager, batch)
        whole += timed(case.whole, batch)
    row.update({"eager ms": 1000 * eager / steps, "compiled ms": 1000 * whole / steps, "speed-up": eager / whole})
    return row


def profile(name: str) -> None:
    """The operators of one eager step of `name`, by their own time."""
    from torch.profiler import ProfilerActivity, profile as profiled
    case = Case(*CASES[name])
    batches = [case.batch() for _ in range(6)]
    for batch in batches[:2]:
        case.eager(batch)
    step_ms = 1000 * sum(timed(case.eager, b) for b in batches[2:5]) / 3
    with profiled(activities=[ProfilerActivity.CPU]) as prof:
        case.eager(batches[5])
    events = prof.key_averages()
    aten = sum(e.count for e in events if e.key.startswith("aten::"))
    print(f"{name}: {step_ms:.1f} ms a step, {aten} aten operators dispatched")
    print(events.table(sort_by="self_cpu_time_total", row_limit=12))


def table(rows: list[dict]) -> str:
    lines = ["| case | preset | eager ms | compiled ms | speed-up | compile s | losses agree |",
             "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        compiled = (f"{r['compiled ms']:.1f} | {r['speed-up']:.2f}x | {r['compile s']:.0f} | {r['losses agree']}"
                    if "compiled ms" in r else "no fixed-shape loss | | | ")
        lines.append(f"| {r['case']} | {r['preset']} | {r['eager ms']:.1f} | {compiled} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=8, help="timed steps each way, after the warm-up")
    p.add_argument("--threads", type=int, default=1, help="torch threads (a reproduction's --threads)")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    p.add_argument("--profile", metavar="CASE", help="profile one eager step of CASE instead")
    p.add_argument("--cold", action="store_true",
                   help="compile into an empty inductor cache (a fresh machine's compile time); else lengthgen's")
    args = p.parse_args(argv)
    names = [args.profile] if args.profile else [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        p.error(f"unknown case {unknown[0]!r}; one of: {', '.join(CASES)}")
    torch.set_num_threads(args.threads)
    if args.profile:
        profile(args.profile)
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
    print(f"{args.steps} steps each way, {args.threads} thread(s), at each preset's longest training length, {cache}")
    print(table(rows))


if __name__ == "__main__":
    main()
