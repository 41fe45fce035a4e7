"""A suite's main table in its published layout (report figure kind `levels`): tasks grouped by
level (e.g. the Chomsky hierarchy's R, DCF, CS), one column per arm (a model and encoding), each
cell a score over seeds; and beside it the published numbers the layout carries, with their source.

A run's score is its mean `metric` over the lengths beyond training (lengthgen.reporting.statistics.
seed_scores, as Delétang et al. score a model). A cell gives the best score over the arm's runs in
that task (its seeds, and every value of any axis the grid sweeps, e.g. the learning rate: the
papers' "max over seeds and learning rates") and, in brackets, the mean ± standard error over seeds
of the arm's best series (the axis values with the highest mean) and its seed count. `best`
columns take the best score over several arms (the paper's Transformer column: the best of its
encodings). Scores are in percent, as the published tables print them.

Layout (a [[report.figures]] table of the grid):
    kind = "levels"
    metric = "chomsky_accuracy"                     # default accuracy
    groups = {R = ["even_pairs", ...], DCF = [...]}  # level -> its tasks, in table order
    columns = ["nope", "rand-rope", ...]            # arms, in order (default: every arm run)
    best = {Transformer = ["nope", "rope", ...]}     # extra columns: the best over these arms
    names = {even_pairs = "Even Pairs"}             # row names (default the task's)
    published = {source = "...", columns = {RNN = {even_pairs = 100.0, ...}, ...}}
"""
from __future__ import annotations

import math

from lengthgen.errors import UserError
from lengthgen.reporting.series import mean_stderr
from lengthgen.reporting.statistics import seed_scores


def arm_of(series: tuple) -> str:
    d = dict(series)
    return d.get("arm", "") or d.get("method", "")


def arm_cells(rows: list[dict], metric: str) -> dict[tuple[str, str], dict]:
    """{(task, arm): {"max": best run's score, "series": [its series' seed scores]}}."""
    out: dict[tuple[str, str], dict] = {}
    for (task, series), s in seed_scores(rows, metric).items():
        values = [v for v in s["scores"].values() if math.isfinite(v)]
        if not values:
            continue
        cell = out.setdefault((task, arm_of(series)), {"max": -math.inf, "series": []})
        cell["max"] = max(cell["max"], max(values))
        cell["series"].append(values)
    return out


def cell_text(cell: dict | None) -> str:
    if cell is None:
        return "–"
    best = max(cell["series"], key=lambda v: sum(v) / len(v))
    mean, err = mean_stderr(best)
    spread = "" if math.isnan(err) else f" ± {100 * err:.1f}"
    return f"{100 * cell['max']:.1f} ({100 * mean:.1f}{spread}, {len(best)})"


def check_spec(spec: dict) -> None:
    groups = spec.get("groups")
    if not (isinstance(groups, dict) and groups and all(isinstance(t, list) and t for t in groups.values())):
        raise UserError("a levels table needs groups = {LEVEL = [tasks, ...], ...}")
    for key in ("columns",):
        if key in spec and not (isinstance(spec[key], list) and all(isinstance(c, str) for c in spec[key])):
            raise UserError(f"levels {key} must be a list of arm names, got {spec[key]!r}")
    for key in ("best", "names", "published"):
        if key in spec and not isinstance(spec[key], dict):
            raise UserError(f"levels {key} must be a table, got {spec[key]!r}")


def table(header: list[str], lines: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (len(header) - 2)] + \
           ["| " + " | ".join(line) + " |" for line in lines]


def ours(spec: dict, cells: dict, tasks: list[tuple[str, str]]) -> list[str]:
    run = {arm for _, arm in cells}
    listed = spec.get("columns") or []
    # the listed arms in their order (one not run has no column), then any other arm that ran (--arms)
    arms = [arm for arm in listed if arm in run] + sorted(run - set(listed))
    best = spec.get("best", {})
    names = spec.get("names", {})
    columns = [(arm, [arm]) for arm in arms] + [(f"{label} (best)", list(of)) for label, of in best.items()
                                                if set(of) & run]
    lines, sums = [], {c: [] for c, _ in columns}
    for level, task in tasks:
        row = [level, names.get(task, task)]
        for column, of in columns:
            found = [cells[(task, a)] for a in of if (task, a) in cells]
            cell = None if not found else {"max": max(c["max"] for c in found),
                                           "series": [s for c in found for s in c["series"]]}
            row.append(cell_text(cell))
            if cell is not None:
                sums[column].append(cell["max"])
        lines.append(row)
    lines.append(["", "mean of the tasks' best"] + [f"{100 * sum(v) / len(v):.1f} ({len(v)})" if v else "–"
                                                     for v in sums.values()])
    return table(["level", "task"] + [c for c, _ in columns], lines)


def published(spec: dict, tasks: list[tuple[str, str]]) -> list[str]:
    given = spec.get("published")
    if not given:
        return []
    columns = given.get("columns", {})
    names = spec.get("names", {})
    lines = [[level, names.get(task, task)] + [f"{columns[c][task]:.1f}" if task in columns[c] else "–"
                                               for c in columns] for level, task in tasks]
    return ["### Published", "", str(given.get("source", "")), ""] + table(["level", "task", *columns], lines) + [""]


def section(spec: dict, rows: list[dict]) -> list[str]:
    """The report's main table (and the published one beside it) as Markdown lines."""
    check_spec(spec)
    metric = spec.get("metric", "accuracy")
    cells = arm_cells(rows, metric)
    run = {task for task, _ in cells}
    tasks = [(level, task) for level, group in spec["groups"].items() for task in group if task in run]
    if not tasks:
        return ["(no task of the levels table was run: no main table)", ""]
    return ["## Main table: tasks by level, one column per arm", "",
            f"Each cell: the best run's score, `{metric}` averaged over the lengths beyond training, in % (the "
            "published tables' statistic: the maximum over seeds and any swept axis); in brackets the mean ± "
            "standard error over seeds of the arm's best series and its number of seeds. `(best)` columns take "
            "the best of several arms.", ""] + ours(spec, cells, tasks) + [""] + published(spec, tasks)
