"""Report: report.md, results.csv and figures, rebuilt from eval.csv rows only.

The series and their means over seeds come from lengthgen.reporting.series, the figures
from lengthgen.reporting.figures; this module writes the tables (a summary at multiples
of each series' own training maximum, then every length per task, a table per
metric) and puts the report together as `layout` says: its summary multiples
and its figures, accuracy_vs_length, accuracy_vs_iteration (from per_step.csv,
where runs have it) and heatmaps {kind = "heatmap", y = COLUMN, metric =
"accuracy"} of a metric over length x a swept task option. "Beyond training"
always means length > train_max, read from the rows.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from lengthgen.errors import UserError
from lengthgen.results.rows import COLUMNS, columns_of, own_metrics, write_csv
from lengthgen.reporting.curves import plot_position_loss, plot_training
from lengthgen.reporting.figures import plot, plot_attention, plot_heatmap, plot_per_step, plot_vs_option
from lengthgen.reporting.gain import section as gain_section
from lengthgen.reporting.across_tasks import section as across_tasks_section
from lengthgen.reporting.levels import section as levels_section
from lengthgen.reporting.compare import check_threshold, compare_section, parse_arms, seeds_section
from lengthgen.reporting.statistics import DEFAULT_THRESHOLD
from lengthgen.reporting.series import (aggregate, at_multiple, collect, collect_per_step, eval_files, series_labels,
                                        short_name, task_view)
from lengthgen.runtime.run_folders import REPORT_MARK, OutLock, check_overwritable

DEFAULT_LAYOUT = {"summary": [1.5, 2.0], "figures": ["accuracy_vs_length", "accuracy_vs_iteration"]}


def _cell(a: dict | None, metric: str = "accuracy") -> str:
    if a is None or metric not in a:  # e.g. a method's own metric in another method's column
        return "–"
    err = a["stderr" if metric == "accuracy" else f"{metric}_stderr"]
    return f"{a[metric]:.3f}{'' if math.isnan(err) else f' ± {err:.3f}'} ({a['seeds']})"


def summary(agg: list[dict], factors: tuple[float, ...] = (1.5, 2.0), metric: str = "accuracy",
            ratio: bool = True) -> str:
    """One row per (task, series): `metric` at multiples of the series' own training maximum
    (the looped paper's headline comparison at 1.5x and 2x), so tasks can be read side by side.
    For a metric other than accuracy the last column is the ratio of the last multiple's mean
    to the first's (perplexity at 32x over perplexity at 1x, say) instead of the random guess,
    or none with ratio=False; series without a finite value of such a metric are left out."""
    labels = series_labels(agg)
    head = " | ".join(f"{f:g}× train max" for f in factors)
    last = "random" if metric == "accuracy" else f"ratio {factors[-1]:g}× / {factors[0]:g}×" if ratio else ""
    lines = [f"| task | series | {head} |" + (f" {last} |" if last else ""),
             "|---|---|" + "---:|" * (len(factors) + bool(last))]
    for task in sorted({a["task"] for a in agg}):
        v = task_view(agg, task, labels)
        for key, label in zip(v["series"], v["labels"]):
            targets = [at_multiple(v["lengths"], v["own_max"][key], f) for f in factors]
            found = [v["at"][(key, n)] for n in targets if n and (key, n) in v["at"]]
            if metric != "accuracy" and not any(math.isfinite(a.get(metric, math.nan)) for a in found):
                continue
            if metric == "accuracy":
                odds = " / ".join(f"{a['baseline']:.2g}" for a in found)
            else:  # a ratio of means over seeds, not a mean of ratios; none where the first mean is 0
                odds = ratio_text(found, metric) if last and len(found) == len(targets) > 1 else "–"
            cells = [f"{_cell(v['at'][(key, n)], metric)} @{n}" if n and (key, n) in v["at"] else "–" for n in targets]
            lines.append(f"| {task} | {label} | " + " | ".join(cells) + (f" | {odds} |" if last else " |"))
    return "\n".join(lines) + "\n"


def ratio_text(found: list[dict], metric: str) -> str:
    """The last multiple's mean over the first's: "–" where either is not finite or the first is 0
    (a series whose mean is exactly 0 has no ratio, and is not a division by zero)."""
    first, last = found[0].get(metric, math.nan), found[-1].get(metric, math.nan)
    if not (math.isfinite(first) and math.isfinite(last)) or first == 0:
        return "–"
    return f"{last / first:.3f}"


def markdown(agg: list[dict]) -> str:
    labels = series_labels(agg)
    parts = []
    for task in sorted({a["task"] for a in agg}):
        v = task_view(agg, task, labels)
        rows, series, names, lengths, train_max, at = (v[k] for k in ("rows", "series", "labels", "lengths",
                                                                        "train_max", "at"))
        trained = f"{train_max}" if len(set(v["own_max"].values())) == 1 else \
            ", ".join(f"{v['own_max'][k]} ({label})" for k, label in zip(series, names))
        lines = [f"### {task}", ""]
        own = dict.fromkeys(m for a in rows for m in a["metrics"].split())
        for metric in ("accuracy", *own):
            what = f"`{metric}`" if metric != "accuracy" else "Next-token accuracy" \
                if "perplexity" in own else "Exact-match accuracy"  # a task evaluated over windows
            lines += [f"{what}, mean ± standard error over seeds (number of seeds in brackets); "
                      f"trained on lengths ≤ {trained}" + ("; `random` is the chance of a uniform random guess."
                                                          if metric == "accuracy" else "."), "",
                      "| length | " + " | ".join(names) + (" | random |" if metric == "accuracy" else " |"),
                      "|---:|" + "---:|" * (len(names) + (metric == "accuracy"))]
            for n in lengths:
                name = f"{n}" if n <= train_max else f"**{n}**"
                odds = f" {v['chance'][n]} |" if metric == "accuracy" else ""
                lines.append(f"| {name} | " + " | ".join(_cell(at.get((k, n)), metric) for k in series) + f" |{odds}")
            lines.append("")
        lines += ["Bold lengths are beyond training (of every series). Mean accuracy over lengths, each series "
                  "split at its own training maximum:", "",
                  "| series | ≤ train max | > train max |", "|---|---:|---:|"]
        for key, label in zip(series, names):
            inside = [a["accuracy"] for a in rows if a["series"] == key and a["length"] <= v["own_max"][key]]
            beyond = [a["accuracy"] for a in rows if a["series"] == key and a["length"] > v["own_max"][key]]
            fmt = lambda xs: f"{sum(xs) / len(xs):.3f}" if xs else "–"  # noqa: E731
            lines.append(f"| {label} | {fmt(inside)} | {fmt(beyond)} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def figure_specs(layout: dict) -> list[dict]:
    """layout["figures"] as tables: a name is {kind = name}."""
    specs = [{"kind": f} if isinstance(f, str) else dict(f) for f in layout.get("figures", [])]
    for spec in specs:
        if spec.get("kind") not in FIGURES:
            raise UserError(f"unknown report figure {spec.get('kind')!r}; choose from {', '.join(FIGURES)}")
        unknown = set(spec) - FIGURES[spec["kind"]].settings - {"kind"}
        if unknown:
            raise UserError(f"report figure {spec['kind']} has no setting {sorted(unknown)[0]!r}; "
                            f"its settings: {', '.join(sorted(FIGURES[spec['kind']].settings)) or 'none'}")
        for key in FIGURES[spec["kind"]].required:
            if not isinstance(spec.get(key), str):
                raise UserError(f"a {spec['kind']} figure needs {key} = NAME")
    for spec in layout.get("tables", []):
        if not (isinstance(spec, dict) and isinstance(spec.get("by"), str)) or set(spec) - {"by", "metrics", "names"}:
            raise UserError(f"a report table is {{by = COLUMN, metrics = [...], names = {{value = header}}}}, got {spec!r}")
    return specs


def pivot(agg: list[dict], by: str, metrics: list[str], names: dict) -> str:
    """For each task with a `by` column (a swept option) and each length: a row per series,
    a column per metric and value of `by` (headed by `names[value]` where given)."""
    rows = [a for a in agg if a.get(by, "") != ""]
    drop = lambda s: tuple((k, v) for k, v in s if k != by)  # noqa: E731
    labels = series_labels([{"series": drop(a["series"])} for a in rows], frozenset({by}))
    parts = []
    for task in sorted({a["task"] for a in rows}):
        mine = [a for a in rows if a["task"] == task]
        values = sorted({a[by] for a in mine}, key=lambda v: list(names).index(v) if v in names else len(names))
        at = {(drop(a["series"]), a[by], a["length"]): a for a in mine}
        for length in sorted({a["length"] for a in mine}):
            series = sorted({drop(a["series"]) for a in mine if a["length"] == length}, key=lambda s: labels[s])
            head = [f"{names.get(v, f'{by}={v}')} {m}" for m in metrics for v in values]
            beyond = " (beyond training)" if any(a["length"] > a["train_max"] for a in mine if a["length"] == length) else ""
            lines = [f"### {task}, length {length}{beyond}", "", "| series | " + " | ".join(head) + " |",
                     "|---|" + "---:|" * len(head)]
            for s in series:
                lines.append(f"| {labels[s]} | " + " | ".join(_cell(at.get((s, v, length)), m)
                                                             for m in metrics for v in values) + " |")
            parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def write_report(paths: list[Path], out: Path, title: str = "lengthgen report", command: str = "",
                 failures: list[str] = (), layout: dict | None = None, held: bool = False) -> Path:
    """report.md, results.csv and the figures of `layout` (DEFAULT_LAYOUT: accuracy_vs_length.png,
    plus accuracy_vs_iteration.png when runs have per_step.csv) in `out`; returns report.md's path.
    `out` is locked while the report is written (OutLock: a second report, a reproduction, an export
    or a training of that folder is refused in one line), unless the caller `held` its lock already."""
    if held:
        return write_held(paths, out, title, command, failures, layout)
    for path in paths:  # a missing input is refused before the lock, whose file would create out's parent
        eval_files(Path(path))
    with OutLock(out):
        return write_held(paths, out, title, command, failures, layout)


def write_held(paths: list[Path], out: Path, title: str, command: str, failures: list[str],
               layout: dict | None) -> Path:
    """`write_report` under the lock of `out`."""
    layout = {**DEFAULT_LAYOUT, **(layout or {})}
    specs = figure_specs(layout)
    rows = collect(paths)
    agg = aggregate(rows)
    stats = statistics_text(rows, agg, layout)  # a bad --compare is refused before anything is written
    steps = collect_per_step(paths)  # every input is read and checked before anything is written
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a folder for report.md, results.csv and the figures")
    check_overwritable(out, ("report.md", "results.csv"))
    out.mkdir(parents=True, exist_ok=True)
    runs = len({(r["source"], r["run"]) for r in rows})
    factors = tuple(layout["summary"])
    multiples = " and ".join(f"{f:g}×" for f in factors)
    text = [f"# {title}", ""]
    if command:
        text += ["Regenerate with:", "", f"    {command}", ""]
    text += [f"{runs} runs, {len(rows)} result rows (results.csv). {REPORT_MARK}", ""]
    if failures:
        text += [f"**{len(failures)} run(s) failed** and are not in the tables:", ""] + [f"- {f}" for f in failures] + [""]
    drawn = Drawn(rows, agg, steps, out)
    for spec in (spec for spec in specs if FIGURES[spec["kind"]].lead):  # e.g. a suite's main table, first
        text += FIGURES[spec["kind"]].draw(spec, drawn)
    metric = layout.get("summary_metric", "accuracy")
    what = "Exact match" if metric == "accuracy" else f"`{metric}`"
    text += ["## Summary", "", f"{what} at {multiples} the longest training length (the evaluated length "
             "after @), mean ± standard error over seeds (number of seeds in brackets).", "",
             summary(agg, factors, metric, ratio=not metric.endswith("accuracy"))] + stats
    if metric == "accuracy" and any(math.isfinite(a.get("stop_step", math.nan)) for a in agg):
        text += ["Mean read-out iteration (`stop_step`) at the same lengths, for the series with a stop rule. "
                 "For the oracle it is T(n). The first-firing rules (`halt`, `first-confident`) run each sample "
                 "that many iterations; the argmin rules run every sample to their search bound.", "",
                 summary(agg, factors, "stop_step", ratio=False)]
    for spec in layout.get("tables", []):
        metrics = spec.get("metrics", ["accuracy"])
        text += [f"## {', '.join(metrics)} by {spec['by']}", "", "Mean ± standard error over seeds (number of seeds "
                 "in brackets).", "", pivot(agg, spec["by"], metrics, spec.get("names", {}))]
    text += ["## Per task", "", markdown(agg)]
    for spec in (spec for spec in specs if not FIGURES[spec["kind"]].lead):
        swept = next((spec[k] for k in FIGURES[spec["kind"]].swept if spec.get(k)), None)
        if swept and not any(a.get(swept, "") != "" for a in agg):  # a grid run for some of its tasks only
            text += [f"(no run swept {swept}: no {spec['kind']} figure)", ""]
            continue
        text += FIGURES[spec["kind"]].draw(spec, drawn)
    # last, once every figure is drawn: a failure before this (a full disk) leaves the earlier report.md and
    # results.csv as they were, a pair; each is written to a temporary file and renamed into place
    write_csv(out / "results.csv", rows, columns_of(rows, COLUMNS))
    write_atomic(out / "report.md", "\n".join(text))
    return out / "report.md"


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise


def statistics_text(rows: list[dict], agg: list[dict], layout: dict) -> list[str]:
    """The sections over seeds (lengthgen.reporting.compare) of the score metric: layout["score"], else
    the summary's metric where it is an accuracy (a share), else accuracy; layout["threshold"] (0.9)
    for the success rate and the effective length; layout["compare"]: [ARM_A, ARM_B] pairs."""
    summary_metric = layout.get("summary_metric", "accuracy")
    metric = layout.get("score") or (summary_metric if summary_metric.endswith("accuracy") else "accuracy")
    threshold = check_threshold(layout.get("threshold", DEFAULT_THRESHOLD))
    text = seeds_section(rows, agg, threshold, metric)
    others = sorted({m for r in rows for m in own_metrics(r) if "accuracy" in m and m != metric})
    if others:  # e.g. a Chomsky grid's runs reported outside their grid, which scores by its own metric
        text[2:2] = [f"These sections score by `{metric}`{' (exact match of the whole answer)' * (metric == 'accuracy')}"
                     f"; the rows also carry {', '.join(f'`{m}`' for m in others)}. A grid that scores by one of those "
                     "names it in its `[report] score`, and its own report.md (`lengthgen reproduce`) uses it.", ""]
    for pair in layout.get("compare", []):
        text += compare_section(rows, agg, *parse_arms(pair if isinstance(pair, str) else ",".join(map(str, pair))),
                                metric=metric)
    return text


def attention_section(spec: dict, rows: list[dict], out: Path) -> list[str]:
    """The attention weights of one run (the lowest seed of the task and arm asked for) on one
    test sequence, drawn from its checkpoint: the one figure not rebuilt from rows alone."""
    mine = [r for r in rows if r["task"] == spec["task"] and r.get("arm", "") == spec.get("arm", r.get("arm", ""))]
    if not mine:
        return [f"(no run of {spec['task']} {spec.get('arm', '')} to draw attention from)", ""]
    run = min(mine, key=lambda r: (r["seed"], r["source"]))
    name = f"attention_{spec['task']}{'_' + spec['arm'] if spec.get('arm') else ''}.png"
    caption = plot_attention(Path(run["source"]), out / name, spec.get("options", {}), spec.get("length"))
    return [f"## Attention on one {spec['task']} sequence", "", caption, "", f"![attention]({name})", ""]


@dataclass
class Drawn:
    """What a figure is drawn from: the rows, their series, the per-iteration rows, the folder."""

    rows: list[dict]
    agg: list[dict]
    steps: list[dict]
    out: Path


def draw_accuracy_vs_length(spec: dict, d: Drawn) -> list[str]:
    metric, panels = spec.get("metric", "accuracy"), spec.get("panels")
    name = "accuracy_vs_length.png" if (metric, panels) == ("accuracy", None) else \
        f"{metric}_vs_length" + (f"_by_{short_name(panels)}" if panels else "") + ".png"
    plot(d.agg, d.out / name, metric, panels, spec.get("names", {}), spec.get("log", False), spec.get("xlabel", ""))
    return [f"![{metric} vs length]({name})", ""]


def draw_training_curves(spec: dict, d: Drawn) -> list[str]:
    plot_training(d.rows, d.agg, d.out / "training_curves.png")
    return ["## Training curves", "", "Training loss against step: mean over seeds, the band ± one standard error. "
            "Runs that tested during training (`tests.interval`) add a row below: exact match against step at "
            "the curriculum's current maximum (solid) and at each test length.", "",
            "![training curves](training_curves.png)", ""]


def draw_position_loss(spec: dict, d: Drawn) -> list[str]:
    shown = plot_position_loss(d.rows, d.agg, d.out / "position_loss.png", spec.get("windows"))
    if not shown:
        return []
    return ["## Loss at each position of the window", "",
            f"Mean test loss at each position of windows of {', '.join(map(str, shown))} tokens (averaged in "
            "log-spaced bins of positions): mean over seeds, the band ± one standard error; the dashed line is the "
            "training window.", "", "![loss at each position](position_loss.png)", ""]


def draw_accuracy_vs_iteration(spec: dict, d: Drawn) -> list[str]:
    if not d.steps:
        return []
    plot_per_step(d.steps, d.rows, d.out / "accuracy_vs_iteration.png")
    return ["## Accuracy after every iteration", "",
            "Lines: mean exact match over seeds after iteration t, per test length. Markers: the step each stop rule "
            "picked (per-sample confidence: its mean step).", "", "![accuracy vs iteration](accuracy_vs_iteration.png)", ""]


def draw_heatmap(spec: dict, d: Drawn) -> list[str]:
    metric, y = spec.get("metric", "accuracy"), spec["y"]
    name = f"{metric}_by_length_and_{short_name(y)}.png"
    plot_heatmap(d.agg, d.out / name, y, metric)
    return [f"## {metric} over length and {short_name(y)}", "",
            "Mean over seeds; the dashed line ends the training lengths.", "", f"![{metric} heatmap]({name})", ""]


def draw_accuracy_vs_option(spec: dict, d: Drawn) -> list[str]:
    metric, x = spec.get("metric", "accuracy"), spec["x"]
    name = f"{metric}_vs_{short_name(x)}.png"
    at = plot_vs_option(d.agg, d.out / name, x, spec.get("length"), metric)
    return [f"## {metric} against {short_name(x)} at length {at}", "",
            "Mean ± standard error over seeds; the dashed line is random guessing.", "", f"![{metric} vs {short_name(x)}]({name})", ""]


def draw_across_tasks(spec: dict, d: Drawn) -> list[str]:  # every row (e.g. arm x scheme) on every task
    return across_tasks_section(spec, d.agg, d.out, _cell)


def draw_attention(spec: dict, d: Drawn) -> list[str]:
    return attention_section(spec, d.rows, d.out)


def draw_levels(spec: dict, d: Drawn) -> list[str]:  # a suite's main table in its published layout
    return levels_section(spec, d.rows)


def draw_gain_by_sparsity(spec: dict, d: Drawn) -> list[str]:  # each short model against its reference
    return gain_section(spec, d.rows, d.agg, d.out)


@dataclass(frozen=True)
class Figure:
    """A report figure kind: its settings, those it cannot go without (each a NAME), the setting
    naming a swept column it needs (no run swept it: the figure is skipped with a note), and the
    function that draws it and returns its section of report.md; a `lead` one comes first."""

    settings: frozenset
    draw: object
    required: tuple = ()
    swept: tuple = ()
    lead: bool = False  # drawn first, before the summary (a table the report leads with)


FIGURES = {
    "accuracy_vs_length": Figure(frozenset({"panels", "names", "metric", "log", "xlabel"}), draw_accuracy_vs_length),
    "accuracy_vs_iteration": Figure(frozenset(), draw_accuracy_vs_iteration),
    "heatmap": Figure(frozenset({"y", "metric"}), draw_heatmap, ("y",), ("y",)),
    "attention": Figure(frozenset({"task", "arm", "options", "length"}), draw_attention, ("task",)),
    "accuracy_vs_option": Figure(frozenset({"x", "length", "metric"}), draw_accuracy_vs_option, ("x",), ("x",)),
    "training_curves": Figure(frozenset(), draw_training_curves),
    "across_tasks": Figure(frozenset({"at", "rows", "metric", "separating"}), draw_across_tasks),
    "position_loss": Figure(frozenset({"windows"}), draw_position_loss),
    "levels": Figure(frozenset({"groups", "columns", "best", "names", "published", "metric"}), draw_levels, lead=True),
    "gain_by_sparsity": Figure(frozenset({"reference", "buckets", "select", "examples"}), draw_gain_by_sparsity,
                               ("reference",)),
}
