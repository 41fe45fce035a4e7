"""A task as a plugin, in one file: Majority, are there more ones than zeros?

    question "10110="  ->  answer "1"   (three ones, two zeros)
    question "1001="   ->  answer "0"   (a tie is not a majority)

A looped model can count as it goes: T(n) = n iterations, one per input bit, as Parity's.

    lengthgen tasks --plugin examples/plugins/majority.py
    lengthgen train looped/cpu/parity --plugin examples/plugins/majority.py --set task.name=majority

Its options (`ones`: the probability of a one) are keyword arguments, checked as a built-in
task's are (`--set task.options.ones=0.7`; `task.options.onse` is refused, naming `ones`).
"""
import torch

from lengthgen import Task, register
from lengthgen.tasks.base import end_with, make_batch


@register.task("majority")
class Majority(Task):
    tokens = ("0", "1", "=")
    answer_symbols = 2
    eos = False  # one answer token: the question fixes its length
    example = "10110= -> 1"

    def __init__(self, ones: float = 0.5):
        if not (isinstance(ones, (int, float)) and 0 < ones < 1):
            raise ValueError(f"majority ones must be a probability in (0, 1), got {ones!r}")
        self.ones = float(ones)

    def sample(self, batch_size, length, generator):
        n, width = self.lengths_of(batch_size, length)  # (B,) problem lengths, checked; the widest
        bits = (torch.rand(batch_size, width, generator=generator) < self.ones).long()
        bits = bits * (torch.arange(width) < n[:, None])  # columns past a row's length are not its input
        zero, equals = self.token_id("0"), self.token_id("=")
        question = end_with(bits + zero, n, equals)
        answer = (2 * bits.sum(1, keepdim=True) > n[:, None]).long() + zero  # (B, 1)
        return make_batch(question, n + 1, answer, torch.ones_like(n), lengths=n, n_steps=n.clone(), eos=self.eos)
