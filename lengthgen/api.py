"""lengthgen from Python: what the commands do, as functions (docs/api.md).

    import lengthgen
    run = lengthgen.train("looped/cpu/parity", {"train.steps": 300}, out="runs/p")
    rows = run.evaluate(lengths=range(1, 25), stops=["oracle"])
    run = lengthgen.load("runs/p")
    report = lengthgen.reproduce("looped", tasks=["parity"], arms=["looped", "ntp"], seeds=1, out="runs/demo")
    rows = lengthgen.evaluate("runs/p", "1:40", stops=["oracle", "confidence"])  # keywords: lengthgen.EvalSettings

Each command of the CLI (lengthgen.cli) is a thin layer over one function here: it parses its flags,
calls the function and prints what it returns, so the two cannot drift. Errors are the commands' own
one-line errors, raised as exceptions (`lengthgen.ConfigError`, `lengthgen.UserError`, ...), never
SystemExit. Overrides are a dict of dotted keys (`{"train.steps": 300, "task.options": {"k": 3}}`)
or the CLI's `KEY=VALUE` strings. The options of `evaluate` and `reproduce` are the fields of one
object each, `EvalSettings` (lengthgen.evaluation.settings) and `ReproduceRequest`
(lengthgen.reproduction.request), which document them: give the keywords, or the object (and
keywords replacing some of its fields). Nothing heavy is imported until a function runs.
"""
from __future__ import annotations

import csv
import difflib
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from lengthgen.config.presets import Preset, bundled
from lengthgen.config.schema import Config
from lengthgen.errors import UserError, path_problem
from lengthgen.plugins import load as load_plugins

if TYPE_CHECKING:  # the annotations' classes; their modules load when a function runs
    from lengthgen.evaluation.settings import EvalSettings
    from lengthgen.reproduction.request import ReproduceRequest

Overrides = Mapping[str, object] | Sequence[str] | None
PresetLike = str | Path | Config | None


def override_strings(overrides: Overrides) -> list[str]:
    """`{"train.steps": 300}` -> ["train.steps=300"]; a list of KEY=VALUE strings as it is."""
    from lengthgen.reproduction.request import override_texts
    return list(override_texts(overrides))


def load_config(preset: PresetLike = None, overrides: Overrides = None, plugins: Iterable[str] = ()) -> Config:
    """A run's config, checked: defaults <- `preset` (a bundled preset's name such as
    "looped/cpu/parity", a TOML path, or a Config) <- `overrides`; `plugins` loaded and recorded."""
    return assembled_config(preset, overrides, plugins).cfg


def assembled_config(preset: PresetLike, overrides: Overrides, plugins: Iterable[str]):
    """The assembled run (lengthgen.assembly.runs.Run) of `load_config`'s arguments."""
    from lengthgen.assembly.runs import new_run

    return new_run(preset, override_strings(overrides), list(plugins))  # the preset's plugins first, then these


def train(preset: PresetLike = None, overrides: Overrides = None, *, out: str | Path | None = None,
          resume: bool = False, force: bool = False, progress: bool = True, plugins: Iterable[str] = (),
          defaults: bool = False) -> TrainedRun:
    """Train one run and return it. `preset`: a bundled preset's name ("looped/cpu/parity", see
    `presets()`), a TOML path or a Config; None trains the schema's defaults only with `defaults=True`.
    `out`: the run folder (default runs/<preset>-s<seed>); an existing run is refused unless `force`
    (which deletes only a lengthgen run) or `resume` (continue from its latest checkpoint, with its
    saved config: no preset or overrides then). `plugins`: modules or .py files to import first,
    recorded in the run folder. Tests during training run as the config's [tests] says."""
    from lengthgen.evaluation.during_training import training_tests
    from lengthgen.training.trainer import train as train_run

    if resume:
        if preset is not None or overrides:
            raise UserError("a run being resumed keeps its saved config: give no preset or overrides with resume")
        if out is None:
            raise UserError("resume needs the run folder (out)")
        load_plugins(list(plugins))
        summary = train_run(None, Path(out), resume=True, force=force, progress=progress, hooks=training_tests)
        return TrainedRun(out, summary)
    if preset is None and not defaults:
        raise UserError("name a preset (`lengthgen presets` lists the bundled ones, e.g. looped/cpu/parity) or a "
                        "TOML file; to train the schema's defaults alone, say so: --defaults (in Python, defaults=True)")
    run = assembled_config(preset, overrides, plugins)
    folder = Path(out) if out is not None else default_folder(preset, run.cfg.train.model_seed)
    summary = train_run(run, folder, force=force, progress=progress, hooks=training_tests)
    return TrainedRun(folder, summary)


