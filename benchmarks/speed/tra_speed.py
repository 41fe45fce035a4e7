"""TRA's cost next to the other schemes, on the TRA paper's flip-flop preset
(experiments/tra/paper/flipflop.toml: the "mini" model, 4 layers, 4 heads, width 256, RMSNorm,
SwiGLU 2x, norm-before-add, dropout 0.01 on the logits, the MLP and the embedding).

1. One training step, the trainer's own (Trainer.step: draw, forward, backward, AdamW;
   benchmarks/common/steps.py) at --window tokens a row (flip-flop pairs: --window / 2 of them),
   batch 64: rope (SDPA), nope, alibi, cope and tra take turns on the same batches for --rounds
   rounds (benchmarks/common/timing.py), so machine noise hits all alike; the median step of
   each, its quartiles and its ratio to RoPE's. Peak memory of one step: each scheme in a fresh
   process (on CPU the growth of the peak resident set over the step, on CUDA
   torch.cuda.max_memory_allocated). Memory is measured in a process whose glibc returns every
   freed block over 1 MiB to the system (MALLOC_MMAP_THRESHOLD_): with the default, freed score
   chunks stayed in the heap and the 16k window's peak read 1.8 GB instead of 0.3 GB.
2. Inference (forward, batch 1) of the same model with TRA at windows 1k, 4k and 16k: queries
   in chunks of 512 against all queries at once; time (median of --repeats) and peak memory. The
   unchunked path is skipped where its (heads, window, window) float32 score tensor alone would
   exceed --max-gb.

    python benchmarks/speed/tra_speed.py [--rounds 5] [--batch 64] [--window 256] [--windows 1024,4096,16384]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the checkout: lengthgen and benchmarks

from benchmarks.common import records  # noqa: E402
from benchmarks.common.steps import TrainerStep  # noqa: E402
from benchmarks.common.timing import alternate, time_one  # noqa: E402
from lengthgen.assembly.runs import new_run  # noqa: E402
from lengthgen.runtime.devices import pick_device  # noqa: E402

FLIPFLOP = ROOT / "experiments/tra/paper/flipflop.toml"
SCHEMES = {"rope": "{theta = 500000.0}", "nope": "{}", "alibi": "{}", "cope": "{npos_max = 64}", "tra": "{}"}


def setup(position: str, batch: int, window: int, device: torch.device) -> TrainerStep:
    """The preset's training step with `position`, every row `window` tokens long."""
    run = new_run(FLIPFLOP, [f"model.position={position}", f"model.position_options={SCHEMES[position]}",
                             f"task.train_min={window // 2}", f"task.train_max={window // 2}",
                             f"train.batch_size={batch}", f"train.device={device.type}"])
    return TrainerStep(run, device, capture=False, compile=False)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def resident() -> tuple[int, int]:
    """(current, peak) resident set in bytes (Linux /proc)."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024


def peak_of(run, device: torch.device) -> int:
    """Bytes the call `run()` adds at its peak: CUDA's allocator peak, or on CPU the growth of
    the peak resident set (reset first: /proc/self/clear_refs)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        run()
        return torch.cuda.max_memory_allocated(device) - before
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident set restarts from the current one
    before, _ = resident()
    run()
    return resident()[1] - before


