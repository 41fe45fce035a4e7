"""A paper's reproduction, declared as data: experiments/<paper>/grid.toml.

    title = "Looped Transformers (Fan et al., ICLR 2025)"   # the report's title
    seeds = 3                            # seeds per run when --seeds is not given

    [tasks.parity]                       # a task of the paper
    preset = "{scale}/parity.toml"       # its preset per scale, relative to the grid (this is the default)
    default = true                       # run when --tasks is not given
    axes = {"task.options.k" = [2, 4]}   # extra axes: one run per value (per combination of several)
    only = ["looped", "ntp"]             # the arms this task runs (default: every arm)
    [tasks.parity.arms.looped]           # what this task changes of an arm (the keys of an arm)
    stops = ["oracle", "confidence"]

    [arms.looped]                        # an arm: a name, what it changes, how it is evaluated
    set = {method = "looped"}            # config overrides (dotted keys, or tables as in a preset)
    multiply = {"model.n_layer" = 4}     # config values multiplied after `set` and the axes
    stops = ["oracle"]                   # stop rules to evaluate it with (methods with stop rules)
    per_step = false                     # also record accuracy after every iteration (per_step.csv)
    default = true                       # run when --arms is not given

    [axes]                               # axes of every task (a task's own axes add to these)
    [[evaluate]]                         # evaluation arms: the runs whose config has every `when` value
    when = {"model.position" = "rope"}   # (dotted keys, as the run's config.toml spells them) are also
    sweep = {"position.scaling" = ["none", "pi", "ntk", "yarn"]}   # evaluated with this eval.sweep
                                         # (task options, or RoPE stretched at test time: each value its own series)
    [report]                             # summary = [1.5, 2.0]: columns at these multiples of train max
    summary_metric = "accuracy"          # (another metric adds a last/first ratio column);
    figures = ["accuracy_vs_length", "accuracy_vs_iteration", {kind = "heatmap", y = "k"}]

    [scales.cpu]                         # a scale; its table changes any of the above at that scale,
    [scales.paper.arms.ntp]              # key by key (tables merge, values replace)
    multiply = {"model.n_layer" = 20}

A run is (task, arm, axis values, seed) and its folder is named from those
values: `<task>-<arm>[-<axis>=<value>...]-s<seed>` (an axis by the last part of
its key). Each scale is merged and checked once, when the grid is read (`Grid.at`);
lengthgen.reproduction.planning turns the grid at one scale into jobs, each carrying its overrides and its
validated config, worked out once per run. No code here names a paper, a task, an
arm or a method.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

from lengthgen.assembly.checks import check_sweep
from lengthgen.assembly.runs import Run, new_run, new_run_config
from lengthgen.config.presets import EXPERIMENTS, GRID
from lengthgen.config.schema import _hint, flat, from_data, parse_override, read, to_dict, toml_value, tomllib
from lengthgen.errors import UserError
from lengthgen.reproduction.axes import axis_name
from lengthgen.results.rows import cell

ROOT = EXPERIMENTS  # bundled in the package (a checkout links experiments/ to it)
# key -> (type, what it is); a table of names (tasks, arms, scales) is checked entry by entry
ARM_KEYS = {"set": dict, "multiply": dict, "stops": list, "per_step": bool, "default": bool, "description": str}
TASK_KEYS = {"preset": str, "default": bool, "axes": dict, "arms": dict, "only": list}
# threshold: the success rate's and the effective length's (0..1); score: the metric a seed is scored by;
# compare: [ARM_A, ARM_B] pairs set against each other (lengthgen.reporting.compare)
REPORT_KEYS = {"summary": list, "summary_metric": str, "figures": list, "tables": list, "threshold": float,
               "score": str, "compare": list}
TOP_KEYS = {"title": str, "seeds": int, "tasks": dict, "arms": dict, "axes": dict, "report": dict, "scales": dict,
            "evaluate": list}
# an [[evaluate]] entry: which runs (config key -> value, all must match; {} = every run) get which eval.sweep
EVALUATE_KEYS = {"when": dict, "sweep": dict, "description": str}
SAFE = re.compile(r"[A-Za-z0-9._+-]+")  # what an axis value may be, spelt in a folder name


@dataclass
class Job:
    task: str
    arm: str
    seed: int
    preset: str
    overrides: list[str]
    folder: str
    stops: list[str] = field(default_factory=list)  # stop rules to evaluate (methods with stop rules)
    per_step: bool = False
    samples: int = 0  # test samples per length; 0 = the preset's eval.samples
    threads: int = 1
    labels: dict = field(default_factory=dict)  # the run's series.json: arm and the config keys telling its series apart
    sweep: dict = field(default_factory=dict)  # the eval.sweep its [[evaluate]] entries add ({}: the config's own)
    config: dict = field(default_factory=dict)  # the run's validated config (to_dict), seeds and threads set: {} = load it

    def loaded(self):
        """The run's config: the one planning validated, or (a job made without it) its preset loaded."""
        return from_data(self.config) if self.config else new_run_config(self.preset, self.overrides)

    def assembled(self) -> Run:
        """The run with its parts built: from the config planning checked (not checked again), or
        (a job made without it) its preset assembled."""
        return Run.from_checked(from_data(self.config)) if self.config else new_run(self.preset, self.overrides)