def default_folder(preset: PresetLike, seed: int) -> Path:
    """runs/<preset's stem>-s<seed>: the folder of a run trained without `out`."""
    stem = Path(preset).stem if isinstance(preset, (str, Path)) else "run"
    return Path("runs") / f"{stem}-s{seed}"


def load(folder: str | Path) -> TrainedRun:
    """An existing run folder (or a folder of `lengthgen export`), its plugins imported."""
    return TrainedRun(folder)


def evaluate(folder: str | Path, lengths=None, samples: int | None = None, *, settings: EvalSettings | None = None,
             **options) -> list[dict]:
    """Evaluate a run at `lengths` (a spec such as "1:40" or "8,16", an int, or ints such as
    range(1, 25); default the run's eval.lengths) with `samples` per length (default eval.samples);
    writes eval.csv (into `out` instead of the run folder where given) and returns its new rows as
    dicts. The other keywords are the fields of `lengthgen.EvalSettings`, which documents each:
    `stops` (stop rules of a looped run: "oracle", "fixed:12", "confidence", ...), `batch_size`,
    `seed`, `per_step` (a looped run's accuracy after every iteration too, per_step.csv), `sweep`
    (task options, or position.scaling, to evaluate each value of), `position_draws`, `compile`,
    `out`, `progress`. `settings`: an EvalSettings to start from, whose fields the keywords replace.
    A keyword that names no setting is a TypeError naming it."""
    from lengthgen.evaluation.evaluate import evaluate_run, latest_state, run_folder
    from lengthgen.evaluation.settings import EvalSettings

    given = {name: value for name, value in (("lengths", lengths), ("samples", samples)) if value is not None}
    settings = with_options(EvalSettings, settings, {**given, **options}, "evaluate")  # each value checked
    check_stops(settings.stops)  # before the run is loaded
    if settings.lengths is None or settings.samples is None or settings.stops or settings.per_step or \
            (settings.position_draws or 1) > 1:
        check_against_run(latest_state(folder)[2], run_folder(folder), settings)  # what the settings need of the run
    return evaluate_run(Path(folder), settings)


def with_options(kind: type, given, options: dict, function: str):
    """`given` (a `kind`, or None: `kind`'s defaults) with `options` replacing its fields. The
    keywords of `function` are the fields of `kind`: one that names none is a TypeError of one line
    naming it, the closest field and every field."""
    names = [f.name for f in fields(kind)]
    for name in options:
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            raise TypeError(f"{function}() got an unexpected keyword argument {name!r}"
                            + (f" (did you mean {close[0]}?)" if close else "")
                            + f"; its options, the fields of lengthgen.{kind.__name__}: {', '.join(names)}")
    if given is None:
        return kind(**options)
    if not isinstance(given, kind):
        raise TypeError(f"{function}() takes its options as a lengthgen.{kind.__name__}, got {type(given).__name__}")
    return replace(given, **options)


def check_stops(stops: Sequence[str]) -> None:
    """Each stop rule parsed (loop counts past any run's need refused) before the run is loaded."""
    from lengthgen.methods.looped.stop_rules import parse_rule

    try:
        for stop in stops:
            parse_rule(stop)
    except ValueError as err:
        raise UserError(str(err)) from None


