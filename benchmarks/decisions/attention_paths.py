"""Decided 2026-11-22: CPU attention is SDPA in fp32 (0.25-0.67x math's time), math in bf16 (SDPA 1.35-10.5x slower).

Causal attention on CPU: torch's SDPA kernel vs `math_causal_attention`
(lengthgen.accel.backends: baddbmm with the mask and scale folded in, float32 softmax), forward
+ backward, fp32 and bf16, at the looped models' shapes. It decided which path attention takes
on CPU (lengthgen.accel.backends, `low_precision_cpu`).

A second table checks the softmax inside the bf16 path: float32 softmax with
the casts to and from bf16 (what `math_causal_attention` does) against a
softmax that takes and returns bf16 (torch's CPU kernel accumulates in float32
either way), forward + backward over the (B * H, T, T) logits.

A third table (--narrow) tries the other ways to compute attention for heads of width 4 (the
looped Parity presets' 16 or 64 heads), fp32, from the (B, T, H, Dh) layout the projection
gives: one batched matmul per product, a broadcast multiply-and-sum with the heads innermost,
and one matmul against block-diagonal keys and values (H times the FLOPs, but dense shapes), and
the C kernel lengthgen takes there (lengthgen/accel/narrow_attention.py; one thread; it decided
that kernel: 2.4-3.2x SDPA's speed at heads of width 4, 2026-11-26).

The paths of each table take turns call by call (benchmarks/common/timing.py): median ms of
forward + backward after 2 warm-up calls each.

    python benchmarks/decisions/attention_paths.py [--repeats 20] [--narrow]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout: lengthgen and benchmarks

from benchmarks.common import records  # noqa: E402
from benchmarks.common.timing import Timings, alternate  # noqa: E402
from lengthgen.accel import narrow_attention  # noqa: E402
from lengthgen.accel.backends import math_causal_attention  # noqa: E402
from lengthgen.runtime.devices import native_bf16  # noqa: E402

SHAPES = {  # (batch, heads, length, head dim)
    "parity paper (64 heads of 4)": (64, 64, 22, 4),
    "addition paper (8 heads of 32)": (64, 8, 62, 32),
    "parity cpu (16 heads of 4)": (64, 16, 14, 4),
    "copy cpu (4 heads of 16)": (64, 4, 21, 16),
}


def fwd_bwd(fn):
    """Forward + backward of `fn` on fresh leaves made from the round's inputs."""
    def call(inputs):
        fn(*[t.detach().requires_grad_() for t in inputs]).sum().backward()
    return call


def paths_ms(paths: dict, inputs: tuple, repeats: int) -> Timings:
    """The paths taking turns on the same inputs: their Timings (seconds)."""
    return alternate({name: fwd_bwd(fn) for name, fn in paths.items()}, repeats, warmup=2, draw=lambda: inputs)


def causal_fill(scores: torch.Tensor, T: int, dims: str) -> torch.Tensor:
    """Scores with keys after their query set to -inf; `dims` says where (query, key) sit."""
    mask = torch.ones(T, T, dtype=torch.bool).triu(1)
    return scores.masked_fill(mask[:, None, :] if dims == "i h j" else mask, float("-inf"))


def batched_matmul(q, k, v):  # (B, T, H, D) each
    B, T, H, D = q.shape
    q, k, v = (x.transpose(1, 2).reshape(B * H, T, D) for x in (q, k, v))
    p = causal_fill(q @ k.transpose(1, 2) * D ** -0.5, T, "i j").softmax(-1)
    return (p @ v).view(B, H, T, D).transpose(1, 2)


def broadcast(q, k, v):
    B, T, H, D = q.shape
    s = (q.reshape(B, T, 1, H * D) * k.reshape(B, 1, T, H * D)).view(B, T, T, H, D).sum(-1) * D ** -0.5
    p = causal_fill(s.transpose(2, 3), T, "i h j").softmax(-1).transpose(2, 3)  # (B, i, j, H)
    return (p.unsqueeze(-1) * v.view(B, 1, T, H, D)).sum(2)


