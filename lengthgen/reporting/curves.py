"""Figures drawn from files beside eval.csv in each run folder: training curves
(metrics.jsonl) and the loss at each position of the evaluation window
(position_loss.csv, language-model tasks). Runs are grouped into the report's
series (lengthgen.reporting.series) and averaged over seeds; the shaded band is ± one
standard error over seeds.
"""
from __future__ import annotations

import math
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
from matplotlib.ticker import ScalarFormatter

from lengthgen.results.rows import EVALUATION_KEYS, POSITION_LOSS, read_position_loss
from lengthgen.reporting.figures import _pyplot
from lengthgen.reporting.series import key_columns, series_colors, series_labels
from lengthgen.results.metrics_log import METRICS_LOG, PREFIX as TEST_PREFIX, read_metrics


def runs_by_series(rows: list[dict], agg: list[dict]) -> dict[tuple, dict]:
    """{(task, series key): {"label", "color", "runs": [run folder, ...]}} in the report's label order."""
    keys = key_columns(rows)
    labels, colors = series_labels(agg), series_colors(agg)
    out: dict[tuple, dict] = {}
    for r in rows:
        series = tuple((k, r[k]) for k in keys if k != "task")
        entry = out.setdefault((r["task"], series), {"label": labels[series], "color": colors[series], "runs": []})
        if r["source"] not in entry["runs"]:
            entry["runs"].append(r["source"])
    return dict(sorted(out.items(), key=lambda item: (item[0][0], item[1]["label"])))


def band(ax, x, curves: list[np.ndarray], color, label: str, style: str = "-") -> None:
    """Mean over seeds with a ± standard-error band (no band for one seed)."""
    stack = np.vstack(curves)
    mean = np.nanmean(stack, 0)
    ax.plot(x, mean, style, color=color, lw=1.3, label=f"{label} ({len(curves)} seed{'s' * (len(curves) > 1)})")
    if len(curves) > 1:
        err = np.nanstd(stack, 0, ddof=1) / math.sqrt(len(curves))
        ax.fill_between(x, mean - err, mean + err, color=color, alpha=0.2, lw=0)


def metrics_of(folder: Path) -> list[dict]:
    """The rows of RUN/metrics.jsonl ([] without one); damaged lines are skipped with a note."""
    return read_metrics(Path(folder) / METRICS_LOG, skip_damaged=True)


def read_losses(rows: list[dict]) -> tuple[np.ndarray, np.ndarray]:
    """(steps, training losses) of a run's metrics rows."""
    rows = [r for r in rows if isinstance(r.get("loss"), (int, float))]
    return np.array([r["step"] for r in rows]), np.array([r["loss"] for r in rows], dtype=float)