def check_against_run(run, folder: Path, settings: EvalSettings) -> None:
    """--stop and --per-step need a method with stop rules, --position-draws (above 1) a transform
    that draws IDs at evaluation."""
    for flag, given in (("--stop", settings.stops), ("--per-step", settings.per_step)):
        if given and not run.method.has_stop_rules:
            raise UserError(f"{flag} applies to methods with stop rules (looped); {folder} was trained with method "
                            f"{run.cfg.method!r}")
    draws = settings.position_draws or 1
    if draws > 1 and not run.transform.random_at_evaluation:
        raise UserError(f"--position-draws {draws} applies to runs whose position transform draws IDs at evaluation "
                        f"(randomized); {folder} was trained with {run.cfg.data.position_transform!r}")


def reproduce(paper: str | Path, request: ReproduceRequest | None = None, /, **options) -> Report:
    """Train, evaluate and report a paper's grid (a name of `papers()`, or a folder holding a
    grid.toml). The keywords are the fields of `lengthgen.ReproduceRequest`, which documents each:
    `tasks`, `arms` (the grid's names; default its default ones), `scale`, `seeds`, `out`,
    `workers`, `threads`, `samples`, `overrides` (for every run), `axes` (some values of the grid's
    axes, or new ones: {"model.position": ["half_rope", "rope"]}, a plugin's scheme beside a
    baseline), `plugins` (imported here and by every worker, recorded in each run), `progress`,
    `stack_seeds`, `backend` ("local" or "ray"), `address`, `gpus_per_job`. `request`: a
    ReproduceRequest to start from, whose fields the keywords replace. A keyword that names no
    option is a TypeError naming it. Finished runs are kept, so a rerun continues. Returns the
    report; RunsFailed (with the others' report) if some runs failed."""
    from lengthgen.reproduction.request import ReproduceRequest
    from lengthgen.reproduction.runner import reproduce as run_grid

    return Report(run_grid(str(paper), with_options(ReproduceRequest, request, options, "reproduce")))


def report(dirs: str | Path | Sequence[str | Path], out: str | Path | None = None, *, heatmaps: Sequence[str] = (),
           curves: bool = False, gain_reference: str | None = None, across_tasks: Sequence[str] | str | None = None,
           compare: str | Sequence[str] | None = None, threshold: float | None = None) -> Report:
    """report.md, results.csv and figures from the eval.csv files under `dirs` (run folders or folders
    holding runs), written into `out` (default the first of `dirs`). `heatmaps`: swept options to draw
    over length; `curves`: training curves; `across_tasks`: the columns of a ranked cross-task figure;
    `compare`: "ARM_A,ARM_B", Welch's test of two arms; `threshold`: a seed's success score."""
    from lengthgen.reporting.report import DEFAULT_LAYOUT, write_report

    dirs = [dirs] if isinstance(dirs, (str, Path)) else list(dirs)
    if not dirs:
        raise UserError("report needs at least one run folder or folder of runs")
    first = Path(dirs[0])
    across = across_tasks.split(",") if isinstance(across_tasks, str) else list(across_tasks or [])
    compare = ",".join(compare) if compare is not None and not isinstance(compare, str) else compare
    figures = DEFAULT_LAYOUT["figures"] + [{"kind": "heatmap", "y": y} for y in heatmaps] + \
        ["training_curves"] * curves + \
        ([{"kind": "gain_by_sparsity", "reference": gain_reference}] if gain_reference else []) + \
        ([{"kind": "across_tasks", "rows": across}] if across else [])
    given = out
    out = Path(out if out is not None else (first.parent if first.is_file() else first))  # RUN/eval.csv -> RUN
    command = shlex.join(["lengthgen", "report", *map(str, dirs)] + (["--out", str(given)] if given is not None else [])
                         + [a for y in heatmaps for a in ("--heatmap", y)] + ["--curves"] * curves
                         + (["--gain-reference", gain_reference] if gain_reference else [])
                         + (["--across-tasks", ",".join(across)] if across else [])
                         + (["--compare", compare] if compare else [])
                         + (["--threshold", f"{threshold:g}"] if threshold is not None else []))
    stats = {"compare": [compare] if compare else [], **({"threshold": threshold} if threshold is not None else {})}
    return Report(write_report([Path(d) for d in dirs], out, command=command, layout={"figures": figures, **stats}))


