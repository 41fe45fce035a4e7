"""What the Chomsky-hierarchy tasks (Delétang et al., ICLR 2023) share: their batch layout, their
score, and the vectorised helpers their generators need (uniform draws, binary big numbers).

The suite's model reads a tape `x ; p`: the n input tokens, then T_out(n) empty output slots, and
is scored at the slots. Here a sample is lengthgen's usual `question = x =`, answer after it
(no EOS): the '=' and the T_out - 1 answer inputs after it are the T_out slots (Batch.blank_answers
blanks all but the '='; `slots_tape` blanks the '=' too, for exactly the authors' tape of n +
T_out tokens). Every answer position is a target, zero-padding after an end token included, as the
authors' loss is unmasked; their accuracy masks what follows the first end token. Two task metrics
score it: `chomsky_accuracy`, the authors' statistic (their training script's accuracy_fn: right
tokens over scored tokens, pooled over each batch of 64 test sequences, then averaged over the
batches), and `chomsky_accuracy_per_sequence`, each sequence's share averaged over sequences. Both
equal token_accuracy where the task has no end token (every sequence of a length then has as many
scored tokens).

T(n) = n for every task of the suite (one step per input token; they are not looped tasks).
"""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from .addition import add_bits
from .base import BLANK, Batch, Task, end_with, make_batch, prefix_mask, uniform_below

END = "#"  # the end token of stack_manipulation and binary_* outputs (the authors' class 2)
# The authors' range evaluation scores each length in sub-batches of 64 sequences (training/example.py:
# range_test_sub_batch_size = 64 of range_test_total_batch_size = 512), pooling tokens within one.
SUB_BATCH = 64


class ChomskyTask(Task):
    """A task of the suite: `inputs` are the authors' input ids (in their order) as tokens,
    `outputs` their output classes, `end` the class that ends an answer (masked after it)."""

    eos = False  # the answer length is T_out(n), a function of n alone
    example = ""
    metric_names = ("chomsky_accuracy", "chomsky_accuracy_per_sequence")
    end: str | None = None  # the output token after which the authors' accuracy mask stops

    def finish(self, x: Tensor, x_len: Tensor, answer: Tensor, answer_len: Tensor, n: Tensor) -> Batch:
        """The batch of inputs x (B, W) (token ids, x_len[b] valid) and answers (B, A) (token ids)."""
        question = end_with(x, x_len, self.token_id("="))
        return make_batch(question, x_len + 1, answer, answer_len, lengths=n, n_steps=n.clone(), eos=False)

    def ids(self, values: Tensor, offset: str = "0") -> Tensor:
        """Token ids of small integers written as the tokens "0", "1", ...."""
        return values + self.token_id(offset)

    def metrics(self, pred: Tensor, batch: Batch) -> dict[str, Tensor]:
        right, scored = accuracy_counts(pred, batch, self.token_id(self.end) if self.end else None)
        return {"chomsky_accuracy": pooled(right, scored),
                "chomsky_accuracy_per_sequence": right.float() / scored.clamp(min=1).float()}


def accuracy_counts(pred: Tensor, batch: Batch, end: int | None) -> tuple[Tensor, Tensor]:
    """((B,) right tokens, (B,) scored tokens) under the authors' accuracy_mask: every answer token
    up to and including the first `end` target (all of them if end is None)."""
    mask = batch.scored
    if end is not None:
        is_end = (batch.targets == end) & mask
        mask = mask & ((is_end.long().cumsum(1) - is_end.long()) == 0)
    return ((pred == batch.targets) & mask).sum(1), mask.sum(1)


def pooled(right: Tensor, scored: Tensor) -> Tensor:
    """(B,) per-sequence values whose mean over each SUB_BATCH rows of the batch is that group's
    pooled accuracy, sum(right) / sum(scored): the authors' statistic as a per-sample metric, so
    that evaluation's mean over samples is their mean over sub-batches. Row b gets right[b] * G /
    sum(scored) of its group of G rows; with eval.batch_size a multiple of 64 the groups are the
    test set's consecutive blocks of 64 (a smaller batch pools over its own rows)."""
    if not len(right):
        return right.float()
    group = torch.arange(len(right), device=right.device) // SUB_BATCH
    size = torch.bincount(group).float()  # counts below 2**24: exact in float32, one rounding in the division
    total = torch.zeros(len(size), device=right.device).index_add_(0, group, scored.float())
    return right.float() * size[group] / total[group].clamp(min=1)


def slots_tape(batch: Batch) -> Batch:
    """The authors' tape: the n inputs, then T_out BLANK slots (the '=' blanked too), PAD after."""
    pos = torch.arange(batch.inputs.shape[1], device=batch.inputs.device)[None, :]
    slots = (pos >= batch.question_len[:, None] - 1) & (pos < batch.widths[:, None])
    return replace(batch, inputs=batch.inputs.masked_fill(slots, BLANK))


def uniform_in(low: Tensor | int, high: Tensor, generator: torch.Generator) -> Tensor:
    """(B,) long, row b uniform over low..high[b] (inclusive; high >= low)."""
    return low + uniform_below(high - low + 1, generator)