def block_diagonal(q, k, v):
    B, T, H, D = q.shape
    eye = torch.eye(H)
    keys = (k.permute(0, 2, 3, 1)[:, :, :, None, :] * eye[:, None, :, None]).reshape(B, H * D, H * T)
    p = causal_fill((q.reshape(B, T, H * D) * D ** -0.5 @ keys).view(B, T, H, T), T, "i h j").softmax(-1)
    values = (v.permute(0, 2, 1, 3)[:, :, :, None, :] * eye[:, None, :, None]).reshape(B, H * T, H * D)
    return (p.reshape(B, T, H * T) @ values).view(B, T, H, D)


def narrow(repeats: int) -> dict:
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(  # noqa: E731
        *(x.transpose(1, 2) for x in (q, k, v)), is_causal=True).transpose(1, 2)
    kernel = lambda q, k, v: narrow_attention.attend(  # noqa: E731
        *(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2)
    paths = {"sdpa": sdpa, "batched matmul": batched_matmul, "broadcast": broadcast, "block-diagonal": block_diagonal}
    if narrow_attention.library() is not None:
        paths["narrow kernel"] = kernel
    torch.set_num_threads(1)  # as the reproductions run each job; the kernel runs on one thread only
    print("\nheads of width 4, fp32, forward + backward, one thread, median ms (x sdpa)")
    print(f"{'shape':<32} " + " ".join(f"{name:>20}" for name in paths))
    out = {}
    for name, (B, H, T, Dh) in SHAPES.items():
        if Dh > 8:
            continue
        q, k, v = (torch.randn(B, T, H, Dh) for _ in range(3))
        want = sdpa(q, k, v)
        for path, fn in paths.items():
            assert torch.allclose(fn(q, k, v), want, atol=1e-5), path  # the same attention
        timings = paths_ms(paths, (q, k, v), repeats)
        out[name] = timings.as_dict(1000)
        print(f"{name:<32} " + " ".join(f"{1000 * timings.median(p):>11.2f} ({timings.ratio(p, 'sdpa'):>4.1f}x)"
                                        for p in paths))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--narrow", action="store_true", help="only the table of paths for heads of width 4")
    records.add_arguments(p)
    args = p.parse_args()
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.narrow:
        records.write(__file__, args, {"narrow": narrow(args.repeats)}, device="cpu")
        return
    results = {"paths": {}, "softmax": {}}
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    dtypes = [(torch.float32, "fp32"), (torch.bfloat16, "bf16")]
    if not native_bf16(torch.device("cpu")):  # lengthgen refuses bf16 training there: nothing to choose
        dtypes = dtypes[:1]
        print("this CPU has no native bf16: bf16 rows are not measured")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; forward + backward, median ms")
    print(f"{'shape':<32} {'dtype':<6} {'sdpa ms':>8} {'math ms':>8} {'sdpa / math':>11}")
    for name, (B, H, T, Dh) in SHAPES.items():
        for dtype, label in dtypes:
            # (B, T, H, Dh) transposed, as the model's q, k, v views are laid out
            q, k, v = (torch.randn(B, T, H, Dh).transpose(1, 2).to(dtype) for _ in range(3))
            timings = paths_ms({"sdpa": sdpa, "math": math_causal_attention}, (q, k, v), args.repeats)
            results["paths"][f"{name} {label}"] = timings.as_dict(1000)
            a, m = 1000 * timings.median("sdpa"), 1000 * timings.median("math")
            print(f"{name:<32} {label:<6} {a:>8.2f} {m:>8.2f} {a / m:>10.2f}x")
    if len(dtypes) == 1:
        records.write(__file__, args, results, device="cpu")
        return
    f32 = lambda x: torch.softmax(x, dim=-1, dtype=torch.float32).to(x.dtype)  # noqa: E731
    low = lambda x: torch.softmax(x, dim=-1)  # noqa: E731
    print("\nbf16 softmax over (B * H, T, T) logits; forward + backward, median ms")
    print(f"{'shape':<32} {'float32 + casts':>15} {'bf16':>8} {'bf16 / float32':>14}")
    for name, (B, H, T, _) in SHAPES.items():
        x = torch.randn(B * H, T, T).bfloat16()
        timings = paths_ms({"float32 + casts": f32, "bf16": low}, (x,), args.repeats)
        results["softmax"][name] = timings.as_dict(1000)
        a, b = 1000 * timings.median("float32 + casts"), 1000 * timings.median("bf16")
        print(f"{name:<32} {a:>15.2f} {b:>8.2f} {b / a:>13.2f}x")
    records.write(__file__, args, results, device="cpu")


if __name__ == "__main__":
    main()
