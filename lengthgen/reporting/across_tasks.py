"""The across-tasks section of a report: one cell per (row, task), a metric at a multiple of each
series' own training maximum (accuracy at 2x by default), where a row is the values of the
columns the layout names (e.g. arm and positional scheme); a heatmap of the cells, their table
with standard errors and the chance of a random guess, and the rows ranked by mean reciprocal
rank across tasks, as Kazemnejad et al. (NeurIPS 2023) rank positional encodings: over every task,
and over the tasks that separate the rows (some row well above chance), which order them."""
from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

from lengthgen.errors import UserError
from lengthgen.reporting.figures import _pyplot
from lengthgen.reporting.series import at_multiple


def cells(agg: list[dict], rows_by: list[str], at: float) -> dict[tuple, dict]:
    """{(row, task): the aggregated row of that series at the first length >= at x its training
    maximum}. Two series landing in one cell is an error: the columns do not tell them apart."""
    lengths = defaultdict(set)
    for a in agg:
        lengths[(a["task"], a["series"])].add(a["length"])
    out, origin = {}, {}
    for a in agg:
        if a["length"] != at_multiple(sorted(lengths[(a["task"], a["series"])]), a["train_max"], at):
            continue
        cell = (tuple(str(a.get(c, "")) for c in rows_by), a["task"])
        if cell in out and origin[cell] != a["series"]:
            raise UserError(f"rows {rows_by} do not tell apart two series of {a['task']} "
                            f"({dict(origin[cell])} and {dict(a['series'])}); add the column that differs to rows")
        out[cell], origin[cell] = a, a["series"]
    return out


def ranks(values: dict[tuple, float]) -> dict[tuple, int]:
    """Competition ranks (1 = best; equal values share the better rank; NaN ranks last)."""
    score = {k: (v if math.isfinite(v) else -math.inf) for k, v in values.items()}
    return {k: 1 + sum(other > v for other in score.values()) for k, v in score.items()}


def mean_reciprocal_rank(table: dict[tuple, dict], metric: str) -> dict[tuple, float]:
    """Each row's mean over the tasks it ran of 1 / its rank among the rows of that task."""
    by_task = defaultdict(dict)
    for (row, task), a in table.items():
        by_task[task][row] = a[metric]
    reciprocal = defaultdict(list)
    for values in by_task.values():
        for row, rank in ranks(values).items():
            reciprocal[row].append(1 / rank)
    return {row: sum(r) / len(r) for row, r in reciprocal.items()}


def separating(table: dict[tuple, dict], metric: str, gain: float) -> list[str]:
    """The tasks where some row's mean closes at least `gain` of the gap from the random guess to
    a perfect score. In the others every row is near chance, and the order of their means, read
    from noise, would rank the rows all the same."""
    best, chance = defaultdict(lambda: -math.inf), {}
    for (_, task), a in table.items():
        best[task] = max(best[task], a[metric]) if math.isfinite(a[metric]) else best[task]
        chance[task] = a["baseline"]
    return sorted(t for t in best if math.isfinite(chance[t]) and chance[t] < 1
                  and (best[t] - chance[t]) / (1 - chance[t]) >= gain)


def label(row: tuple) -> str:
    return " · ".join(v for v in row if v) or "(all)"