def nonzero_bits(k: Tensor, width: int, generator: torch.Generator) -> Tensor:
    """(B, width) 0/1, row b the k[b] bits (LSB first, zero above) of an integer uniform in
    1..2^k[b] - 1 (Python's random.randint(1, 2**k - 1)): uniform bits, an all-zero row redrawn."""
    bits = torch.zeros(len(k), width, dtype=torch.long)
    todo = k > 0
    while todo.any():
        draw = torch.randint(0, 2, (int(todo.sum()), width), generator=generator)
        draw.masked_fill_(~prefix_mask(k[todo], width), 0)
        bits[todo] = draw
        todo = todo & (bits.sum(1) == 0)
    return bits


def bit_length(bits: Tensor) -> Tensor:
    """(B,) the bit length of LSB-first bit rows (0 for zero)."""
    column = torch.arange(1, bits.shape[1] + 1)[None, :]
    return (column * (bits != 0)).amax(1)


def multiply_bits(a: Tensor, b: Tensor) -> Tensor:
    """(B, Wa + Wb) LSB-first bits of the products of the LSB-first bit rows a (B, Wa), b (B, Wb):
    column sums by one grouped convolution, then their bit planes added with add_bits."""
    batch, wa, wb = a.shape[0], a.shape[1], b.shape[1]
    width = wa + wb
    weight = b.double().flip(1)[:, None, :]  # (B, 1, Wb): a correlation with the flipped row convolves
    sums = torch.nn.functional.conv1d(a.double()[None], weight, padding=wb - 1, groups=batch)[0]  # (B, Wa+Wb-1)
    sums = torch.nn.functional.pad(sums.round().long(), (0, 1))  # (B, width): column k = sum a_i b_{k-i}
    total = torch.zeros(batch, width, dtype=torch.long)
    for p in range(max(int(sums.max()), 1).bit_length()):  # sums = sum_p 2^p plane_p
        plane = torch.nn.functional.pad((sums >> p) & 1, (p, 0))[:, :width]
        total, _ = add_bits(total, plane)  # never carries out: the product has at most width bits
    return total


def geq_bits(x: Tensor, y: Tensor) -> Tensor:
    """(B,) bool: x >= y for LSB-first bit rows of one width."""
    differ = x != y
    column = torch.arange(1, x.shape[1] + 1)[None, :]
    top = (column * differ).amax(1)  # 1 + the highest differing bit, 0 if equal
    return (top == 0) | (x.gather(1, (top - 1).clamp(min=0)[:, None])[:, 0] == 1)


def subtract_bits(x: Tensor, y: Tensor) -> Tensor:
    """x - y for LSB-first bit rows of one width with x >= y (two's complement, carry dropped)."""
    one = torch.zeros_like(x)
    one[:, 0] = 1
    return add_bits(add_bits(x, 1 - y)[0], one)[0]


def isqrt_bits(bits: Tensor) -> Tensor:
    """(B, ceil(W / 2)) LSB-first bits of floor(sqrt(N)) for LSB-first rows N (B, W): the binary
    digit-by-digit method, two bits of N per step from the top, one loop over steps for the batch."""
    steps = (bits.shape[1] + 1) // 2
    bits = torch.nn.functional.pad(bits, (0, 2 * steps - bits.shape[1]))
    width = 2 * steps + 2
    rest = torch.zeros(bits.shape[0], width, dtype=torch.long)  # remainder
    root = torch.zeros(bits.shape[0], width, dtype=torch.long)
    for s in range(steps - 1, -1, -1):
        rest = torch.cat([bits[:, 2 * s:2 * s + 2], rest[:, :-2]], 1)  # rest << 2 | next two bits
        trial = torch.cat([torch.tensor([[1, 0]]).expand(len(bits), 2), root[:, :-2]], 1)  # root << 2 | 1
        fits = geq_bits(rest, trial)
        rest = torch.where(fits[:, None], subtract_bits(rest, trial), rest)
        root = torch.cat([fits.long()[:, None], root[:, :-1]], 1)  # root << 1 | fits
    return root[:, :steps]


def check_vocab(name: str, vocab_size) -> int:
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or not 2 <= vocab_size <= 10:
        raise ValueError(f"{name}: vocab_size must be an integer in 2..10, got {vocab_size!r}")
    return vocab_size


class Symbols(ChomskyTask):
    """A task over `vocab_size` symbols "0", "1", ... drawn uniformly (default: the paper's)."""
    default_vocab = 2

    def __init__(self, *, vocab_size: int | None = None):
        self.symbols = check_vocab(self.name, self.default_vocab if vocab_size is None else vocab_size)
        self.tokens = tuple(str(v) for v in range(self.symbols)) + ("=",)
        self.answer_symbols = self.symbols

    def draw(self, batch_size: int, length: int | Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        n, width = self.lengths_of(batch_size, length)
        x = torch.randint(0, self.symbols, (batch_size, width), generator=generator)
        return n, x.masked_fill(~prefix_mask(n, width), 0)
