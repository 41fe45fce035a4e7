"""lengthgen from Python: what the commands do, as functions (docs/api.md).

    import lengthgen
    run = lengthgen.train("looped/cpu/parity", {"train.steps": 300}, out="runs/p")
    rows = run.evaluate(lengths=range(1, 25), stops=["oracle"])
    run = lengthgen.load("runs/p")
    report = lengthgen.reproduce("looped", tasks=["parity"], arms=["looped", "ntp"], seeds=1, out="runs/demo")

Each command of the CLI (lengthgen.cli) is a thin layer over one function here: it parses its flags,
calls the function and prints what it returns, so the two cannot drift. Errors are the commands' own
one-line errors, raised as exceptions (`lengthgen.ConfigError`, `lengthgen.UserError`, ...), never
SystemExit. Overrides are a dict of dotted keys (`{"train.steps": 300, "task.options": {"k": 3}}`)
or the CLI's `KEY=VALUE` strings. Nothing heavy is imported until a function runs.
"""
from __future__ import annotations

import csv
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from lengthgen.config.presets import Preset, bundled
from lengthgen.config.schema import Config, from_data, parse_lengths, read, to_dict, toml_value, with_overrides
from lengthgen.errors import UserError, path_problem
from lengthgen.plugins import load as load_plugins

Overrides = Mapping[str, object] | Sequence[str] | None
PresetLike = str | Path | Config | None


def override_strings(overrides: Overrides) -> list[str]:
    """`{"train.steps": 300}` -> ["train.steps=300"]; a list of KEY=VALUE strings as it is."""
    if overrides is None:
        return []
    if isinstance(overrides, Mapping):
        return [f"{key}={toml_value(value)}" for key, value in overrides.items()]
    if isinstance(overrides, str):  # one "KEY=VALUE" string: not a sequence of one-letter overrides
        return [overrides]
    return [str(text) for text in overrides]


def load_config(preset: PresetLike = None, overrides: Overrides = None, plugins: Iterable[str] = ()) -> Config:
    """A run's config, checked: defaults <- `preset` (a bundled preset's name such as
    "looped/cpu/parity", a TOML path, or a Config) <- `overrides`; `plugins` loaded and recorded."""
    return assembled_config(preset, overrides, plugins).cfg


def assembled_config(preset: PresetLike, overrides: Overrides, plugins: Iterable[str]):
    """The assembled run (lengthgen.assembly.Run) of `load_config`'s arguments."""
    from lengthgen.assembly import checked, derived_defaults

    sets = override_strings(overrides)
    cfg = with_overrides(from_data(to_dict(preset)), sets) if isinstance(preset, Config) else read(preset, sets)
    cfg.plugins = list(dict.fromkeys(cfg.plugins + load_plugins(list(plugins))))  # the preset's own first
    return derived_defaults(checked(cfg))


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


def evaluate(folder: str | Path, lengths=None, samples: int | None = None, *, stops: Sequence[str] | None = None,
             batch_size: int | None = None, seed: int | None = None, per_step: bool = False,
             sweep: Mapping[str, list] | None = None, position_draws: int | None = None, compile: bool = False,
             out: str | Path | None = None, progress: bool = True) -> list[dict]:
    """Evaluate a run at `lengths` (a spec such as "1:40" or "8,16", an int, or ints such as
    range(1, 25); default the run's eval.lengths) with `samples` per length (default eval.samples);
    writes eval.csv (into `out` instead of the run folder where given) and returns its new rows as
    dicts. `stops`: stop rules of a looped run ("oracle", "fixed:12", "confidence", ...);
    `sweep`: task options (or position.scaling) to evaluate each value of; `per_step`: a looped
    run's accuracy after every iteration too (per_step.csv)."""
    from lengthgen.config.schema import MAX_EVAL_SEED
    from lengthgen.evaluation.evaluate import evaluate_run, latest_state, run_folder

    if samples is not None and samples < 1:
        raise UserError(f"--samples must be >= 1, got {samples}")
    if seed is not None and not 0 <= seed < MAX_EVAL_SEED:
        raise UserError(f"--seed must be in [0, 2**40), as eval.seed, got {seed}")
    if batch_size is not None and batch_size < 1:
        raise UserError(f"--batch-size must be >= 1, got {batch_size}")
    if position_draws is not None and not 1 <= position_draws <= 1000:
        raise UserError(f"--position-draws must be in [1, 1000], got {position_draws}")
    stops = [stops] if isinstance(stops, str) else list(stops or [])
    check_stops(stops)
    lengths = None if lengths is None else length_list(lengths)  # refused before the run is loaded
    draws = position_draws if position_draws is not None and position_draws > 1 else None
    if lengths is None or samples is None or stops or per_step or draws:
        run = latest_state(folder)[2]  # what the options need of the run
        check_against_run(run, run_folder(folder), stops, per_step, draws)
        lengths = run.cfg.eval.lengths if lengths is None else lengths
        samples = run.cfg.eval.samples if samples is None else samples
    return evaluate_run(Path(folder), length_list(lengths) if isinstance(lengths, str) else lengths, samples, batch_size, seed, stops=stops or None,
                        per_step=per_step, progress=progress, sweep=dict(sweep) if sweep else None,
                        out=Path(out) if out is not None else None, position_draws=position_draws,
                        compile=True if compile else None)


