"""Stop rules of a looped model at inference.

Rules are objects in one registry (`RULES`, parsed from `name[:args]` by `parse_rule`):
each runs its own pass (lengthgen.methods.looped.stop_passes), says how many iterations a shared trace
must run for it, and reads its choice out of such a trace. Every rule returns (pred (B, L)
argmax ids, steps (B,): the iteration each sample was read out at). `read_out` is the looped
methods' read-out of a batch under any number of rules (`Method.read_out`, which evaluation calls).
"""
from __future__ import annotations

import torch
from torch import Tensor

from lengthgen import register
from lengthgen.config.schema import MAX_LENGTH
from lengthgen.methods.looped.block import per_sample_steps
from lengthgen.methods.looped.stop_passes import (CONFIDENT, Trace, confidence, confidence_per_sample, first_confident,
                                                  fixed, halt, oracle, trace)
from lengthgen.tasks import Batch, Task
from lengthgen.tasks.base import MAX_STEPS_PER_LENGTH

# The most iterations a rule may ask for: the confidence rules' own window, 2 T(n), at the longest
# T(n) a config allows (T(n) <= MAX_STEPS_PER_LENGTH x n, n <= MAX_LENGTH). A larger count reads
# no step any run could need and would loop for days: refused when the rule is parsed.
MAX_STEPS = 2 * MAX_STEPS_PER_LENGTH * MAX_LENGTH


def default_t_max(batch: Batch) -> int:
    """Search bound of the confidence rules when none is given: twice the
    batch's largest T(n) (the rule must see steps past the right one)."""
    return 2 * int(per_sample_steps(batch).max())


class StopRule:
    """A stop rule with its integer arguments, written `name[:arg[:arg]]`. A confidence rule's
    T_MAX may be written `+N`: the batch's largest T(n) plus N, the released code's search window
    (1 ... T(n) + 20; + 30 for Multiplication and Unique Set), which grows with the length.

    run(model, batch)         -> (pred (B, L), read-out step (B,)), its own pass
    steps_needed(batch)       -> iterations a trace must run to apply the rule
    trace_steps(trace, batch) -> the step (B,) the rule picks, read from a trace
                                 (None if a trace cannot give it)
    """

    name = ""
    usage = ""  # how the rule is written, for error messages
    arity = (0, 0)  # fewest and most arguments
    marker, label = "o", ""  # how the per-step figure marks the step it picks

    relative_ok = False  # whether the first argument may be `+N` (relative to T(n))

    def __init__(self, *args: int, relative: bool = False):
        self.args, self.relative = list(args), relative

    def __str__(self) -> str:
        first = [f"+{self.args[0]}"] if self.relative else []
        return ":".join([self.name, *first, *map(str, self.args[len(first):])])

    def check(self, method) -> "StopRule":
        """Self, or ValueError if the rule cannot read out models of `method` (a Method)."""
        return self

    def run(self, model, batch: Batch) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def steps_needed(self, batch: Batch) -> int:
        raise NotImplementedError

    def trace_steps(self, tr: Trace, batch: Batch) -> Tensor | None:
        raise NotImplementedError

    def _t_max(self, batch: Batch) -> int:
        if self.relative:
            return int(per_sample_steps(batch).max()) + self.args[0]
        return self.args[0] if self.args else default_t_max(batch)


def _every(tr: Trace, step: int) -> Tensor:
    return torch.full((tr.exact.shape[1],), step, dtype=torch.long, device=tr.exact.device)


class Oracle(StopRule):
    name, usage, marker, label = "oracle", "oracle", "o", "oracle T(n)"

    def run(self, model, batch):
        return oracle(model, batch)

    def steps_needed(self, batch):
        return int(per_sample_steps(batch).max())

    def trace_steps(self, tr, batch):
        return per_sample_steps(batch).to(tr.exact.device)


class Fixed(StopRule):
    name, usage, arity, marker, label = "fixed", "fixed:N", (1, 1), "s", "fixed"

    def run(self, model, batch):
        return fixed(model, batch, self.args[0])

    def steps_needed(self, batch):
        return self.args[0]

    def trace_steps(self, tr, batch):
        return _every(tr, self.args[0])


