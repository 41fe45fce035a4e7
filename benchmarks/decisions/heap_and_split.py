"""Decided 2026-12-08: a CPU training process keeps glibc's heap (paper step 1.03-1.21x), and the narrow-head kernel splits its batch on torch's OpenMP threads.

`--heap`: a training step at its preset's longest training length (the looped Parity paper step, and
with --cases each CPU preset of benchmarks/speed/cpu_presets.py), in two worker processes started the
same way, one with LENGTHGEN_KEEP_HEAP=0 (glibc's default thresholds) and one keeping the heap
(lengthgen.accel.heap, which the trainer's start sets). Each draws the same batches from the same
seed; they take turns, one step each, and each reports its step's seconds, minor page faults and
system time (getrusage).

`--eval RUN`: RUN's evaluation as a reproduction evaluates a looped run (lengths 1-24, 512 samples,
the oracle and both confidence rules, per_step), one thread, in fresh processes taking turns with
and without the heap kept (make demo's looped run: runs/demo/runs/parity-looped-s0); seconds,
user and system time, minor page faults.

`--split`: the narrow-head kernel's forward at the paper's shape (64 rows, 64 heads of width 4,
23 tokens) on 2 torch threads, each call right after one of torch's parallel operators: on one
thread, split over a Python thread pool (ctypes lets go of the GIL; the way before), and split on
OpenMP's threads inside the kernel (the way now). Once with OpenMP's waiting threads spinning
(OMP_WAIT_POLICY=ACTIVE) and once sleeping (PASSIVE, what lengthgen sets on import), each in a
fresh process.

    python benchmarks/decisions/heap_and_split.py [--heap] [--split] [--steps 8] [--threads 1,2] [--cases all]
    python benchmarks/decisions/heap_and_split.py --eval runs/demo/runs/parity-looped-s0 [--steps 2]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout: lengthgen and benchmarks

from benchmarks.common import records  # noqa: E402


def heap_worker(threads: int, case: str) -> None:
    """Takes a step whenever a line comes in; answers with its seconds, page faults and system time."""
    import resource

    import torch
    from benchmarks.common.steps import TrainerStep
    from benchmarks.speed.cpu_presets import CASES
    from lengthgen.assembly.runs import new_run
    torch.set_num_threads(threads)
    preset, overrides = CASES.get(case, ("looped/paper/parity", []))
    run = new_run(preset, ["train.device=cpu", *overrides])
    step, length = TrainerStep(run, "cpu", capture=False, compile=False), run.cfg.task.train_max
    print("ready", flush=True)
    for _ in sys.stdin:
        batch = step.batches(length)
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        step(batch)
        seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
        print(json.dumps([seconds, after.ru_minflt - before.ru_minflt, after.ru_stime - before.ru_stime]), flush=True)


def heap(threads: int, steps: int, case: str = "looped-parity-paper") -> dict:
    ways = {"default": "0", "kept": "1"}
    workers = {}
    for way, keep in ways.items():
        env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
        workers[way] = subprocess.Popen([sys.executable, __file__, "--heap-worker", str(threads), case],
                                        env={**env, "LENGTHGEN_KEEP_HEAP": keep}, stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
    for w in workers.values():
        assert w.stdout.readline().strip() == "ready"
    samples = {way: [] for way in ways}
    for i in range(steps + 2):  # two warm-up steps each
        for way in (ways if i % 2 else reversed(list(ways))):
            workers[way].stdin.write("\n")
            workers[way].stdin.flush()
            sample = json.loads(workers[way].stdout.readline())
            if i >= 2:
                samples[way].append(sample)
    for w in workers.values():
        w.stdin.close()
        w.wait()
    row = {"case": case, "threads": threads}
    for way, got in samples.items():
        row[f"{way} ms"] = 1000 * statistics.median(s[0] for s in got)
        row[f"{way} faults"] = statistics.median(s[1] for s in got)
        row[f"{way} system ms"] = 1000 * statistics.median(s[2] for s in got)
    row["speed-up"] = row["default ms"] / row["kept ms"]
    return row


def eval_worker(run: str) -> None:
    """One evaluation of `run` into a scratch folder; prints its seconds and getrusage's counts as JSON."""
    import resource
    import tempfile

    import lengthgen  # noqa: F401  (the wait policy, before torch loads OpenMP)
    import torch
    from lengthgen.evaluation.evaluate import evaluate_run
    from lengthgen.evaluation.settings import EvalSettings
    torch.set_num_threads(1)
    settings = EvalSettings(lengths=list(range(1, 25)), samples=512, per_step=True, progress=False,
                            stops=["oracle", "confidence", "confidence-per-sample"], out=Path(tempfile.mkdtemp()) / "eval")
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    evaluate_run(Path(run), settings)
    seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({"s": seconds, "user s": after.ru_utime - before.ru_utime, "system s": after.ru_stime - before.ru_stime,
                      "faults": after.ru_minflt - before.ru_minflt}))


def evaluation(run: str, rounds: int) -> list[dict]:
    rows = []
    for i in range(rounds):
        for keep in (("0", "1") if i % 2 == 0 else ("1", "0")):
            env = {**{k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}, "LENGTHGEN_KEEP_HEAP": keep}
            out = subprocess.run([sys.executable, __file__, "--eval-worker", run], env=env, capture_output=True,
                                 text=True, check=True)
            rows.append({"heap": "kept" if keep == "1" else "default", **json.loads(out.stdout.strip().splitlines()[-1])})
    return rows


