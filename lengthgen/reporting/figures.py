"""Figures of a report, drawn from the series of lengthgen.reporting.series.

- accuracy_vs_length: a panel per task (or per task and value of a swept option), a line
  per series, training lengths shaded;
- accuracy_vs_iteration: from per_step.csv, a panel per looped series, a line per
  test length, markers at the step each stop rule picked;
- heatmap: a metric over length x a swept task option, a panel per task and series;
- accuracy_vs_option: a metric against a swept task option at one length, a line per series.
"""
from __future__ import annotations

import math
import textwrap
from collections import defaultdict
from pathlib import Path

from lengthgen.errors import UserError
from lengthgen.reporting.series import (STEP_VALUES, as_number, key_columns, series_colors, series_labels, short_name,
                                        task_view)


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def split_panels(agg: list[dict], column: str, names: dict) -> tuple[list[dict], dict[str, int]]:
    """Rows with a `column` value (a swept task option) moved to a panel per value, titled
    "task, names[value]" (or "task, column=value"), their series without the column; and
    each panel title's rank: the order of `names`, then the values in numeric order."""
    order = list(names)
    moved, rank = [], {}
    for a in agg:
        value = a.get(column, "")
        if value == "":
            moved.append(a)
            continue
        title = f"{a['task']}, {names.get(value, f'{short_name(column)}={value}')}"
        rank[title] = (order.index(value) if value in order else len(order), as_number(value))
        moved.append({**a, "task": title, "series": tuple((k, v) for k, v in a["series"] if k != column)})
    ranked = sorted(rank, key=lambda t: (t.split(",")[0], rank[t][0], str(rank[t][1])))
    return moved, {title: i for i, title in enumerate(ranked)}


