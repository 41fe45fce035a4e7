"""Causal attention on CPU: torch's SDPA kernel vs `math_causal_attention`
(baddbmm with the mask and scale folded in, float32 softmax), forward + backward,
fp32 and bf16, at the looped models' shapes. It decides which path
`lengthgen.model.attention` takes on CPU (`use_math_attention`).

A second table checks the softmax inside the bf16 path: float32 softmax with
the casts to and from bf16 (what `math_causal_attention` does) against a
softmax that takes and returns bf16 (torch's CPU kernel accumulates in float32
either way), forward + backward over the (B * H, T, T) logits.

A third table (--narrow) tries the other ways to compute attention for heads of width 4 (the
looped Parity presets' 16 or 64 heads), fp32, from the (B, T, H, Dh) layout the projection
gives: one batched matmul per product, a broadcast multiply-and-sum with the heads innermost,
and one matmul against block-diagonal keys and values (H times the FLOPs, but dense shapes), and
the C kernel lengthgen takes there (lengthgen/model/narrow_attention.py; one thread).

    python benchmarks/attention_paths.py [--repeats 20] [--narrow]
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from lengthgen.model import narrow_attention
from lengthgen.model.attention import math_causal_attention
from lengthgen.runtime.devices import native_bf16

SHAPES = {  # (batch, heads, length, head dim)
    "parity paper (64 heads of 4)": (64, 64, 22, 4),
    "addition paper (8 heads of 32)": (64, 8, 62, 32),
    "parity cpu (16 heads of 4)": (64, 16, 14, 4),
    "copy cpu (4 heads of 16)": (64, 4, 21, 16),
}


def median_ms(fn, *inputs, repeats: int) -> float:
    """Median milliseconds of forward + backward over `repeats` (after 2 warm-up calls)."""
    times = []
    for _ in range(repeats + 2):
        leaves = [t.detach().requires_grad_() for t in inputs]
        start = time.perf_counter()
        fn(*leaves).sum().backward()
        times.append(time.perf_counter() - start)
    return sorted(times[2:])[repeats // 2] * 1e3


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


def narrow(repeats: int) -> None:
    sdpa = lambda q, k, v: F.scaled_dot_product_attention(  # noqa: E731
        *(x.transpose(1, 2) for x in (q, k, v)), is_causal=True).transpose(1, 2)
    kernel = lambda q, k, v: narrow_attention.attend(*(x.transpose(1, 2) for x in (q, k, v))).transpose(1, 2)  # noqa: E731
    paths = {"sdpa": sdpa, "batched matmul": batched_matmul, "broadcast": broadcast, "block-diagonal": block_diagonal}
    if narrow_attention.library() is not None:
        paths["narrow kernel"] = kernel
    torch.set_num_threads(1)  # as the reproductions run each job; the kernel runs on one thread only
    print("\nheads of width 4, fp32, forward + backward, one thread, median ms (x sdpa)")
    print(f"{'shape':<32} " + " ".join(f"{name:>20}" for name in paths))
    for name, (B, H, T, Dh) in SHAPES.items():
        if Dh > 8:
            continue
        q, k, v = (torch.randn(B, T, H, Dh) for _ in range(3))
        want = sdpa(q, k, v)
        times = {}
        for path, fn in paths.items():
            assert torch.allclose(fn(q, k, v), want, atol=1e-5), path  # the same attention
            times[path] = median_ms(fn, q, k, v, repeats=repeats)
        print(f"{name:<32} " + " ".join(f"{t:>11.2f} ({t / times['sdpa']:>4.1f}x)" for t in times.values()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--narrow", action="store_true", help="only the table of paths for heads of width 4")
    args = p.parse_args()
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.narrow:
        return narrow(args.repeats)
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
            a = median_ms(sdpa, q, k, v, repeats=args.repeats)
            m = median_ms(math_causal_attention, q, k, v, repeats=args.repeats)
            print(f"{name:<32} {label:<6} {a:>8.2f} {m:>8.2f} {a / m:>10.2f}x")
    if len(dtypes) == 1:
        return
    f32 = lambda x: torch.softmax(x, dim=-1, dtype=torch.float32).to(x.dtype)  # noqa: E731
    low = lambda x: torch.softmax(x, dim=-1)  # noqa: E731
    print("\nbf16 softmax over (B * H, T, T) logits; forward + backward, median ms")
    print(f"{'shape':<32} {'float32 + casts':>15} {'bf16':>8} {'bf16 / float32':>14}")
    for name, (B, H, T, _) in SHAPES.items():
        x = torch.randn(B * H, T, T).bfloat16()
        a, b = median_ms(f32, x, repeats=args.repeats), median_ms(low, x, repeats=args.repeats)
        print(f"{name:<32} {a:>15.2f} {b:>8.2f} {b / a:>13.2f}x")


if __name__ == "__main__":
    main()