def split_worker() -> None:
    """One process's --split table row, printed as JSON (OMP_WAIT_POLICY as the environment set it)."""
    import lengthgen  # noqa: F401  (the wait policy, before torch loads OpenMP)
    import torch
    from concurrent.futures import ThreadPoolExecutor
    from lengthgen.accel import narrow_attention as na
    from benchmarks.common.timing import alternate
    torch.set_num_threads(2)
    B, H, T, D = 64, 64, 23, 4
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))
    o, lse, parallel_op = q.new_empty(B, T, H, D), q.new_empty(B, T, H), torch.randn(4_000_000)
    qs, ks, vs, lib, pool = na.strides(q), na.strides(k), na.strides(v), na.library(), ThreadPoolExecutor(1)
    if lib is None:
        sys.exit("the narrow-head kernel could not be built here (the line above says why)")

    def at(x, b):
        return x.data_ptr() + b * x.stride(0) * x.element_size()

    def rows(b0, b1, threads):
        return lib.narrow_forward(at(q, b0), qs, at(k, b0), ks, at(v, b0), vs, at(o, b0), at(lse, b0), b1 - b0,
                                  T, H, D, D ** -0.5, threads)

    def after_an_openmp_operator(call):
        def timed():
            parallel_op.mul_(1.0)
            start = time.perf_counter()
            call()
            return time.perf_counter() - start
        return timed

    def python_pool():
        other = pool.submit(rows, B // 2, B, 1)
        rows(0, B // 2, 1)
        other.result()

    ways = {"one thread": lambda: rows(0, B, 1), "Python pool split": python_pool, "OpenMP split": lambda: rows(0, B, 2)}
    timings = alternate({name: after_an_openmp_operator(call) for name, call in ways.items()}, 60, 5,
                        returns_seconds=True)
    print(json.dumps({name: 1000 * timings.median(name) for name in ways}))


def split(policy: str) -> dict:
    env = {**os.environ, "OMP_WAIT_POLICY": policy}
    out = subprocess.run([sys.executable, __file__, "--split-worker"], env=env, capture_output=True, text=True, check=True)
    return {"OMP_WAIT_POLICY": policy, **json.loads(out.stdout.strip().splitlines()[-1])}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--heap", action="store_true", help="glibc's default heap against the kept one (default: both parts)")
    p.add_argument("--split", action="store_true", help="the narrow-head kernel's split, three ways")
    p.add_argument("--eval", metavar="RUN", help="a looped run's evaluation with and without the heap kept")
    p.add_argument("--steps", type=int, default=8, help="--heap: timed steps each way, after 2 warm-up steps; "
                   "--eval: evaluations each way")
    p.add_argument("--threads", default="1,2", help="--heap: torch thread counts of the paper step, comma-separated "
                   "('': none)")
    p.add_argument("--cases", default="", help="--heap: CPU presets of benchmarks/speed/cpu_presets.py too, "
                   "comma-separated, or 'all' (one thread each)")
    records.add_arguments(p)
    if argv is None and sys.argv[1:2] == ["--heap-worker"]:
        return heap_worker(int(sys.argv[2]), sys.argv[3])
    if argv is None and sys.argv[1:2] == ["--split-worker"]:
        return split_worker()
    if argv is None and sys.argv[1:2] == ["--eval-worker"]:
        return eval_worker(sys.argv[2])
    args = p.parse_args(argv)
    both = not (args.heap or args.split or args.eval)
    results = {}
    if args.eval:
        if not (Path(args.eval) / "eval.csv").is_file():
            p.error(f"--eval {args.eval}: not a finished, evaluated run (make demo trains one)")
        results["eval"] = evaluation(args.eval, args.steps)
        print("| heap | seconds | user s | system s | minor faults |")
        print("|---|---:|---:|---:|---:|")
        for r in results["eval"]:
            print(f"| {r['heap']} | {r['s']:.1f} | {r['user s']:.1f} | {r['system s']:.2f} | {r['faults']:,} |")
    if args.heap or both:
        from benchmarks.speed.cpu_presets import CASES
        cases = list(CASES) if args.cases == "all" else [c for c in args.cases.split(",") if c]
        if set(cases) - set(CASES):
            p.error(f"unknown case {sorted(set(cases) - set(CASES))[0]!r}; one of: {', '.join(CASES)}")
        results["heap"] = [heap(int(t), args.steps) for t in args.threads.split(",") if t]
        results["heap"] += [heap(1, args.steps, case) for case in cases]
        print("| case | threads | glibc's default ms | heap kept ms | speed-up | minor faults a step | system ms a step |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for r in results["heap"]:
            print(f"| {r['case']} | {r['threads']} | {r['default ms']:.1f} | {r['kept ms']:.1f} | {r['speed-up']:.2f}x | "
                  f"{r['default faults']:,.0f} → {r['kept faults']:,.0f} | {r['default system ms']:.1f} → {r['kept system ms']:.1f} |")
        if cases:
            ups = sorted(r["speed-up"] for r in results["heap"][-len(cases):])
            print(f"\nmedian over {len(cases)} CPU preset(s): {statistics.median(ups):.2f}x ({ups[0]:.2f}x to {ups[-1]:.2f}x)")
    if args.split or both:
        results["split"] = [split(policy) for policy in ("ACTIVE", "PASSIVE")]
        print("| OpenMP's waiting threads | one thread ms | Python pool split ms | OpenMP split ms |")
        print("|---|---:|---:|---:|")
        for r in results["split"]:
            print(f"| {r['OMP_WAIT_POLICY']} | {r['one thread']:.2f} | {r['Python pool split']:.2f} | {r['OpenMP split']:.2f} |")
    records.write(__file__, args, results, device="cpu")


if __name__ == "__main__":
    main()