def plot_across_tasks(table: dict[tuple, dict], order: list[tuple], tasks: list[str], path: Path, metric: str,
                title: str) -> None:
    plt = _pyplot()
    grid = [[table[(row, t)][metric] if (row, t) in table else math.nan for t in tasks] for row in order]
    fig, ax = plt.subplots(figsize=(1.3 * len(tasks) + 2.5, 0.32 * len(order) + 1.6))
    image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=1 if metric.endswith("accuracy") else None, aspect="auto")
    for i, line in enumerate(grid):
        for j, v in enumerate(line):
            if math.isfinite(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="w" if v < 0.6 else "k")
    ax.set_xticks(range(len(tasks)), tasks, rotation=30, ha="right", fontsize=8)
    ax.set_yticks(range(len(order)), [label(r) for r in order], fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.colorbar(image, ax=ax, fraction=0.03)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def section(spec: dict, agg: list[dict], out: Path, cell_text) -> list[str]:
    """The report's across-tasks section: heatmap, ranking and table (`cell_text` formats a cell)."""
    metric, at, rows_by = spec.get("metric", "accuracy"), spec.get("at", 2.0), spec.get("rows", ["arm"])
    if not (isinstance(rows_by, list) and rows_by and all(isinstance(c, str) for c in rows_by)):
        raise UserError(f"across_tasks rows must be a list of column names, e.g. [\"arm\", \"position\"]; got {rows_by!r}")
    if isinstance(at, bool) or not isinstance(at, (int, float)) or at <= 0:
        raise UserError(f"across_tasks at must be a positive multiple of the training length; got {at!r}")
    gain = spec.get("separating", 0.1)
    if isinstance(gain, bool) or not isinstance(gain, (int, float)) or not 0 <= gain <= 1:
        raise UserError(f"across_tasks separating must be a fraction of the gap from chance to perfect, 0..1; got {gain!r}")
    table = cells(agg, rows_by, at)
    if not table:
        return [f"(no series was evaluated at {at:g}× its training length: no across-tasks table)", ""]
    tasks = sorted({t for _, t in table})
    mrr = mean_reciprocal_rank(table, metric)
    kept = separating(table, metric, gain) if metric.endswith("accuracy") else tasks
    on_separating = mean_reciprocal_rank({k: a for k, a in table.items() if k[1] in kept}, metric)
    key = on_separating if on_separating else mrr  # rank by the tasks that separate the rows, where there are any
    order = sorted(mrr, key=lambda r: (-key.get(r, 0.0), -mrr[r], label(r)))
    name = f"across_tasks_{metric}_at_{at:g}x.png"
    plot_across_tasks(table, order, tasks, out / name, metric, f"{metric} at {at:g}× the training length, mean over seeds")
    ranked = ranks({r: key.get(r, 0.0) for r in mrr})
    left_out = [t for t in tasks if t not in kept]
    lines = [f"## {metric} at {at:g}× the training length: every {' × '.join(rows_by)} on every task", "",
             f"Each cell: {metric} at the first evaluated length at or beyond {at:g}× the series' own longest "
             "training length, mean over seeds. In each task the rows are ranked by that mean (equal means share "
             "the better rank); a row's mean reciprocal rank (MRR, as Kazemnejad et al. rank positional encodings) "
             "is the mean of 1 / rank over the tasks it ran (1 = best everywhere). `MRR` counts every task; "
             f"`MRR, separating` only the tasks where some row closes at least {gain:g} of the gap from the random "
             "guess to a perfect score, and orders the rows: elsewhere every row is near chance and its rank is "
             "noise." + (f" Left out of it here: {', '.join(left_out)}." if left_out else ""), "",
             f"![{metric} across tasks]({name})", "",
             "| rank | " + " · ".join(rows_by) + " | MRR, separating | MRR | " + " | ".join(tasks) + " |",
             "|---:|---|---:|---:|" + "---:|" * len(tasks)]
    for row in order:
        lines.append(f"| {ranked[row]} | {label(row)} | "
                     + (f"{on_separating[row]:.3f}" if row in on_separating else "–") + f" | {mrr[row]:.3f} | "
                     + " | ".join(cell_text(table.get((row, t)), metric) for t in tasks) + " |")
    chance = {t: next((a["baseline"] for (r, task), a in table.items() if task == t), math.nan) for t in tasks}
    lengths = {t: sorted({a["length"] for (r, task), a in table.items() if task == t}) for t in tasks}
    lines += ["| | random guess | | | " + " | ".join(f"{chance[t]:.2g}" for t in tasks) + " |",
              "| | length | | | " + " | ".join(",".join(map(str, lengths[t])) for t in tasks) + " |", ""]
    return lines