def plot(agg: list[dict], path: Path, metric: str = "accuracy", panels: str | None = None,
         names: dict | None = None, log: bool = False, xlabel: str = "") -> None:
    """`metric` vs length, one panel per task (and per value of the swept option `panels`,
    titled by `names`), training range shaded, one legend below; `log`: both axes logarithmic
    (perplexity over windows that double), else the y axis spans [0, 1]."""
    plt = _pyplot()
    rank: dict[str, int] = {}
    if panels:
        agg, rank = split_panels(agg, panels, names or {})
    tasks = sorted({a["task"] for a in agg}, key=lambda t: (t.split(",")[0], rank.get(t, -1)))
    labels = series_labels(agg)
    colors = series_colors(agg, labels)
    cols = min(3, len(tasks))
    rows_n = math.ceil(len(tasks) / cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(5 * cols, 3.4 * rows_n), squeeze=False)
    legend: dict[str, object] = {}  # label -> handle, across panels
    err_key = "stderr" if metric == "accuracy" else f"{metric}_stderr"
    for ax, task in zip(axes.flat, tasks):
        v = task_view(agg, task, labels)
        if min(v["lengths"]) <= v["train_max"]:  # shade only training lengths that were evaluated
            ax.axvspan(min(v["lengths"]) - 0.5, v["train_max"] + 0.5, color="0.9", label="training lengths")
        for key, label in zip(v["series"], v["labels"]):
            s = [v["at"][(key, n)] for n in v["lengths"] if (key, n) in v["at"]]
            err = [0 if math.isnan(a[err_key]) else a[err_key] for a in s]
            seeds = max(a["seeds"] for a in s)
            ax.errorbar([a["length"] for a in s], [a[metric] for a in s], yerr=err, marker="o", ms=3,
                        capsize=2, color=colors[key], label=f"{label} ({seeds} seed{'s' * (seeds > 1)})")
        if metric == "accuracy":
            at = {}
            for a in v["rows"]:
                at.setdefault(a["length"], []).append(a["baseline"])
            ax.plot(v["lengths"], [max(at[n]) for n in v["lengths"]], "k--", lw=1, label="random guess")
        name = "exact-match accuracy" if metric == "accuracy" else metric
        scale = {"xscale": "log", "yscale": "log"} if log else {"ylim": (-0.03, 1.03)}
        ax.set(title=task, xlabel=xlabel or "problem length n", ylabel=name, **scale)
        if log:
            from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter
            ax.set_xticks(v["lengths"], [str(n) for n in v["lengths"]])
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.yaxis.set_major_locator(LogLocator(subs=(1, 2, 5)))  # 2, 5, 10, 20, ...: labels on a short span
            ax.yaxis.set_major_formatter(ScalarFormatter())
            ax.yaxis.set_minor_formatter(NullFormatter())
        handles, names = ax.get_legend_handles_labels()
        legend.update(zip(names, handles))
    for ax in axes.flat[len(tasks):]:
        ax.axis("off")
    ncol = min(cols, len(legend))  # a legend column per panel column keeps the labels inside the figure
    # a label naming many config keys is wrapped to its column's width, not cut at the figure's edge
    names = [textwrap.fill(name, width=max(40, int(fig.get_figwidth() * 15 / ncol))) for name in legend]
    per_column = math.ceil(len(names) / ncol)  # matplotlib fills the legend column by column
    columns = [names[i:i + per_column] for i in range(0, len(names), per_column)]
    legend_height = max(0.15 * sum(n.count("\n") + 1 for n in c) + 0.07 * len(c) for c in columns) + 0.2  # inches
    fig.set_figheight(3.4 * rows_n + legend_height)
    fig.legend(list(legend.values()), names, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, legend_height / fig.get_figheight(), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_heatmap(agg: list[dict], path: Path, y: str, metric: str = "accuracy") -> None:
    """`metric` (mean over seeds) over length (x) and the column `y` (a swept task option),
    one panel per task and series (the series without `y`); the training maximum marked."""
    plt = _pyplot()
    rows = [a for a in agg if a.get(y, "") != ""]
    if not rows:
        raise UserError(f"no result row has a {y!r} column to draw a heatmap over (is it in eval.sweep?)")
    drop = lambda s: tuple((k, v) for k, v in s if k != y)  # noqa: E731
    # each panel's series, without y; a training option of y's name keeps its full key (task.options.k)
    labels = series_labels([{"series": drop(a["series"])} for a in rows], frozenset({y}))
    panels = sorted({(a["task"], drop(a["series"])) for a in rows}, key=lambda p: (p[0], labels[p[1]]))
    cols = min(3, len(panels))
    fig, axes = plt.subplots(math.ceil(len(panels) / cols), cols, squeeze=False,
                             figsize=(5.6 * cols, 3.6 * math.ceil(len(panels) / cols)))
    for ax, (task, series) in zip(axes.flat, panels):
        mine = [a for a in rows if a["task"] == task and drop(a["series"]) == series]
        xs = sorted({a["length"] for a in mine})
        ys = sorted({a[y] for a in mine}, key=as_number)
        grid = [[math.nan] * len(xs) for _ in ys]
        for a in mine:
            grid[ys.index(a[y])][xs.index(a["length"])] = a[metric]
        image = ax.imshow(grid, origin="lower", aspect="auto", vmin=0, vmax=1, cmap="viridis",
                          extent=(-0.5, len(xs) - 0.5, -0.5, len(ys) - 0.5))
        if len(xs) * len(ys) <= 120:  # small enough to print each value in its cell
            for i, row in enumerate(grid):
                for j, value in enumerate(row):
                    if not math.isnan(value):
                        ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=7,
                                color="k" if value > 0.6 else "w")
        beyond = [i for i, n in enumerate(xs) if n > mine[0]["train_max"]]
        if beyond and beyond[0] > 0:
            ax.axvline(beyond[0] - 0.5, color="w", lw=1.5, ls="--")
        ax.set_xticks(range(len(xs)), [str(n) for n in xs], rotation=90 if len(xs) > 12 else 0, fontsize=7)
        ax.set_yticks(range(len(ys)), ys, fontsize=7)
        seeds = max(a["seeds"] for a in mine)
        ax.set_title(f"{task}: {labels[series]} ({seeds} seed{'s' * (seeds > 1)})", fontsize=9)
        ax.set(xlabel="problem length n", ylabel=f"{y} (in evaluation)")
        fig.colorbar(image, ax=ax, label=metric)
    for ax in axes.flat[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_vs_option(agg: list[dict], path: Path, x: str, length: int | None = None, metric: str = "accuracy") -> int:
    """`metric` (mean ± s.e. over seeds) against the swept option `x`, at one test length (the
    longest evaluated, unless given), a panel per task, a line per series without `x` (e.g.
    one per K_train). Returns the length drawn."""
    plt = _pyplot()
    rows = [a for a in agg if a.get(x, "") != ""]
    if not rows:
        raise UserError(f"no result row has a {x!r} column to draw against (is it in eval.sweep?)")
    at = length if length is not None else max(a["length"] for a in rows)
    rows = [a for a in rows if a["length"] == at]
    if not rows:
        raise UserError(f"no result row at length {at} to draw {metric} against {x}")
    drop = lambda s: tuple((k, v) for k, v in s if k != x)  # noqa: E731
    rows = [{**a, "series": drop(a["series"])} for a in rows]
    labels = series_labels(rows, frozenset({x}))
    colors = series_colors(rows, labels)
    tasks = sorted({a["task"] for a in rows})
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.6), squeeze=False)
    err_key = "stderr" if metric == "accuracy" else f"{metric}_stderr"
    for ax, task in zip(axes.flat, tasks):
        mine = [a for a in rows if a["task"] == task]
        for series in sorted({a["series"] for a in mine}, key=lambda s: labels[s]):
            line = sorted((a for a in mine if a["series"] == series), key=lambda a: as_number(a[x]))
            seeds = max(a["seeds"] for a in line)
            ax.errorbar([as_number(a[x]) for a in line], [a[metric] for a in line],
                        yerr=[0 if math.isnan(a[err_key]) else a[err_key] for a in line], marker="o", ms=3,
                        capsize=2, color=colors[series], label=f"{labels[series]} ({seeds} seed{'s' * (seeds > 1)})")
        if metric == "accuracy":
            chance = sorted(((as_number(a[x]), a["baseline"]) for a in mine))
            ax.plot([c[0] for c in chance], [c[1] for c in chance], "k--", lw=1, label="random guess")
        ax.set(title=f"{task}, length {at}", xlabel=f"{short_name(x)} (in evaluation)",
               ylabel="exact-match accuracy" if metric == "accuracy" else metric, ylim=(-0.03, 1.03))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return at


