"""Index hints (Zhou et al., 2023, "What Algorithms can Transformers Learn?"), the arithmetic tasks'
`index_hints` option: each digit of the operands and of the answer is preceded by a hint token that
names its significance, the same token for the digits one column of the sum combines, so that a
model can find them by content (an induction head) rather than by counting positions.

    653+049=  ->  2070      is written      c6b5a3+c0b4a9=  ->  a2b0c7d0      (offset 0)

The hints are the 52 letters a..z, A..Z, one character each so that the text stays one character
per token, in that order: the digit of significance i takes hint number offset + i. The offset is
drawn per sample, uniform over those that keep the sample's n + 1 hints among the 52, as Cho et
al.'s index-hint baseline draws its first hint (`randomize`): every hint token is trained whatever
the training lengths, and a longer test problem reads trained hints in a longer run. The hints do
not cycle (a cycle would give two digits of one operand the same hint): a problem of more than 51
digits, whose sum has more than 52 significances, is refused, when sampled and at config load.
"""
from __future__ import annotations

import string

import torch
from torch import Tensor

from lengthgen.config.schema import parse_lengths

from .base import Task, prefix_mask, uniform_below

HINTS = tuple(string.ascii_lowercase + string.ascii_uppercase)
MAX_HINTED = len(HINTS) - 1  # the longest problem: its n + 1 significances take every hint


def check_hinted(task: str, n: Tensor) -> None:
    """ValueError unless every length in n leaves its n + 1 significances a hint each."""
    if int(n.max()) > MAX_HINTED:
        raise ValueError(f"{task}: index_hints has {len(HINTS)} hint tokens, one per significance of the "
                         f"n + 1-digit answer, so lengths up to {MAX_HINTED}; got {int(n.max())}")


def check_hinted_config(task: str, cfg) -> None:
    """ValueError naming the key if training or a test asks for a length beyond MAX_HINTED."""
    asked = {"task.train_max": [cfg.task.train_max], "eval.lengths": parse_lengths(cfg.eval.lengths),
             "tests.lengths": parse_lengths(cfg.tests.lengths) if cfg.tests.lengths else []}
    for key, lengths in asked.items():
        if lengths and max(lengths) > MAX_HINTED:
            raise ValueError(f"{key} includes {max(lengths)}; {task} with index_hints has {len(HINTS)} hint "
                             f"tokens, one per significance of the answer, so lengths up to {MAX_HINTED}")


def draw_offsets(n: Tensor, generator: torch.Generator) -> Tensor:
    """(B,) each sample's first hint number, uniform over 0..len(HINTS) - 1 - n[b]."""
    return uniform_below(len(HINTS) - n, generator)


def with_hints(tokens: Tensor, count: Tensor, significance: Tensor, hint: Tensor) -> tuple[Tensor, Tensor]:
    """Row b of tokens (B, W), count[b] tokens long, with the token hint[b] + significance[b, j]
    written before every column j whose significance is >= 0 (the digits): (B, 2W) and the new counts."""
    batch, width = tokens.shape
    digit = (significance >= 0) & prefix_mask(count, width)
    end = (1 + digit.long()).cumsum(1)  # one past the column's token in the output
    out = torch.zeros(batch, 2 * width + 1, dtype=tokens.dtype)  # the last column takes the non-digits' hints
    out.scatter_(1, end - 1, tokens)  # columns past count land past the new count: never read
    out.scatter_(1, torch.where(digit, end - 2, 2 * width), hint[:, None] + significance.clamp(min=0))
    return out[:, :2 * width], count + digit.sum(1)


class Hinted(Task):
    """A task with the `index_hints` option (its subclasses set self.index_hints): the lengths it
    refuses at config load, and a random baseline that guesses the answer's n + 1 digits only, its
    hints following from the question."""

    index_hints = False

    def check(self, cfg, transform: type) -> None:
        super().check(cfg, transform)
        if self.index_hints:
            check_hinted_config(self.name, cfg)

    def random_baseline(self, length: int, samples: int = 2000) -> float:
        if not self.index_hints:
            return super().random_baseline(length, samples)
        return float(self.answer_symbols) ** -(length + 1)
