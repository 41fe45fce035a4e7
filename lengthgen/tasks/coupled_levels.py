"""Multi-level coupled position IDs (Cho et al., ICLR 2025) packed into one ID per token.

Cho et al. give each token of multi-operand addition two coupled IDs (its digit's significance, and
which operand or scratchpad step it belongs to) and each token of multiplication three, read by one
learned table per level whose rows are summed. lengthgen keeps `Batch.position_ids` one (B, L) tensor
for every task, transform and scheme, so the levels travel packed:

    id = level_0 + STRIDE * level_1 + STRIDE**2 * level_2 ...

Each level's IDs stay below STRIDE (a table of that many rows would be far past any run's
max_positions). ID 0 in every level is BOS, EOS and padding, as in Cho et al.'s code, so a packed 0
is 0 in every level. Only what knows the levels unpacks: the task that lays them out,
`random_offset` with `levels` (one start per level) and the `learned` scheme with `levels` (one
table per level).
"""
from __future__ import annotations

import torch
from torch import Tensor

STRIDE = 1 << 12  # IDs of one level stay below it: 4096 ** 3 fits int64 many times over


def pack(levels: list[Tensor]) -> Tensor:
    """One ID per token from the levels' IDs (each (B, L), each below STRIDE)."""
    packed = levels[-1].clone()
    for level in reversed(levels[:-1]):
        packed = packed * STRIDE + level
    return packed


def unpack(ids: Tensor, levels: int) -> list[Tensor]:
    """The `levels` IDs packed in `ids` (same shape each), level 0 first."""
    out = []
    for _ in range(levels):
        out.append(ids % STRIDE)
        ids = ids // STRIDE
    return out


def largest_level_id(ids: Tensor, levels: int) -> int:
    """The largest ID of any level in `ids`: what a table of each level must hold."""
    return max(int(level.max()) for level in unpack(ids, levels)) if ids.numel() else 0


def laid_out(question_len: Tensor, widths: Tensor, question: list[Tensor], answer: list[Tensor], bos: bool) -> Tensor:
    """(B, L) packed IDs over a batch's columns (L = widths.max()): each level's question IDs (B, Q) and
    answer IDs (B, A) placed after a BOS (if any) as the tokens are; 0 at the BOS, the EOS and padding."""
    q = question_len[:, None] - int(bos)
    j = torch.arange(int(widths.max())).expand(len(widths), -1) - int(bos)  # columns counted after the BOS
    in_q, in_a = (j >= 0) & (j < q), (j >= q) & (j < widths[:, None] - int(bos))
    return pack([torch.where(in_q, qi.gather(1, j.clamp(0, qi.shape[1] - 1)),
                             torch.where(in_a, ai.gather(1, (j - q).clamp(0, ai.shape[1] - 1)), 0))
                 for qi, ai in zip(question, answer)])