def read_tests(rows: list[dict]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{test key (test@max, test@24, ...): (steps, exact match)} of the tests during training."""
    out: dict[str, tuple[list, list]] = {}
    for r in rows:
        for k, v in r.items():
            if k.startswith(TEST_PREFIX):
                out.setdefault(k, ([], []))[0].append(r["step"])
                out[k][1].append(v)
    return {k: (np.array(steps), np.array(values, dtype=float)) for k, (steps, values) in out.items()}


def run_label(entry: dict) -> str:
    """A series label without its stop rule ("looped, oracle stop" -> "looped"): training
    curves belong to the runs, whichever rule evaluated them."""
    return re.sub(r"(, )?[^,]* stop$", "", entry["label"]) or entry["label"]


def plot_training(rows: list[dict], agg: list[dict], path: Path) -> int:
    """Training loss against step, a panel per task, a line per series; below it, where runs
    tested during training (tests.interval), exact match against step, a line per series
    and test length (solid: the current curriculum maximum). Returns the loss panels drawn."""
    groups = runs_by_series(rows, agg)
    tasks = sorted({task for task, _ in groups})
    metrics = {folder: metrics_of(folder) for entry in groups.values() for folder in entry["runs"]}  # read once
    tests = {folder: read_tests(rows) for folder, rows in metrics.items()}
    tested = any(tests.values())
    plt = _pyplot()
    fig, axes = plt.subplots(1 + tested, len(tasks), figsize=(5 * len(tasks), 3.6 * (1 + tested)), squeeze=False)
    drawn = 0
    # a run evaluated under several stop rules sits in one series per rule: draw its curves once
    owned, seen = {}, set()
    for key, entry in groups.items():
        owned[key] = [f for f in entry["runs"] if f not in seen]
        seen.update(entry["runs"])
    for ax, task in zip(axes[0], tasks):
        for (t, series), entry in groups.items():
            runs = [read_losses(metrics[folder]) for folder in owned[(t, series)] if t == task]
            runs = [r for r in runs if len(r[0])]
            if not runs:
                continue
            width = min(len(steps) for steps, _ in runs)  # seeds log the same steps; a shorter one is cut
            band(ax, runs[0][0][:width], [losses[:width] for _, losses in runs], entry["color"], run_label(entry))
            drawn += 1
        ax.set(title=task, xlabel="training step", ylabel="training loss (nats per scored token)", yscale="log")
        ax.yaxis.set_major_formatter(ScalarFormatter())  # 2, 3, 4 rather than 2 x 10^0
        low, high = ax.get_ylim()
        if high < 10 * low:  # minor labels fit only within a decade
            ax.yaxis.set_minor_formatter(ScalarFormatter())
        if ax.lines:  # a run whose every metrics line was damaged draws nothing
            ax.legend(fontsize=7, frameon=False)
    for ax, task in zip(axes[1] if tested else [], tasks):
        for (t, series), entry in groups.items():
            folders = owned[(t, series)]
            if t != task or not folders:
                continue
            keys = sorted({k for folder in folders for k in tests[folder]}, key=lambda k: (k != "test@max", k))
            for style, k in zip(["-", "--", ":", "-."] * 8, keys):
                runs = [tests[folder][k] for folder in folders if k in tests[folder]]
                width = min(len(steps) for steps, _ in runs)
                band(ax, runs[0][0][:width], [v[:width] for _, v in runs], entry["color"],
                     f"{run_label(entry)}, {k.removeprefix(TEST_PREFIX)}", style)
        ax.set(title=f"{task}: tests during training", xlabel="training step", ylabel="exact match", ylim=(-0.02, 1.02))
        ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return drawn


def smooth(values: np.ndarray, bins: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """Mean loss over log-spaced position bins: (bin centre position, mean loss)."""
    edges = np.unique(np.geomspace(1, len(values), bins + 1).astype(int))
    edges = np.concatenate([[0], edges])
    centres = np.array([(a + b - 1) / 2 for a, b in zip(edges[:-1], edges[1:])])
    means = np.array([np.nanmean(values[a:b]) for a, b in zip(edges[:-1], edges[1:])])
    return centres, means


def plot_position_loss(rows: list[dict], agg: list[dict], path: Path, windows: list[int] | None = None) -> list[int]:
    """Mean loss at each position of the window (log-binned), a panel per window, a line per
    series; the dashed line marks the training window. Returns the windows drawn."""
    groups = runs_by_series(rows, agg)
    found: dict[tuple, dict[int, list[np.ndarray]]] = defaultdict(lambda: defaultdict(list))
    train_max = {r["task"]: r["train_max"] for r in rows}
    for key, entry in groups.items():
        for folder in entry["runs"]:
            file = Path(folder) / POSITION_LOSS
            if not file.exists():
                continue
            per_window: dict[int, list[tuple[int, float]]] = defaultdict(list)
            stretch = {k: v for k, v in key[1] if k.startswith(EVALUATION_KEYS)}  # the series' RoPE stretch, if any
            for r in read_position_loss(file):
                if all(r.get(k, "") == v for k, v in stretch.items()):
                    per_window[r["window"]].append((r["position"], r["loss"]))
            for window, values in per_window.items():
                found[key][window].append(np.array([v for _, v in sorted(values)]))
    available = sorted({w for per in found.values() for w in per})
    windows = [w for w in (windows or available[-1:]) if w in available]
    if not windows:
        return []
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(windows), figsize=(5 * len(windows), 3.6), squeeze=False)
    for ax, window in zip(axes.flat, windows):
        for key, entry in groups.items():
            curves = [c for c in found[key].get(window, []) if len(c) == window]
            if curves:
                x, _ = smooth(curves[0])
                band(ax, x + 1, [smooth(c)[1] for c in curves], entry["color"], entry["label"])
        for task, limit in train_max.items():
            if limit < window:
                ax.axvline(limit, color="k", ls="--", lw=1, label=f"training window ({limit})")
        ax.set(title=f"window {window}", xlabel="position in the window (tokens of context + 1)",
               ylabel="mean loss (nats per token)", xscale="log")
        handles, names = ax.get_legend_handles_labels()
        ax.legend(dict(zip(names, handles)).values(), dict(zip(names, handles)).keys(), fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return windows