def check_stops(stops: list[str]) -> None:
    """Each stop rule parsed (loop counts past any run's need refused) before the run is loaded."""
    from lengthgen.methods.looped.stop_rules import parse_rule

    try:
        for stop in stops:
            parse_rule(stop)
    except ValueError as err:
        raise UserError(str(err)) from None


def check_against_run(run, folder: Path, stops: list[str], per_step: bool, draws: int | None) -> None:
    """--stop and --per-step need a method with stop rules, --position-draws a transform that draws IDs."""
    for flag, given in (("--stop", stops), ("--per-step", per_step)):
        if given and not run.method.has_stop_rules:
            raise UserError(f"{flag} applies to methods with stop rules (looped); {folder} was trained with method "
                            f"{run.cfg.method!r}")
    if draws and not run.transform.random_at_evaluation:
        raise UserError(f"--position-draws {draws} applies to runs whose position transform draws IDs at evaluation "
                        f"(randomized); {folder} was trained with {run.cfg.data.position_transform!r}")


def length_list(lengths) -> list[int]:
    """Test lengths from a spec ("1:40", "10:50:10", "8,16,32"), an int, or ints, checked as eval.lengths."""
    if isinstance(lengths, int) and not isinstance(lengths, bool):
        lengths = str(lengths)
    elif not isinstance(lengths, str):
        items = list(lengths)
        if not items or not all(isinstance(n, int) and not isinstance(n, bool) for n in items):
            raise UserError(f"lengths must be a spec such as '1:40', an int, or ints, got {items!r:.60}")
        lengths = ",".join(map(str, items))
    return parse_lengths(lengths)


def reproduce(paper: str | Path, *, tasks: Sequence[str] | str | None = None, arms: Sequence[str] | str | None = None,
              seeds: int | None = None, scale: str | None = None, out: str | Path | None = None,
              workers: int | None = None, threads: int = 0, samples: int = 0, overrides: Overrides = None,
              axes: Mapping[str, Sequence] | None = None, plugins: Iterable[str] = (), progress: bool = True,
              stack_seeds: bool = False, backend: str = "local", address: str | None = None,
              gpus_per_job: float | None = None) -> Report:
    """Train, evaluate and report a paper's grid (a name of `papers()`, or a folder holding a
    grid.toml). `tasks`, `arms`: the grid's names (default its default ones); `axes`: some values of
    the grid's axes, or new ones ({"model.position": ["half_rope", "rope"]}: a plugin's scheme beside
    a baseline); `overrides`: for every run; `plugins`: imported here and by every worker, recorded in
    each run. Finished runs are kept, so a rerun continues. Returns the report; RunsFailed (with the
    others' report) if some runs failed."""
    from lengthgen.reproduction.runner import reproduce as run_grid

    split = lambda names: [n.strip() for n in names.split(",") if n.strip()] if isinstance(names, str) else names  # noqa: E731
    tasks, arms = split(tasks), split(arms)
    for kind, given in (("tasks", tasks), ("arms", arms)):
        if given is not None and not list(given):  # "--tasks ,": refused rather than read as "all of them"
            raise UserError(f"--{kind} names no {kind[:-1]}; leave it out to run the default ones")
    plugins = load_plugins(list(plugins))
    axes = {str(key): [value_text(v) for v in values] for key, values in (axes or {}).items()}
    path = run_grid(str(paper), scale, seeds, list(tasks) if tasks is not None else None,
                    list(arms) if arms is not None else None, Path(out) if out is not None else None, workers,
                    samples, progress=progress, extra=override_strings(overrides), threads=threads, backend=backend,
                    address=address, gpus_per_job=gpus_per_job, axes=axes, stack_seeds=stack_seeds, plugins=plugins)
    return Report(path)


def value_text(value) -> str:
    """An axis value as a folder name and --axis spell it (0.5, true, rope)."""
    from lengthgen.results.rows import cell
    return value if isinstance(value, str) else cell(value)


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
