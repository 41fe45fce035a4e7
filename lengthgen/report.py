"""Report: Markdown tables and a figure, rebuilt from eval.csv rows only.

Runs are grouped into series by (task, method, position); a series' value at
a length is the mean over its seeds, shown with the standard error of that
mean (sample standard deviation / sqrt(seeds)) and the number of seeds.
"Beyond training" always means length > train_max, read from the rows.
"""
from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path

from .errors import UserError
from .evaluate import COLUMNS, read_rows


def collect(paths: list[Path]) -> list[dict]:
    """Rows of every eval.csv in the given run folders, CSV files or folders of runs."""
    rows = []
    for path in map(Path, paths):
        if path.is_file():
            files = [path]
        elif path.is_dir():
            files = sorted(path.rglob("eval.csv"))
        else:
            raise UserError(f"{path} does not exist")
        if not files:
            raise UserError(f"no eval.csv under {path} (run `lengthgen eval RUN_DIR` first)")
        rows += [r for f in files for r in read_rows(f)]
    return rows


def mean_stderr(values: list[float]) -> tuple[float, float]:
    k = len(values)
    mean = sum(values) / k
    if k < 2:
        return mean, float("nan")
    var = sum((v - mean) ** 2 for v in values) / (k - 1)
    return mean, math.sqrt(var / k)


def aggregate(rows: list[dict]) -> list[dict]:
    """One row per (task, method, position, length): mean, stderr, seeds, baseline."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["task"], r["method"], r["position"], r["length"])].append(r)
    out = []
    for (task, method, position, length), rs in sorted(groups.items()):
        seeds = sorted({r["seed"] for r in rs})
        if len(seeds) != len(rs):
            raise UserError(f"{task}/{method}/{position} has several rows for one seed at length {length}: "
                            f"pass each run once")
        mean, err = mean_stderr([r["accuracy"] for r in rs])
        tok, _ = mean_stderr([r["token_accuracy"] for r in rs])
        out.append({"task": task, "method": method, "position": position, "length": length,
                    "accuracy": mean, "stderr": err, "seeds": len(rs), "token_accuracy": tok,
                    "train_max": max(r["train_max"] for r in rs), "baseline": rs[0]["baseline"],
                    "samples": sum(r["n"] for r in rs)})
    return out


def series_label(method: str, position: str, positions_differ: bool) -> str:
    return f"{method} ({position})" if positions_differ else method


def _cell(a: dict | None) -> str:
    if a is None:
        return "–"
    err = "" if math.isnan(a["stderr"]) else f" ± {a['stderr']:.3f}"
    return f"{a['accuracy']:.3f}{err} ({a['seeds']})"


def markdown(agg: list[dict]) -> str:
    parts = []
    for task in sorted({a["task"] for a in agg}):
        rows = [a for a in agg if a["task"] == task]
        differ = len({a["position"] for a in rows}) > 1
        series = sorted({(a["method"], a["position"]) for a in rows})
        labels = [series_label(m, p, differ) for m, p in series]
        lengths = sorted({a["length"] for a in rows})
        train_max = max(a["train_max"] for a in rows)
        at = {(a["method"], a["position"], a["length"]): a for a in rows}
        lines = [f"### {task}", "",
                 f"Exact-match accuracy, mean ± standard error over seeds (number of seeds in brackets); "
                 f"trained on lengths ≤ {train_max}; `random` is the chance of a uniform random guess.", "",
                 "| length | " + " | ".join(labels) + " | random |",
                 "|---:|" + "---:|" * (len(labels) + 1)]
        for n in lengths:
            base = next(a["baseline"] for a in rows if a["length"] == n)
            name = f"{n}" if n <= train_max else f"**{n}**"
            lines.append(f"| {name} | " + " | ".join(_cell(at.get((m, p, n))) for m, p in series) + f" | {base:.2g} |")
        lines += ["", "Bold lengths are beyond training. Mean over lengths:", "",
                  "| series | ≤ train max | > train max |", "|---|---:|---:|"]
        for (m, p), label in zip(series, labels):
            inside = [a["accuracy"] for a in rows if (a["method"], a["position"]) == (m, p) and a["length"] <= train_max]
            beyond = [a["accuracy"] for a in rows if (a["method"], a["position"]) == (m, p) and a["length"] > train_max]
            fmt = lambda v: f"{sum(v) / len(v):.3f}" if v else "–"  # noqa: E731
            lines.append(f"| {label} | {fmt(inside)} | {fmt(beyond)} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def plot(agg: list[dict], path: Path) -> None:
    """Accuracy vs length, one panel per task, training range shaded."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({a["task"] for a in agg})
    cols = min(3, len(tasks))
    rows_n = math.ceil(len(tasks) / cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(5 * cols, 3.6 * rows_n), squeeze=False)
    for ax, task in zip(axes.flat, tasks):
        rows = [a for a in agg if a["task"] == task]
        differ = len({a["position"] for a in rows}) > 1
        lengths = sorted({a["length"] for a in rows})
        train_max = max(a["train_max"] for a in rows)
        ax.axvspan(min(lengths) - 0.5, train_max + 0.5, color="0.9", label="training lengths")
        for m, p in sorted({(a["method"], a["position"]) for a in rows}):
            s = sorted((a for a in rows if (a["method"], a["position"]) == (m, p)), key=lambda a: a["length"])
            err = [0 if math.isnan(a["stderr"]) else a["stderr"] for a in s]
            seeds = max(a["seeds"] for a in s)
            ax.errorbar([a["length"] for a in s], [a["accuracy"] for a in s], yerr=err, marker="o", ms=3,
                        capsize=2, label=f"{series_label(m, p, differ)} ({seeds} seed{'s' * (seeds > 1)})")
        base = {a["length"]: a["baseline"] for a in rows}
        ax.plot(lengths, [base[n] for n in lengths], "k--", lw=1, label="random guess")
        ax.set(title=task, xlabel="problem length n", ylabel="exact-match accuracy", ylim=(-0.03, 1.03))
        ax.legend(fontsize=7, loc="lower left")
    for ax in axes.flat[len(tasks):]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(paths: list[Path], out: Path, title: str = "lengthgen report", command: str = "") -> Path:
    """report.md, results.csv and accuracy_vs_length.png in `out`; returns report.md's path."""
    rows = collect(paths)
    agg = aggregate(rows)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with (out / "results.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: r[k] for k in COLUMNS} for r in rows)
    plot(agg, out / "accuracy_vs_length.png")
    runs = len({(r["task"], r["method"], r["position"], r["seed"]) for r in rows})
    text = [f"# {title}", ""]
    if command:
        text += ["Regenerate with:", "", f"    {command}", ""]
    text += [f"{runs} runs, {len(rows)} result rows (results.csv). Every number below is rebuilt from those rows.", "",
             markdown(agg), "![accuracy vs length](accuracy_vs_length.png)", ""]
    (out / "report.md").write_text("\n".join(text))
    return out / "report.md"