def child(args) -> None:
    """One measurement in this fresh process, printed as JSON: a training step's peak memory,
    or an inference pass's time and peak memory."""
    device = pick_device(args.device)
    if args.child == "train":
        step = setup(args.scheme, args.batch, args.window, device)
        batches = step.batches()
        print(json.dumps({"bytes": peak_of(lambda: step(batches), device)}))
        return
    run = new_run(FLIPFLOP, ["model.position=tra", f"model.position_options={{chunk = {args.chunk}}}",
                             f"train.device={device.type}"])
    torch.manual_seed(0)
    model = run.method.build_model(run.cfg, run.task).to(device).eval()
    tokens = torch.randint(0, run.task.vocab_size, (1, args.window), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(device)

    def forward():
        with torch.no_grad():
            model(tokens)
        sync(device)

    memory = peak_of(forward, device)  # also the warm-up of the timed passes
    print(json.dumps({"bytes": memory, "seconds": time_one(forward, args.repeats, warmup=0).median}))


def in_child(*args: str, for_memory: bool = False) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(2 ** 20)} if for_memory else None
    out = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5, help="training steps per scheme, taken in turns")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--windows", default="1024,4096,16384", help="inference windows")
    p.add_argument("--chunk", type=int, default=512, help="queries per pass of the chunked path")
    p.add_argument("--repeats", type=int, default=3, help="inference passes per window (median)")
    p.add_argument("--max-gb", type=float, default=2.0, help="skip unchunked windows whose score tensor exceeds this")
    p.add_argument("--device", default="auto")
    p.add_argument("--child", choices=("train", "infer"), help=argparse.SUPPRESS)
    p.add_argument("--scheme", default="rope", help=argparse.SUPPRESS)
    records.add_arguments(p)
    args = p.parse_args()
    for key in ("rounds", "batch", "window", "repeats"):
        if getattr(args, key) < 1:
            p.error(f"--{key} must be >= 1")
    if args.window % 2:
        p.error("--window must be even: flip-flop rows are (instruction, bit) pairs")
    if args.chunk < 0:
        p.error("--chunk must be >= 0")
    if args.child:
        child(args)
        return
    device = pick_device(args.device)
    common = ["--device", args.device, "--batch", str(args.batch)]
    results = {"train": {}, "infer": {}}
    print(f"torch {torch.__version__} on {device}, {torch.get_num_threads()} threads")
    print(f"\n1. training step, flip-flop mini model, window {args.window}, batch {args.batch}, "
          f"{args.rounds} rounds in turns")
    steps = {name: setup(name, args.batch, args.window, device) for name in SCHEMES}
    timings = alternate(steps, args.rounds, warmup=1, draw=steps["rope"].batches, sync=lambda: sync(device))
    del steps
    print(f"{'scheme':<8} {'median s':>9} {'x rope':>7} {'quartiles s':>13} {'min..max s':>14} {'peak MB':>9}")
    for name in SCHEMES:
        mem = in_child("--child", "train", "--scheme", name, "--window", str(args.window), *common, for_memory=True)
        peak = f"{mem['bytes'] / 2**20:9.0f}" if "bytes" in mem else f"{mem['error'][:30]:>9}"
        t = timings[name]
        print(f"{name:<8} {t.median:>9.3f} {timings.ratio(name, 'rope'):>6.2f}x {t.q1:>6.2f}..{t.q3:<6.2f} "
              f"{t.min:>6.2f}..{t.max:<6.2f} {peak}")
        results["train"][name] = {**t.as_dict(), "x_rope": timings.ratio(name, "rope"), "peak_bytes": mem.get("bytes"),
                                  "paired_x_rope": timings.paired(name, "rope").median}
    print(f"\n2. inference, tra, batch 1: queries in chunks of {args.chunk} vs all at once")
    print(f"{'window':>7} {'path':<10} {'seconds':>8} {'peak MB':>9}")
    for window in (int(w) for w in args.windows.split(",")):
        for label, chunk in (("chunked", args.chunk), ("unchunked", 0)):
            scores_gb = 4 * window * window * 4 / 2**30  # (heads, T, T) float32
            key = f"{window} {label}"
            if chunk == 0 and scores_gb > args.max_gb:
                print(f"{window:>7} {label:<10} {'skipped':>8}   (its score tensor alone: {scores_gb:.1f} GB)")
                results["infer"][key] = {"skipped": f"score tensor {scores_gb:.1f} GB"}
                continue
            infer = ("--child", "infer", "--window", str(window), "--chunk", str(chunk), "--device", args.device)
            got = in_child(*infer, "--repeats", str(args.repeats))  # time with the default allocator
            mem = in_child(*infer, "--repeats", "1", for_memory=True) if "error" not in got else got
            if "error" in mem:
                print(f"{window:>7} {label:<10} failed: {mem['error']}")
                results["infer"][key] = mem
                continue
            print(f"{window:>7} {label:<10} {got['seconds']:>8.2f} {mem['bytes'] / 2**20:>9.0f}")
            results["infer"][key] = {"seconds": got["seconds"], "peak_bytes": mem["bytes"]}
    records.write(__file__, args, results, device=str(device))


if __name__ == "__main__":
    main()