def plot_per_step(steps: list[dict], evals: list[dict], path: Path, max_lines: int = 6) -> None:
    """Accuracy vs iteration, one line per test length (mean over seeds), one panel per
    series (every key column but the stop rule); a marker per stop rule shows the step it
    picked (mean over seeds)."""
    plt = _pyplot()
    keys = [k for k in key_columns(steps, STEP_VALUES) if k != "stop"]
    key_columns(evals)  # the same columns, "" where missing
    panel_of = lambda r: tuple(r.get(k, "") for k in keys)  # noqa: E731
    panels = sorted({panel_of(r) for r in steps})
    # a marker per stop rule the rows name (its options aside), in a fixed order
    rules = dict(zip(sorted({e["stop"].split(":")[0] for e in evals if e.get("stop")}), "osx^vDP*"))
    names = series_labels([{"series": tuple(zip(keys[1:], p[1:])) + (("stop", ""),)} for p in panels])
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        rows = [r for r in steps if panel_of(r) == panel]
        lengths = sorted({r["length"] for r in rows})
        pick = sorted({lengths[round(i * (len(lengths) - 1) / max(1, max_lines - 1))] for i in range(min(max_lines, len(lengths)))})
        colors = plt.cm.viridis([i / max(1, len(pick) - 1) for i in range(len(pick))])
        seeds = len({r["seed"] for r in rows})
        for n, color in zip(pick, colors):
            by_t = defaultdict(list)
            for r in rows:
                if r["length"] == n:
                    by_t[r["iteration"]].append(r["accuracy"])
            ts = sorted(t for t in by_t if len(by_t[t]) == seeds)
            acc = {t: sum(by_t[t]) / seeds for t in ts}
            ax.plot(ts, [acc[t] for t in ts], color=color, lw=1.2, label=f"n = {n}")
            for rule, marker in rules.items():
                chosen = [e["stop_step"] for e in evals if panel_of(e) == panel and e["length"] == n
                          and e["stop"].split(":")[0] == rule]
                if chosen:
                    t = sum(chosen) / len(chosen)
                    y = acc.get(round(t), float("nan"))
                    ax.plot([t], [y], marker=marker, color=color, ms=8, mfc="none")
        for rule, marker in rules.items():
            ax.plot([], [], marker=marker, color="k", ls="none", mfc="none", label=f"{rule} (mean step)")
        series = tuple(zip(keys[1:], panel[1:])) + (("stop", ""),)
        ax.set(title=f"{panel[0]}: {names[series]} ({seeds} seed{'s' * (seeds > 1)})", xlabel="iteration t",
               ylabel="exact-match accuracy", ylim=(-0.03, 1.03))
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_attention(folder: Path, path: Path, options: dict | None = None, length: int | None = None) -> str:
    """The attention weights of the run in `folder` on one test sequence (the run's eval seed,
    at `length`, default its training maximum, with task `options` changed, e.g. a split):
    a panel per layer and head, a row per scored position (e.g. each read), a column per key;
    where the task says which input holds each answer (Task.source_positions), a red dot
    marks it. Returns a caption. The one figure drawn from a checkpoint: it loads the model
    (lengthgen.evaluation.attention_map) when drawn, not when reporting is imported."""
    from lengthgen.evaluation.attention_map import attention_map

    seen = attention_map(folder, options, length)
    weights, sources, width, sequence = seen["weights"], seen["sources"], seen["width"], seen["sequence"]
    plt = _pyplot()
    layers, heads, scored = weights.shape[0], weights.shape[1], weights.shape[2]
    fig, axes = plt.subplots(layers, heads, figsize=(3.4 * heads, 0.6 + 0.07 * scored * layers + 0.5 * layers),
                             squeeze=False)
    for layer in range(layers):
        for head in range(heads):
            ax = axes[layer][head]
            ax.imshow(weights[layer, head], aspect="auto", cmap="Greys", vmin=0, vmax=1, interpolation="nearest")
            if sources is not None:
                ok = sources >= 0
                ax.plot(sources[ok], [i for i in range(scored) if ok[i]], "r.", ms=2.5)
            ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
    fig.supxlabel("key position (0 .. {})".format(width - 1), fontsize=8)
    fig.supylabel("query: each scored position", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    marked = " Red dots: the input that holds each answer." if sources is not None else ""
    return (f"Run {Path(folder).name}, one test sequence of {seen['task']} at length {seen['length']}"
            + (f" ({', '.join(f'{k} = {v}' for k, v in options.items())})" if options else "")
            + f": {seen['right']} of {scored} scored positions right. Darker = more weight.{marked} "
            f"Sequence: `{sequence[:120]}{'…' if len(sequence) > 120 else ''}`")