def merge(base: dict, change: dict) -> dict:
    """`base` with `change` merged in key by key: tables merge, other values replace."""
    out = dict(base)
    for key, value in change.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


class Grid:
    """A parsed grid.toml. `at(scale)` is the grid at one scale: merged and checked once, when the
    grid is read (every scale at once), then asked as often as planning needs."""

    def __init__(self, path: Path):
        self.path, self.folder = Path(path), Path(path).parent
        try:
            self.data = tomllib.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as err:
            raise UserError(f"{self.path} cannot be read: {err}") from None
        except tomllib.TOMLDecodeError as err:
            raise UserError(f"{self.path} is not valid TOML: {err}") from None
        except RecursionError:  # tomllib recurses per level of nesting
            raise UserError(f"{self.path} is nested too deeply to read (a grid is a few tables deep)") from None
        self.fail_unless(isinstance(self.data.get("scales"), dict) and self.data["scales"],
                         "declares no scale: add a [scales.cpu] table (it may be empty)")
        self.scales = list(self.data["scales"])
        self.scaled = {scale: AtScale(self, scale, self.merged(scale)) for scale in self.scales}

    @property
    def name(self) -> str:
        return self.folder.name

    def fail_unless(self, ok: bool, message: str) -> None:
        if not ok:
            raise UserError(f"{self.path} {message}")

    def check_keys(self, table, known: dict, where: str) -> None:
        self.fail_unless(isinstance(table, dict), f"{where} must be a table")
        for key, value in table.items():
            path = f"{where}.{key}" if where else key
            self.fail_unless(key in known, f"has an unknown key {path}{_hint(key, known)}; known: {', '.join(known)}")
            kind = known[key]
            ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
            self.fail_unless(ok, f"{path} must be a {kind.__name__}, got {value!r:.60}")

    def merged(self, scale: str) -> dict:
        """The grid with [scales.<scale>] merged in, every key checked (run once per scale, by __init__)."""
        base = {k: v for k, v in self.data.items() if k != "scales"}
        grid = merge(base, self.data["scales"][scale] or {})
        where = f"(at scale {scale})"
        self.check_keys(grid, TOP_KEYS, "")
        self.fail_unless(isinstance(grid.get("title"), str), "needs a title")
        self.fail_unless(grid.get("seeds", 1) >= 1, f"seeds must be >= 1 {where}")
        self.fail_unless(bool(grid.get("tasks")) and bool(grid.get("arms")), "needs [tasks.<name>] and [arms.<name>] tables")
        for arm, spec in grid["arms"].items():
            self.check_keys(spec, ARM_KEYS, f"arms.{arm}")
        for task, spec in grid["tasks"].items():
            self.check_keys(spec, TASK_KEYS, f"tasks.{task}")
            for arm in spec.get("only", []):
                self.fail_unless(arm in grid["arms"], f"tasks.{task}.only names {arm!r}, no arm of [arms]")
            for arm, change in spec.get("arms", {}).items():
                self.fail_unless(arm in grid["arms"], f"tasks.{task}.arms.{arm} names no arm of [arms]")
                self.check_keys(change, ARM_KEYS, f"tasks.{task}.arms.{arm}")
            axes = {**grid.get("axes", {}), **spec.get("axes", {})}
            for key, values in axes.items():
                self.fail_unless(isinstance(values, list) and values, f"axis {key} of {task} must be a non-empty list")
                bad = [v for v in values if isinstance(v, (dict, list)) or not SAFE.fullmatch(cell(v))]
                self.fail_unless(not bad, f"axis {key} value {bad[0]!r} cannot name a folder (letters, digits, . _ + -)"
                                 if bad else "")
            shorts = [axis_name(k) for k in axes]
            self.fail_unless(len(set(shorts)) == len(shorts), f"axes of {task} end in the same name: {sorted(axes)}")
        self.check_keys(grid.get("report", {}), REPORT_KEYS, "report")
        for i, entry in enumerate(grid.get("evaluate", [])):
            self.check_keys(entry, EVALUATE_KEYS, f"evaluate[{i}]")
            sweep = entry.get("sweep")
            self.fail_unless(bool(sweep), f'evaluate[{i}] needs a sweep, e.g. sweep = {{"position.scaling" = ["none", "pi"]}}')
            for key, values in sweep.items():
                self.fail_unless(isinstance(values, list) and values,
                                 f"evaluate[{i}].sweep.{key} must be a non-empty list")
        return grid

    def at(self, scale: str) -> AtScale:
        """The grid at `scale`, as merged and checked when the grid was read."""
        self.fail_unless(scale in self.scales, f"has no scale {scale!r}; its scales: {', '.join(self.scales)}")
        return self.scaled[scale]

    def pick(self, scale: str | None) -> AtScale:
        """The scale --scale names (default: cpu, or the grid's first scale)."""
        scale = scale or ("cpu" if "cpu" in self.scales else self.scales[0])
        if scale not in self.scales:
            raise UserError(f"unknown scale {scale!r} for {self.name}; choose from {', '.join(self.scales)}")
        return self.scaled[scale]

    # the questions of AtScale asked with the scale first, as callers outside planning ask them
    def resolved(self, scale: str) -> dict:
        return self.at(scale).data

    def preset(self, scale: str, task: str) -> Path:
        return self.at(scale).preset(task)

    def arms_of(self, scale: str, task: str) -> list[str]:
        return self.at(scale).arms_of(task)

    def axes(self, scale: str, task: str) -> dict:
        return self.at(scale).axes(task)

    def defaults(self, scale: str, kind: str) -> list[str]:
        return self.at(scale).defaults(kind)


