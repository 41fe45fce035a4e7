"""RoPE stretched at test time as evaluation arms: the `position.*` keys of an evaluation sweep
(`lengthgen eval RUN --sweep 'position.scaling=[none,pi,ntk,yarn]'`, or eval.sweep).

position.scaling: none, pi, ntk or yarn (lengthgen.model.rope_scaling). position.factor: `dynamic`
(the default) chooses s = max(1, test sequence length / longest training sequence length) at each
evaluated length; a number >= 1 fixes s. Sequence lengths are in tokens as the method lays the
sequence out (a task's length n is not its width in tokens); a perplexity window is its own width.
Every row carries both columns; the model is stretched for one length's evaluation and restored.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch

from lengthgen.assembly.runs import Run
from lengthgen.errors import UserError
from lengthgen.model.rope_scaling import dynamic_factor
from lengthgen.model.rotary import stretched_rope
from lengthgen.tasks import Task

PREFIX = "position."
SCALING, FACTOR = "position.scaling", "position.factor"


def split_options(options: dict) -> tuple[dict, dict]:
    """(task options, position options) of one sweep combination or of a sweep."""
    task = {k: v for k, v in options.items() if not k.startswith(PREFIX)}
    return task, {k: v for k, v in options.items() if k.startswith(PREFIX)}


def with_factor(sweep: dict) -> dict:
    """A sweep of position.scaling names its factor: `dynamic` where none is given (a column of every row)."""
    return {**sweep, FACTOR: ["dynamic"]} if SCALING in sweep and FACTOR not in sweep else sweep


def sequence_width(run: Run, task: Task, length: int) -> int:
    """Tokens in the widest sequence of `task` at `length`, as the method lays it out (measured on a fixed
    sample, as lengthgen.assembly.runs.training_positions measures training's)."""
    if task.evaluation == "perplexity":  # a window of `length` tokens
        return length
    samples = max(1, min(256, 1_000_000 // length))
    batch = task.sample(samples, length, torch.Generator().manual_seed(0))
    return int(run.method.model_batch(batch).inputs.shape[1])


class Stretcher:
    """The stretch of one evaluation: `at(model, options, task, length)` is the context in which one
    length of one sweep combination is measured. Widths are measured once per task and length, however
    many scalings read them; training's is the assembled run's (`Run.widest`)."""

    def __init__(self, run: Run):
        self.run = run
        self.train_width = run.widest
        self._widths = {}

    def factor(self, options: dict, task: Task, length: int) -> float:
        given = options.get(FACTOR, "dynamic")
        if given != "dynamic":
            return float(given)
        if (id(task), length) not in self._widths:
            try:
                self._widths[id(task), length] = sequence_width(self.run, task, length)
            except ValueError as err:  # a length the task refuses, named as evaluate_length names it
                raise UserError(f"cannot evaluate length {length}: {err}") from None
        return dynamic_factor(self._widths[id(task), length], self.train_width)

    def at(self, model: torch.nn.Module, options: dict, task: Task, length: int):
        scaling = options.get(SCALING, "none")
        if scaling == "none":
            return nullcontext()
        return stretched_rope(model, scaling, self.factor(options, task, length), self.train_width)
