"""Causal attention on CPU: torch's SDPA kernel vs `math_causal_attention`
(baddbmm with the mask and scale folded in, float32 softmax), forward + backward,
fp32 and bf16, at the looped models' shapes. It decides which path
`lengthgen.model.attention` takes on CPU (`use_math_attention`).

A second table checks the softmax inside the bf16 path: float32 softmax with
the casts to and from bf16 (what `math_causal_attention` does) against a
softmax that takes and returns bf16 (torch's CPU kernel accumulates in float32
either way), forward + backward over the (B * H, T, T) logits.

    python benchmarks/attention_paths.py [--repeats 20]
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    if args.repeats < 1:
        p.error(f"--repeats must be >= 1, got {args.repeats}")
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