class AtScale:
    """A grid at one scale (`Grid.at`): its merged, checked table (`data`) and what planning asks of it."""

    def __init__(self, grid: Grid, name: str, data: dict):
        self.grid, self.name, self.data = grid, name, data

    def preset(self, task: str) -> Path:
        spec = self.data["tasks"][task]
        path = self.grid.folder / spec.get("preset", "{scale}/" + task + ".toml").format(scale=self.name)
        self.grid.fail_unless(path.is_file(), f"names preset {path} for task {task!r} at scale {self.name!r}, "
                              "which does not exist")
        return path

    def arm(self, task: str, arm: str) -> dict:
        """The arm as this task sees it: [arms.<arm>] with [tasks.<task>.arms.<arm>] merged in."""
        return merge(self.data["arms"][arm], self.data["tasks"][task].get("arms", {}).get(arm, {}))

    def arms_of(self, task: str) -> list[str]:
        """The arms a task runs: its `only` list, or every arm."""
        return self.data["tasks"][task].get("only") or list(self.data["arms"])

    def axes(self, task: str) -> dict:
        return {**self.data.get("axes", {}), **self.data["tasks"][task].get("axes", {})}

    def with_values(self, tasks: list[str], axes: dict | None) -> AtScale:
        """This grid with each value `axes` names (--axis KEY=V1,V2) that the axis KEY of a chosen task
        does not declare added to it, typed as --set reads a value (6 a number, half_rope a name): a
        plugin's scheme runs beside the grid's own. Itself where no value is new."""
        data, changed = copy.deepcopy(self.data), False
        for key, values in (axes or {}).items():
            for task in tasks:
                own, common = data["tasks"][task].get("axes", {}), data.get("axes", {})
                table = own if key in own else common if key in common else None
                for value in values if table is not None else ():  # an axis no task has: cut_axes says so
                    if value not in {cell(v) for v in table[key]}:
                        self.grid.fail_unless(bool(SAFE.fullmatch(value)), f"axis {key} cannot take --axis value "
                                              f"{value!r}: it names run folders (letters, digits, . _ + -)")
                        table[key], changed = [*table[key], parse_override(f"v={value}")["v"]], True
        return AtScale(self.grid, self.name, data) if changed else self

    def evaluation_sweep(self, run: Run) -> dict:
        """The eval.sweep of a run: its config's, with that of every [[evaluate]] entry its config matches
        (later entries replace a key), checked against the run as eval.sweep ({}: the config's own alone)."""
        values, sweep = flat(to_dict(run.cfg)), {}
        for i, entry in enumerate(self.data.get("evaluate", [])):
            for key in entry.get("when", {}):
                self.grid.fail_unless(key in values, f"evaluate[{i}].when names {key!r}, no config key"
                                      f"{_hint(key, values)}")
            if all(values[key] == value for key, value in entry.get("when", {}).items()):
                sweep.update(entry["sweep"])
        if not sweep:
            return {}
        sweep = {**run.cfg.eval.sweep, **sweep}
        try:
            check_sweep(replace(run.cfg, eval=replace(run.cfg.eval, sweep=sweep)), run.task)
        except UserError as err:
            raise UserError(f"{self.grid.path} [[evaluate]] at scale {self.name}: {err}") from None
        return sweep

    def defaults(self, kind: str) -> list[str]:
        """The tasks or arms run when --tasks / --arms is not given."""
        return [name for name, spec in self.data[kind].items() if spec.get("default", True)]

    def chosen(self, kind: str, given: list[str] | None) -> list[str]:
        """The tasks or arms named by --tasks / --arms (default: the grid's default ones)."""
        given = list(dict.fromkeys(given or self.defaults(kind)))  # a name given twice is one run, not two
        bad = [name for name in given if name not in self.data[kind]]
        if bad:
            raise UserError(f"unknown {kind[:-1]} {bad[0]!r} for {self.grid.name}; "
                            f"choose from {', '.join(self.data[kind])}")
        return given

    def overrides(self, task: str, arm: str, axis_values: dict) -> list[str]:
        """--set strings of one run: the arm's `set`, the axis values, then its `multiply`
        (applied to the value those give, e.g. a plain stack k times the preset's block depth)."""
        spec, preset = self.arm(task, arm), self.preset(task)
        sets = [f"{key}={toml_value(value)}" for key, value in flat(spec.get("set", {})).items()]
        sets += [f"{key}={toml_value(value)}" for key, value in axis_values.items()]
        if spec.get("multiply"):
            values = flat(to_dict(read(preset, sets)))
            for key, factor in flat(spec["multiply"]).items():
                self.grid.fail_unless(
                    key in values and isinstance(values[key], (int, float)) and not isinstance(values[key], bool)
                    and isinstance(factor, (int, float)) and not isinstance(factor, bool),
                    f"arms.{arm}.multiply.{key}: not a number in the config, or not multiplied by a number")
                product = values[key] * factor
                if isinstance(values[key], int) and float(product).is_integer():
                    product = int(product)
                sets.append(f"{key}={toml_value(product)}")
        return sets


