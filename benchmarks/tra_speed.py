"""TRA's cost next to the other schemes, on the TRA paper's "mini" model (4 layers, 4 heads,
width 256, RMSNorm, SwiGLU 2x, bias-free, norm-before-add, dropout 0.01).

1. One training step (forward, backward, AdamW) at window 256, batch 64: rope (SDPA), nope,
   alibi, cope and tra take turns for --rounds rounds, so machine noise hits all alike; the
   median step of each and its ratio to RoPE's. Peak memory of one step: each scheme in a
   fresh process (on CPU the growth of the peak resident set over the step, on CUDA
   torch.cuda.max_memory_allocated). Memory is measured in a process whose glibc returns every
   freed block over 1 MiB to the system (MALLOC_MMAP_THRESHOLD_): with the default, freed score
   chunks stayed in the heap and the 16k window's peak read 1.8 GB instead of 0.3 GB.
2. Inference (forward, batch 1) at windows 1k, 4k and 16k: tra with queries in chunks of 512
   against all queries at once; time and peak memory. The unchunked path is skipped where its
   (heads, window, window) float32 score tensor alone would exceed --max-gb.

    python benchmarks/tra_speed.py [--rounds 5] [--batch 64] [--window 256] [--windows 1024,4096,16384]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from lengthgen.config.schema import ModelConfig
from lengthgen.model.transformer import Transformer
from lengthgen.runtime.devices import pick_device

SCHEMES = {"rope": {"theta": 500000.0}, "nope": {}, "alibi": {}, "cope": {"npos_max": 64}, "tra": {}}
VOCAB = 256  # byte-level, as the language-modelling experiment


def mini(position: str, options: dict, dropout: float = 0.01) -> ModelConfig:
    return ModelConfig(d_model=256, n_layer=4, n_head=4, mlp_ratio=2, norm="rmsnorm", mlp="swiglu", bias=False,
                       residual="norm-before-add", attn_dropout=dropout, mlp_dropout=dropout, position=position,
                       position_options=options)


def setup(position: str, batch: int, window: int, device: torch.device, seed: int = 0):
    torch.manual_seed(seed)
    model = Transformer(mini(position, SCHEMES[position]), VOCAB).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    tokens = torch.randint(0, VOCAB, (batch, window + 1), generator=torch.Generator().manual_seed(seed)).to(device)
    return model, optimizer, tokens


def step(model, optimizer, tokens) -> None:
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


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
        model, optimizer, tokens = setup(args.scheme, args.batch, args.window, device)
        print(json.dumps({"bytes": peak_of(lambda: step(model, optimizer, tokens), device)}))
        return
    torch.manual_seed(0)
    options = {"chunk": args.chunk}
    model = Transformer(mini("tra", options, dropout=0.0), VOCAB).to(device).eval()
    tokens = torch.randint(0, VOCAB, (1, args.window), generator=torch.Generator().manual_seed(0)).to(device)

    def forward():
        with torch.no_grad():
            model(tokens)
        sync(device)

    memory = peak_of(forward, device)
    times = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        forward()
        times.append(time.perf_counter() - start)
    print(json.dumps({"bytes": memory, "seconds": sorted(times)[len(times) // 2]}))


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
    args = p.parse_args()
    for key in ("rounds", "batch", "window", "repeats"):
        if getattr(args, key) < 1:
            p.error(f"--{key} must be >= 1")
    if args.chunk < 0:
        p.error("--chunk must be >= 0")
    if args.child:
        child(args)
        return
    device = pick_device(args.device)
    common = ["--device", args.device, "--batch", str(args.batch)]
    print(f"torch {torch.__version__} on {device}, {torch.get_num_threads()} threads")
    print(f"\n1. training step, mini model, window {args.window}, batch {args.batch}, {args.rounds} rounds in turns")
    runs = {name: setup(name, args.batch, args.window, device) for name in SCHEMES}
    times = {name: [] for name in SCHEMES}
    for name in SCHEMES:  # one warm-up step each
        step(*runs[name])
    for _ in range(args.rounds):
        for name in SCHEMES:
            sync(device)
            start = time.perf_counter()
            step(*runs[name])
            sync(device)
            times[name].append(time.perf_counter() - start)
    del runs
    median = {name: sorted(t)[len(t) // 2] for name, t in times.items()}
    print(f"{'scheme':<8} {'median s':>9} {'x rope':>7} {'min..max s':>14} {'peak MB':>9}")
    for name in SCHEMES:
        mem = in_child("--child", "train", "--scheme", name, "--window", str(args.window), *common, for_memory=True)
        peak = f"{mem['bytes'] / 2**20:9.0f}" if "bytes" in mem else f"{mem['error'][:30]:>9}"
        print(f"{name:<8} {median[name]:>9.3f} {median[name] / median['rope']:>6.2f}x "
              f"{min(times[name]):>6.2f}..{max(times[name]):<6.2f} {peak}")
    print(f"\n2. inference, tra, batch 1: queries in chunks of {args.chunk} vs all at once")
    print(f"{'window':>7} {'path':<10} {'seconds':>8} {'peak MB':>9}")
    for window in (int(w) for w in args.windows.split(",")):
        for label, chunk in (("chunked", args.chunk), ("unchunked", 0)):
            scores_gb = 4 * window * window * 4 / 2**30  # (heads, T, T) float32
            if chunk == 0 and scores_gb > args.max_gb:
                print(f"{window:>7} {label:<10} {'skipped':>8}   (its score tensor alone: {scores_gb:.1f} GB)")
                continue
            infer = ("--child", "infer", "--window", str(window), "--chunk", str(chunk), "--device", args.device)
            got = in_child(*infer, "--repeats", str(args.repeats))  # time with the default allocator
            mem = in_child(*infer, "--repeats", "1", for_memory=True) if "error" not in got else got
            if "error" in mem:
                print(f"{window:>7} {label:<10} failed: {mem['error']}")
                continue
            print(f"{window:>7} {label:<10} {got['seconds']:>8.2f} {mem['bytes'] / 2**20:>9.0f}")


if __name__ == "__main__":
    main()
