"""What a reproduction is asked to run, as one object: `ReproduceRequest`.

`lengthgen reproduce`'s flags and `lengthgen.reproduce`'s keywords (lengthgen.api) are its fields;
the runner plans and runs it (lengthgen.reproduction.runner.reproduce), and planning hands the same
object, its defaults filled in, to the grid (`planned`, then lengthgen.reproduction.planning.plan).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from lengthgen.config.schema import toml_value
from lengthgen.errors import UserError
from lengthgen.results.rows import cell


BACKENDS = ("local", "ray")


@dataclass(frozen=True)
class ReproduceRequest:
    """The options of one reproduction; each field is a keyword of `lengthgen.reproduce` and a flag of
    `lengthgen reproduce` (its default the command's):

    scale: the grid's scale, e.g. "cpu" or "paper" (None: cpu, or the grid's first scale)
    seeds: seeds of every run (None: the grid's `seeds`, else 3)
    tasks: the grid's tasks to run, a list or one comma-separated string (None: its default ones)
    arms: the grid's arms to run, likewise (None: its default ones)
    out: the folder of the runs (OUT/runs) and the report (None: runs/reproduce-<paper>-<scale>)
    workers: runs trained at once on this machine (None: chosen by device: 4 per GPU for eager steps,
        1 per GPU for recorded ones, 2 on CPU)
    threads: torch threads per run (0: the machine's cores shared among the workers)
    samples: test samples per length of every run (0: each preset's eval.samples)
    overrides: config overrides for every run, after its arm's: a dict of dotted keys
        ({"train.steps": 300}) or KEY=VALUE strings; held as KEY=VALUE strings
    axes: some values of the grid's axes, or new ones ({"model.position": ["half_rope", "rope"]}: a
        plugin's scheme beside a baseline); held with each value as a folder name spells it
    plugins: modules or .py files imported here and by every worker, recorded in each run's config
    progress: a progress line with each running run's step and loss
    stack_seeds: the seeds of each configuration trained as one stacked model in one worker (local backend)
    backend: "local" (a pool of worker processes) or "ray" (a Ray task per run)
    address: the Ray cluster's address (None: a new local Ray instance); backend "ray" only
    gpus_per_job: GPUs each Ray task of a GPU run asks for, a fraction shares one (None: 1; 0: it runs
        on CPUs); backend "ray" only

    Values are put in one form when the object is made: tasks, arms, overrides and plugins as tuples
    of strings, out as a Path, axes as {key: [value text]}."""

    scale: str | None = None
    seeds: int | None = None
    tasks: tuple[str, ...] | None = None
    arms: tuple[str, ...] | None = None
    out: Path | None = None
    workers: int | None = None
    threads: int = 0
    samples: int = 0
    overrides: tuple[str, ...] = ()
    axes: dict = field(default_factory=dict)
    plugins: tuple[str, ...] = ()
    progress: bool = True
    stack_seeds: bool = False
    backend: str = "local"
    address: str | None = None
    gpus_per_job: float | None = None

    def __post_init__(self):
        # frozen: each value is put in its one form here, as the object is made
        object.__setattr__(self, "tasks", names("tasks", self.tasks))
        object.__setattr__(self, "arms", names("arms", self.arms))
        object.__setattr__(self, "out", None if self.out is None else Path(self.out))
        object.__setattr__(self, "overrides", override_texts(self.overrides))
        object.__setattr__(self, "axes", {str(key): [value_text(v) for v in values]
                                          for key, values in (self.axes or {}).items()})
        object.__setattr__(self, "plugins", (self.plugins,) if isinstance(self.plugins, str)
                           else tuple(str(p) for p in self.plugins))
        if self.backend not in BACKENDS:
            raise UserError(f"--backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")


def names(kind: str, given) -> tuple[str, ...] | None:
    """The tasks or arms named (a list, or one comma-separated string), None for the grid's default
    ones; a list that names none ("--tasks ,") is refused rather than read as "all of them"."""
    if given is None:
        return None
    chosen = tuple(n.strip() for n in given.split(",") if n.strip()) if isinstance(given, str) else tuple(given)
    if not chosen:
        raise UserError(f"--{kind} names no {kind[:-1]}; leave it out to run the default ones")
    return chosen


def override_texts(overrides) -> tuple[str, ...]:
    """Overrides as KEY=VALUE strings: a dict of dotted keys written as --set spells them, one string
    as itself, or a sequence of strings."""
    if overrides is None:
        return ()
    if isinstance(overrides, Mapping):
        return tuple(f"{key}={toml_value(value)}" for key, value in overrides.items())
    if isinstance(overrides, str):  # one "KEY=VALUE" string: not a sequence of one-letter overrides
        return (overrides,)
    return tuple(str(text) for text in overrides)


def value_text(value) -> str:
    """An axis value as a folder name and --axis spell it (0.5, true, rope)."""
    return value if isinstance(value, str) else cell(value)