def find(paper: str, root: Path | None = None) -> Grid:
    """The grid of `paper`: a folder name under experiments/, or a path to a grid folder or file."""
    root = root or ROOT
    given = Path(paper)
    for path in (given, given / GRID, root / paper / GRID):
        if path.is_file() and path.suffix == ".toml":
            return Grid(path)
    raise UserError(f"unknown paper {paper!r}; choose from {', '.join(papers(root)) or 'none'} "
                    f"(or give a folder holding a {GRID})")


def papers(root: Path | None = None) -> list[str]:
    """Names of the folders under experiments/ that hold a grid.toml."""
    root = root or ROOT
    return sorted(p.parent.name for p in root.glob(f"*/{GRID}"))


def describe(root: Path | None = None) -> str:
    """`reproduce --list`: every paper with its scales, tasks and arms (* = run by default)."""
    lines = []
    for name in papers(root):
        grid = find(name, root)
        at = grid.pick(None)
        g = at.data
        mark = lambda kind, n: n + ("*" if n in at.defaults(kind) else "")  # noqa: E731
        lines += [f"{name}: {g['title']}", f"  scales: {', '.join(grid.scales)}",
                  f"  tasks:  {', '.join(mark('tasks', t) for t in g['tasks'])}",
                  f"  arms:   {', '.join(mark('arms', a) for a in g['arms'])}"]
        lines += [f"  {t} runs only: {', '.join(g['tasks'][t]['only'])}" for t in g["tasks"] if g["tasks"][t].get("only")]
        axes = sorted({k for t in g["tasks"] for k in at.axes(t)})
        if axes:
            lines.append(f"  axes:   {', '.join(axes)}")
    return "\n".join(lines + ["(* = run when --tasks / --arms is not given)"]) + "\n"


def arm_overrides(grid: Grid, scale: str, task: str, arm: str, axis_values: dict) -> list[str]:
    """--set strings of one run (`AtScale.overrides`)."""
    return grid.at(scale).overrides(task, arm, axis_values)