def export(run: str | Path, out: str | Path, force: bool = False) -> list[str]:
    """A finished run as a Hugging Face folder (docs/export.md) in `out`; returns the notes on what
    the folder cannot express. `force` replaces an earlier export there."""
    from lengthgen.export.export import export_run
    return export_run(Path(run), Path(out), force=force)


def presets() -> list[Preset]:
    """Every bundled preset (`.name` is what `train` takes, e.g. looped/cpu/parity), by paper, scale, task."""
    return bundled()


def papers() -> list[str]:
    """The bundled grids `reproduce` takes by name."""
    from lengthgen.reproduction.grid import papers as grid_names
    return grid_names()


@dataclass
class Report:
    """A written report: `path` (report.md), `folder`, its `text`, and `rows()` (results.csv as dicts)."""
    path: Path

    @property
    def folder(self) -> Path:
        return self.path.parent

    @property
    def text(self) -> str:
        return self.path.read_text(encoding="utf-8")

    def rows(self) -> list[dict]:
        """results.csv: one dict per result row, numbers as numbers."""
        from lengthgen.reporting.series import as_number

        with open(self.folder / "results.csv", newline="", encoding="utf-8") as f:
            return [{k: as_number(v) for k, v in row.items()} for row in csv.DictReader(f)]

    def _repr_markdown_(self) -> str:  # a notebook shows the report itself
        return self.text


class TrainedRun:
    """A run folder (or a folder of `lengthgen export`): its config, task, method and model, loaded
    when first asked for, and what can be done with it. Its plugins are imported as it loads."""

    def __init__(self, folder: str | Path, summary: dict | None = None):
        self.folder = Path(folder)
        self.summary = summary or {}  # what training returned, for a run `train` just trained: step, device, ...
        if not self.folder.is_dir():
            raise UserError(f"run folder {self.folder} {path_problem(self.folder, 'folder')}")

    def __repr__(self) -> str:
        return f"TrainedRun({str(self.folder)!r})"

    @cached_property
    def _latest(self):
        from lengthgen.evaluation.evaluate import latest_state
        return latest_state(self.folder)  # (checkpoint, state, assembled run): plugins imported, config checked

    @property
    def cfg(self) -> Config:
        """The run's config, as it trained."""
        return self._latest[2].cfg

    @property
    def task(self):
        return self._latest[2].task

    @property
    def method(self):
        return self._latest[2].method

    @property
    def step(self) -> int:
        """The step of the latest checkpoint."""
        return int(self._latest[1]["step"])

    @cached_property
    def model(self):
        """The trained model (the EMA weights where the run kept them), in eval mode."""
        from lengthgen.evaluation.evaluate import load_assembled
        return load_assembled(self.folder)[1]

    def evaluate(self, lengths=None, stops: Sequence[str] | None = None, samples: int | None = None,
                 **options) -> list[dict]:
        """`lengthgen.evaluate` of this run: rows as dicts, also merged into its eval.csv."""
        return evaluate(self.folder, lengths, samples, stops=stops, **options)

    def rows(self) -> list[dict]:
        """Every row of the run's eval.csv (typed), [] before any evaluation."""
        from lengthgen.results.rows import read_rows
        path = self.folder / "eval.csv"
        return read_rows(path) if path.exists() else []

    def log(self) -> list[dict]:
        """The training log (metrics.jsonl): a dict per logged step."""
        from lengthgen.results.metrics_log import METRICS_LOG, read_metrics
        path = self.folder / METRICS_LOG
        return read_metrics(path) if path.exists() else []

    def report(self, out: str | Path | None = None, **options) -> Report:
        """`lengthgen.report` of this run alone."""
        return report([self.folder], out, **options)

    def export(self, out: str | Path, force: bool = False) -> list[str]:
        """`lengthgen.export` of this run."""
        return export(self.folder, out, force)
