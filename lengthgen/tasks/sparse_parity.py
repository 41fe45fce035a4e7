"""Sparse Parity: the XOR of the k bits that k selectors point at (Golowich et al., ICML 2025).

    question "0110+--+="  ->  answer "0"   (bits 1 and 4 are selected: 0 xor 0)

Problem length n = the paper's ℓ: n random bits, then n selector tokens of which
exactly k are '+' (the rest '-'), then "="; the sequence is 2n tokens before "=",
the paper's 2ℓ. The answer depends on exactly k input tokens wherever they are: the
task's sparsity. The paper's format is not public; this one is the project's
(docs/tasks.md).

Options: `k` fixes the number of selected bits (evaluation, swept as k_test);
otherwise every sample draws k uniformly from 1..min(k_max, n) (training on
K_train = k_max). A fixed k larger than a sample's n is an error.

`layout = "pairs"` writes each selector right after its bit ("0-1-1+0+=" for the
example above): the same 2n tokens and the same k-sparse answer, but each bit sits
one token before its selector instead of n tokens, the locality that Golowich et
al.'s theory assumes and position coupling supplies. In the default `blocks` layout,
finding the bit of a selector is itself a lookup at a length-dependent distance.

T(n) = n looped steps.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Batch, Task, end_with, make_batch, prefix_mask, uniform_below


def positive(value, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"sparse_parity: {name} must be an integer >= 1, got {value!r}")
    return value


class SparseParity(Task):
    name = "sparse_parity"
    tokens = ("0", "1", "-", "+", "=")
    answer_symbols = 2
    eos = False  # one answer bit
    example = "0110+--+= -> 0"

    def __init__(self, *, k_max: int = 4, k: int | None = None, layout: str = "blocks"):
        if layout not in ("blocks", "pairs"):
            raise ValueError(f"sparse_parity: layout must be 'blocks' or 'pairs', got {layout!r}")
        self.layout = layout
        self.k_max = positive(k_max, "k_max")
        self.k = None if k is None else positive(k, "k")
        self.min_length = self.k or 1

    def draw_k(self, n: Tensor, generator: torch.Generator) -> Tensor:
        """(B,) selected bits per sample: the fixed k, or uniform over 1..min(k_max, n)."""
        if self.k is None:
            return 1 + uniform_below(n.clamp(max=self.k_max), generator)
        if int(n.min()) < self.k:
            raise ValueError(f"sparse_parity: k = {self.k} selected bits need length >= {self.k}, "
                             f"got {int(n.min())}")
        return torch.full_like(n, self.k)

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, bits = self.random_bits(batch_size, length, generator)  # (B,), (B, W)
        width = bits.shape[1]
        k = self.draw_k(n, generator)
        # exactly k of the first n positions: the k smallest of n uniform keys (padding sorts last)
        keys = torch.randint(0, 2**62, (batch_size, width), generator=generator)  # ties: p < 1e-15
        keys.masked_fill_(~prefix_mask(n, width), 2**62)
        rank = keys.argsort(1).argsort(1)
        selected = (rank < k[:, None]).long()
        answer = (bits * selected).sum(1, keepdim=True) % 2
        bits, selected = bits + self.token_id("0"), selected + self.token_id("-")
        if self.layout == "pairs":  # bit i at column 2i, its selector at 2i + 1
            body = torch.stack([bits, selected], 2).reshape(batch_size, 2 * width)
        else:  # bits[:n], then selectors[:n]: gathered from [bits | selectors] by column
            j = torch.arange(2 * width)[None, :]
            source = torch.where(j < n[:, None], j, j - n[:, None] + width).clamp(max=2 * width - 1)
            body = torch.cat([bits, selected], 1).gather(1, source)
        question = end_with(body, 2 * n, self.token_id("="))
        return make_batch(question, 2 * n + 1, answer + self.token_id("0"), torch.ones_like(n),
                          lengths=n, n_steps=n.clone(), eos=self.eos)