class Confidence(StopRule):
    name, usage, arity, marker, label = "confidence", "confidence[:T_MAX|:+N]", (0, 1), "x", "confidence (per batch)"
    relative_ok = True

    def run(self, model, batch):
        return confidence(model, batch, self._t_max(batch))

    def steps_needed(self, batch):
        return self._t_max(batch)

    def trace_steps(self, tr, batch):
        need = self.steps_needed(batch)
        best = min(range(need), key=lambda t: (tr.batch_confidence[t], t))  # earliest on ties, like the rule
        return _every(tr, best + 1)


class ConfidencePerSample(StopRule):
    name, usage, arity = "confidence-per-sample", "confidence-per-sample[:T_MAX|:+N[:PATIENCE]]", (0, 2)
    relative_ok = True
    marker, label = "^", "confidence (per sample, mean)"

    def run(self, model, batch):
        return confidence_per_sample(model, batch, self._t_max(batch), self.args[1] if len(self.args) > 1 else None)

    def steps_needed(self, batch):
        return self._t_max(batch)

    def trace_steps(self, tr, batch):
        if len(self.args) > 1:  # patience: depends on when samples retire, which a trace does not record
            return None
        return tr.confidence[:self.steps_needed(batch)].argmin(0) + 1  # argmin takes the earliest on ties


def first_firing(fires: Tensor, value: Tensor) -> Tensor:
    """(T, B) bool, (T, B) -> (B,) step: the first t that fires, else the argmin of value."""
    first = fires.float().argmax(0)  # the first True; 0 where none is
    return torch.where(fires.any(0), first, value.argmin(0)) + 1


class FirstConfident(StopRule):
    name, usage, arity = "first-confident", "first-confident[:T_MAX|:+N]", (0, 1)
    relative_ok = True
    marker, label = "v", "first confident (per sample, mean)"

    def run(self, model, batch):
        return first_confident(model, batch, self._t_max(batch))

    def steps_needed(self, batch):
        return self._t_max(batch)

    def trace_steps(self, tr, batch):
        conf = tr.confidence[:self.steps_needed(batch)]
        return first_firing(conf < CONFIDENT, conf)


class Halt(StopRule):
    name, usage, arity = "halt", "halt[:T_MAX|:+N]", (0, 1)
    relative_ok = True
    marker, label = "D", "halting head (per sample, mean)"  # or probe, or clock: whichever the run has

    def check(self, method):
        if not method.has_halt_head:
            raise ValueError(f"stop rule halt reads a halting head: train with method looped-halt, looped-halt-probe or looped-clock, not {method.name}")
        return self

    def run(self, model, batch):
        return halt(model, batch, self._t_max(batch))

    def steps_needed(self, batch):
        return self._t_max(batch)

    def trace_steps(self, tr, batch):
        if tr.halt is None:
            return None
        z = tr.halt[:self.steps_needed(batch)]
        return first_firing(z > 0, -z)


# The built-ins, registered as plugins are (lengthgen.register), in the order listings show them
RULES = register.STOP_RULES
RULES.base = StopRule
for _cls in (Oracle, Fixed, Confidence, ConfidencePerSample, FirstConfident, Halt):
    RULES.add(_cls.name, _cls)


def parse_rule(text: str | StopRule) -> StopRule:
    """'fixed:12' -> Fixed(12); 'confidence-per-sample:40:3' -> ConfidencePerSample(40, 3).
    ValueError naming every rule's form for anything else."""
    if isinstance(text, StopRule):
        return text
    name, *args = str(text).split(":")
    cls = RULES.get(name)
    relative = bool(args) and args[0].startswith("+") and cls is not None and cls.relative_ok
    try:  # digits only: int() would also take "+4", " 4" or "4_0"
        numbers = [int(a) for a in [args[0][1:], *args[1:]]] if relative else [int(a) for a in args]
        numbers = numbers if all(a[relative * (i == 0):].isdigit() for i, a in enumerate(args)) else None
    except ValueError:
        numbers = None
    if cls is None or numbers is None or not cls.arity[0] <= len(numbers) <= cls.arity[1] or any(n < 1 for n in numbers):
        forms = ", ".join(rule.usage for rule in RULES.values())
        raise ValueError(f"stop rule {text!r} is not one of: {forms} (positive integers)")
    if max(numbers, default=0) > MAX_STEPS:
        raise ValueError(f"stop rule {text!r} asks for {max(numbers):,} iterations; at most {MAX_STEPS:,} "
                         f"(twice the longest T(n) any task has at length {MAX_LENGTH:,})")
    return cls(*numbers, relative=relative)


