"""Flip-flop language modelling (Liu et al., 2023), the TRA paper's first benchmark.

    sequence "w1i0r1w0i1r0"  ->  read bits "1", "0"     (rendered "w1i0r1w0i1r -> 10")

A sequence of n (instruction, bit) pairs over {w, r, i} x {0, 1}, written as 2n
characters: `w b` writes bit b, `i b` ignores (b uniform), `r b` reads: b is
the most recently written bit. The first instruction is w, the last r, the
others i.i.d. with P(i) = p_ignore and P(w) = P(r) = (1 - p_ignore) / 2; bits of
w and i are uniform. FFL(0.8) is the training and IID test distribution,
FFL(0.98) the sparse and FFL(0.1) the dense out-of-distribution tests (sweep
p_ignore in evaluation). n is the problem length: the paper's 512 characters
are n = 256.

The whole sequence is the input, language-model style: the scored positions
are the `r` tokens, whose target is the bit read (`loss = "reads"`, the TRA
notebook's training), or every position (`loss = "all"`, plain language
modelling). Either way the task's own metrics look at the reads only:
`glitch_rate`, the fraction of reads wrong, and `sequence_accuracy`, all reads
right (the TRA paper's metric; with loss "reads" it equals `accuracy`).

T(n) = n (not a looped task: the scored positions lie inside the sequence).
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import IGNORE, PAD, Batch, Task, prefix_mask

LOSSES = ("reads", "all")


class FlipFlop(Task):
    name = "flipflop"
    tokens = ("w", "r", "i", "0", "1")
    answer_symbols = 2
    eos = False
    answer_region = False  # scored positions lie inside the sequence
    min_length = 2  # a first w and a last r
    example = "w1i0r1w0i1r -> 10"
    metric_names = ("glitch_rate", "sequence_accuracy")

    def __init__(self, *, p_ignore: float = 0.8, loss: str = "reads"):
        if isinstance(p_ignore, bool) or not isinstance(p_ignore, (int, float)) or not 0 <= p_ignore < 1:
            raise ValueError(f"flipflop: p_ignore must be a number in [0, 1), got {p_ignore!r}")
        if loss not in LOSSES:
            raise ValueError(f"flipflop: loss must be one of {', '.join(LOSSES)}, got {loss!r}")
        self.p_ignore, self.loss = float(p_ignore), loss

    def sample(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> Batch:
        n, width = self.lengths_of(batch_size, length)
        if int(n.min()) < self.min_length:
            raise ValueError(f"flipflop: length must be >= {self.min_length} (a first w and a last r), got {int(n.min())}")
        w, r, i, zero = (self.token_id(t) for t in ("w", "r", "i", "0"))
        u = torch.rand(batch_size, width, generator=generator, dtype=torch.float64)
        write = (1 - self.p_ignore) / 2
        instr = torch.where(u < self.p_ignore, i, torch.where(u < self.p_ignore + write, w, r))  # (B, width)
        column = torch.arange(width)[None, :]
        instr = torch.where(column == 0, w, torch.where(column == n[:, None] - 1, r, instr))
        bits = torch.randint(0, 2, (batch_size, width), generator=generator)
        last_write = torch.where(instr == w, column, -1).cummax(1).values  # >= 0: pair 0 writes
        bits = torch.where(instr == r, bits.gather(1, last_write), bits)  # a read returns the last write
        seq = torch.stack([instr, bits + zero], 2).flatten(1)  # (B, 2 width): w b i b r b ...
        real = prefix_mask(2 * n, 2 * width)  # row b has 2 n[b] characters
        seq = seq.masked_fill(~real, PAD)
        scored = real[:, 1:] & ((seq[:, :-1] == r) if self.loss == "reads" else True)
        inputs = seq[:, :-1].masked_fill(~prefix_mask(2 * n - 1, 2 * width - 1), PAD)  # the last bit is a target only
        targets = seq[:, 1:].masked_fill(~scored, IGNORE)
        return Batch(inputs=inputs, targets=targets, question_len=2 * n - 1, lengths=n, n_steps=n.clone())

    def to_text(self, batch: Batch, i: int) -> tuple[str, str]:
        """(the sequence without its last bit, the read bits), e.g. ("w1i0r1w0i1r", "10")."""
        reads = (batch.inputs[i] == self.token_id("r")) & (batch.targets[i] != IGNORE)
        q = int(batch.question_len[i])
        return self.decode(batch.inputs[i, :q]), self.decode(batch.targets[i][reads])

    def metrics(self, pred: Tensor, batch: Batch) -> dict[str, Tensor]:
        reads = (batch.inputs == self.token_id("r")) & batch.scored  # (B, L): the read positions
        wrong = ((pred != batch.targets) & reads).sum(1)
        return {"glitch_rate": wrong.float() / reads.sum(1).clamp(min=1), "sequence_accuracy": (wrong == 0).float()}

    def source_positions(self, batch: Batch) -> Tensor:
        """Each read's answer is the bit of the most recent write: its position."""
        column = torch.arange(batch.inputs.shape[1])[None, :]
        writes = torch.where(batch.inputs == self.token_id("w"), column + 1, -1).cummax(1).values  # bit after w
        return torch.where(batch.scored & (batch.inputs == self.token_id("r")), writes, -1)

    def random_baseline(self, length: int, samples: int = 2000) -> float:
        """Every read guessed right by chance: 2^-reads, averaged over samples."""
        batch = self.sample(samples, length, torch.Generator().manual_seed(0))
        reads = ((batch.inputs == self.token_id("r")) & batch.scored).sum(1)
        return float((0.5 ** reads.double()).mean())
