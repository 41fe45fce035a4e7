"""What one evaluation of a run is asked for, as one object: `EvalSettings`.

`lengthgen eval`'s flags and `lengthgen.evaluate`'s keywords (lengthgen.api) and the evaluation a
reproduction gives each run (lengthgen.reproduction.jobs) are the same settings, handed whole to the
evaluator (lengthgen.evaluation.evaluate.evaluate_run). A setting left None is the run's own `[eval]`
value, filled in once the run is loaded (`EvalSettings.resolved`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from lengthgen.config.schema import MAX_EVAL_SEED, EvalConfig, parse_lengths
from lengthgen.errors import UserError

MAX_DRAWS = 1000  # position draws per test sample: each one reads the whole test set again


@dataclass(frozen=True)
class EvalSettings:
    """The settings of one evaluation; each field is a keyword of `lengthgen.evaluate` (and of
    `TrainedRun.evaluate`), and None means the run's own value of the `[eval]` key named.

    lengths: test lengths: a spec ("1:40", "10:50:10", "8,16,32"), an int, or ints such as
        range(1, 25); held as a tuple of ints, each once (None: eval.lengths)
    samples: test samples per length, test tokens for a text task (None: eval.samples)
    batch_size: samples per batch, lowered where a length would not fit (None: eval.batch_size)
    seed: the seed each length's test samples are drawn from (None: eval.seed)
    stops: stop rules of a method with stop rules ("oracle", "fixed:12", "confidence", ...): one
        string or several, sharing one pass ((): the method's default, the oracle)
    per_step: a looped run's metrics after every iteration too, into per_step.csv
    sweep: task options (or position.scaling and position.factor of a rotary run) to evaluate each
        value of, {option: [values]} (None: eval.sweep)
    position_draws: draws of the position IDs each test sample is read under, for a position
        transform that draws them at evaluation (None: eval.position_draws)
    compile: torch.compile each block (None: eval.compile)
    out: the folder eval.csv goes into, with a copy of the run's config.toml (None: the run folder)
    progress: a progress bar over the lengths

    Values are checked and put in one form when the object is made: a bad one is a UserError
    naming the flag of `lengthgen eval` that sets it."""

    lengths: tuple[int, ...] | None = None
    samples: int | None = None
    batch_size: int | None = None
    seed: int | None = None
    stops: tuple[str, ...] = ()
    per_step: bool = False
    sweep: dict | None = None
    position_draws: int | None = None
    compile: bool | None = None
    out: Path | None = None
    progress: bool = True

    def __post_init__(self):
        # frozen: each value is put in its one form here, as the object is made
        object.__setattr__(self, "lengths", None if self.lengths is None else length_tuple(self.lengths))
        object.__setattr__(self, "stops", (self.stops,) if isinstance(self.stops, str) else tuple(self.stops or ()))
        object.__setattr__(self, "sweep", dict(self.sweep) if self.sweep else None)  # {}: no sweep of its own
        object.__setattr__(self, "out", None if self.out is None else Path(self.out))
        self.check()

    def check(self) -> None:
        """Each count in its range, before any run is loaded (UserError naming the flag)."""
        if self.samples is not None and self.samples < 1:
            raise UserError(f"--samples must be >= 1, got {self.samples}")
        if self.seed is not None and not 0 <= self.seed < MAX_EVAL_SEED:
            raise UserError(f"--seed must be in [0, 2**40), as eval.seed, got {self.seed}")
        if self.batch_size is not None and self.batch_size < 1:
            raise UserError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.position_draws is not None and not 1 <= self.position_draws <= MAX_DRAWS:
            raise UserError(f"--position-draws must be in [1, {MAX_DRAWS}], got {self.position_draws}")

    def resolved(self, ev: EvalConfig) -> EvalSettings:
        """These settings with every one left None taken from the run's `[eval]` section `ev`."""
        own = {"lengths": ev.lengths, "samples": ev.samples, "batch_size": ev.batch_size, "seed": ev.seed,
               "sweep": ev.sweep, "position_draws": ev.position_draws, "compile": ev.compile}
        return replace(self, **{name: value for name, value in own.items() if getattr(self, name) is None})


def length_tuple(lengths) -> tuple[int, ...]:
    """Test lengths from a spec ("1:40", "10:50:10", "8,16,32"), an int, or ints, checked as
    eval.lengths; a length given twice is kept once (it would give duplicate rows)."""
    if isinstance(lengths, int) and not isinstance(lengths, bool):
        lengths = str(lengths)
    elif not isinstance(lengths, str):
        items = list(lengths)
        if not items or not all(isinstance(n, int) and not isinstance(n, bool) for n in items):
            raise UserError(f"lengths must be a spec such as '1:40', an int, or ints, got {items!r:.60}")
        lengths = ",".join(map(str, items))
    return tuple(dict.fromkeys(parse_lengths(lengths)))