def steps_needed(batch: Batch, rule: str | StopRule) -> int:
    """Iterations a trace must run for `readout` to apply `rule` to `batch`."""
    return parse_rule(rule).steps_needed(batch)


def readout(tr: Trace, batch: Batch, rule: str | StopRule) -> tuple[dict[str, Tensor], Tensor] | None:
    """({"accuracy": exact (B,) bool, "token_accuracy": (B,), task metrics...}, step (B,)) of
    `rule` read from a trace: the same choice the rule's own pass makes. None for a rule a
    trace cannot give (patience) or a trace too short."""
    rule = parse_rule(rule)
    if rule.steps_needed(batch) > len(tr.exact):
        return None
    steps = rule.trace_steps(tr, batch)
    if steps is None:
        return None
    at = (steps - 1)[None]
    values = {"accuracy": tr.exact.gather(0, at)[0], "token_accuracy": tr.token.gather(0, at)[0]}
    values.update({name: v.gather(0, at)[0] for name, v in tr.extra.items()})
    return values, steps


def predict_stop(model, batch: Batch, rule: str | StopRule) -> tuple[Tensor, Tensor]:
    """(pred (B, L), read-out step (B,)) under a rule: oracle | fixed:N | confidence[:T_MAX] |
    confidence-per-sample[:T_MAX[:PATIENCE]] | first-confident[:T_MAX] | halt[:T_MAX]."""
    return parse_rule(rule).run(model, batch)


def read_out(method, model, batch: Batch, task: Task, stops: list[str | None],
             per_step: bool = False) -> tuple[list[tuple[dict[str, Tensor], Tensor | None]], dict[str, Tensor] | None]:
    """`Method.read_out` of a looped method (`method`): each rule of `stops` on one batch, and with
    `per_step` the batch's curve (`iteration_sums`). A None rule is the method's own prediction.

    With several rules or `per_step` the batch runs once to the longest iteration any of them
    needs (`trace`) and every rule is read out of that pass: the same choices as the rules' own
    passes at a fraction of the cost. A lone rule runs its own pass (per-sample confidence then
    retires finished samples), and so does a rule a trace cannot give (patience)."""
    rules = [None if stop is None else parse_rule(stop) for stop in stops]
    tr = None
    if per_step or len(rules) > 1:
        needs = [rule.steps_needed(batch) for rule in rules] + ([default_t_max(batch)] if per_step else [])
        tr = trace(model, batch, max(needs), task)
    read = []
    for rule in rules:
        got = readout(tr, batch, rule) if tr is not None else None
        if got is None:
            pred, steps = (method.predict(model, batch), None) if rule is None else method.predict_stop(model, batch, rule)
            got = method.values(model, batch, task, pred), steps
        read.append(got)
    return read, iteration_sums(tr, batch) if per_step else None


def iteration_sums(tr: Trace, batch: Batch) -> dict[str, Tensor]:
    """{column: (T,) sum over the batch's samples} after each iteration t <= 2 T(n) (`default_t_max`):
    exact-match accuracy, mean confidence loss, and the oracle step T(n) (the same at every t)."""
    t = default_t_max(batch)
    oracle_steps = float(batch.n_steps.float().sum())  # on the CPU in float64: MPS has no float64
    return {"accuracy": tr.exact[:t].float().sum(1), "confidence": tr.confidence[:t].sum(1),
            "oracle_step": torch.full((t,), oracle_steps, dtype=torch.float64)}
