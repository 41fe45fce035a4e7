"""Selective copy (Gu & Dao's Mamba, 2023) as the CoPE paper tests it (Golovneva et al., 2024).

    question "c..ab.="  ->  answer "cab"

The question is n content symbols over `symbols` letters (option, default 16) with m blank
tokens "." scattered among them, then "="; the answer is the n symbols in order, blanks
dropped. m = blank_ratio * n rounded half up (option `blank_ratio`, default 1.0: as many blanks
as symbols, the paper's in-distribution 128 / 128). The symbols are uniform and independent,
the m blank places a uniform subset of the n + m. The problem length is the number of symbols
to copy; the paper's out-of-distribution tests keep it and change the density: dense, 64 blanks
for 128 symbols (blank_ratio 0.5), and sparse, 256 (2.0), which evaluation reads by sweeping the
option (`eval.sweep = {blank_ratio = [1.0, 0.5, 2.0]}`), as flip-flop's p_ignore. The paper
releases no code for this task: the format is the project's (docs/tasks.md).

T(n) = n looped steps (one per symbol copied).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from .base import Batch, Task, end_with, make_batch, prefix_mask
from .copy_symbols import letters

BLANK_TOKEN = "."  # not "_": that is BLANK, what whole-answer methods put in the answer's place


# The CoPE paper's sequences hold 0.5 to 2 blanks per symbol; a ratio past 100 makes every sample
# 100x its length in blanks, which no memory bound of the batch foresees
MAX_BLANK_RATIO = 100.0


class SelectiveCopy(Task):
    name = "selective_copy"
    tokens = letters(16, name) + (BLANK_TOKEN, "=")  # the default; __init__ sets its own
    answer_symbols = 16
    eos = False  # the question fixes the answer length: its n symbols
    example = "c..ab.= -> cab"

    def __init__(self, *, symbols: int = 16, blank_ratio: float = 1.0):
        if isinstance(blank_ratio, bool) or not isinstance(blank_ratio, (int, float)) \
                or not math.isfinite(blank_ratio) or not 0 <= blank_ratio <= MAX_BLANK_RATIO:
            raise ValueError(f"selective_copy: blank_ratio (blanks per symbol) must be a number in "
                             f"[0, {MAX_BLANK_RATIO:g}], got {blank_ratio!r}")
        self.tokens = letters(symbols, self.name) + (BLANK_TOKEN, "=")
        self.answer_symbols = symbols
        self.blank_ratio = float(blank_ratio)

    def blanks(self, n: Tensor) -> Tensor:
        """(B,) blank tokens among a sample's n symbols: blank_ratio * n, rounded half up."""
        return torch.floor(self.blank_ratio * n.double() + 0.5).long()

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, width = self.lengths_of(batch_size, length)
        total = n + self.blanks(n)  # tokens before "="
        span = int(total.max())
        symbols = torch.randint(0, self.answer_symbols, (batch_size, width), generator=generator)
        # the blanks: the m smallest of n + m uniform keys (padding sorts last; ties: p < 1e-15)
        keys = torch.randint(0, 2**62, (batch_size, span), generator=generator)
        keys.masked_fill_(~prefix_mask(total, span), 2**62)
        blank = keys.argsort(1).argsort(1) < (total - n)[:, None]
        order = (~blank).long().cumsum(1) - 1  # which symbol a non-blank place holds
        placed = symbols.gather(1, order.clamp(0, width - 1)) + self.token_id("a")
        body = torch.where(blank, self.token_id(BLANK_TOKEN), placed)
        return make_batch(end_with(body, total, self.token_id("=")), total + 1, symbols + self.token_id("a"),
                          n.clone(), lengths=n, n_steps=n.clone(), eos=self.eos)

    def source_positions(self, batch: Batch) -> Tensor:
        """The answer's k-th symbol is the question's k-th non-blank token: its position."""
        width = batch.inputs.shape[1]
        column = torch.arange(width)[None, :]
        q = batch.question_len[:, None]
        content = (column < q - 1) & (batch.inputs != self.token_id(BLANK_TOKEN))
        places = torch.where(content, column, column + width).sort(1).values  # content columns first
        source = places.gather(1, (column - q + 1).clamp(0, width - 1))
        return torch.where(batch.scored & (source < width), source, -1)
