"""Report: Markdown tables and a figure, rebuilt from eval.csv rows only.

Runs are grouped into series by (task, method, position); a series' value at
a length is the mean over its seeds, shown with the standard error of that
mean (sample standard deviation / sqrt(seeds)) and the number of seeds. Runs of
one series that differ in train_max, or at one length in baseline or n, are
runs of different configs, not seeds: the report refuses to average them.
"Beyond training" always means length > train_max, read from the rows.
"""
from __future__ import annotations

import csv
import math
from collections import defaultdict
from pathlib import Path

from .errors import UserError
from .evaluate import COLUMNS, read_per_step, read_rows


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
        for f in files:
            got = read_rows(f)
            if not got:
                raise UserError(f"{f} holds no result rows (evaluate the run again or leave it out)")
            rows += [{**r, "source": str(f.parent)} for r in got]  # names the run in error messages
    return rows


def mean_stderr(values: list[float]) -> tuple[float, float]:
    k = len(values)
    mean = sum(values) / k
    if k < 2:
        return mean, float("nan")
    var = sum((v - mean) ** 2 for v in values) / (k - 1)
    return mean, math.sqrt(var / k)


def check_same_config(rows: list[dict]) -> None:
    """Refuse to average runs of different configs as seeds: within a series every run
    must have one train_max, and at each length one baseline (task options) and one n."""
    def refuse(a: dict, b: dict, field: str, where: str) -> None:
        name = lambda r: r.get("source", r["run"])  # noqa: E731
        raise UserError(f"{name(a)} and {name(b)} differ in {field} ({a[field]} vs {b[field]}) in "
                        f"{a['task']}/{a['method']}/{a['position']}{where}: they are runs of different configs, "
                        f"not seeds; report them separately")

    first: dict[tuple, dict] = {}
    for r in rows:
        series = (r["task"], r["method"], r["position"], r["stop"])
        other = first.setdefault(series, r)
        if other["train_max"] != r["train_max"]:
            refuse(other, r, "train_max", "")
        other = first.setdefault((*series, r["length"]), r)
        for field in ("baseline", "n"):
            if other[field] != r[field]:
                refuse(other, r, field, f" at length {r['length']}")


def aggregate(rows: list[dict]) -> list[dict]:
    """One row per (task, method, position, length): mean, stderr, seeds, baseline."""
    check_same_config(rows)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["task"], r["method"], r["position"], r["stop"], r["length"])].append(r)
    out = []
    for (task, method, position, stop, length), rs in sorted(groups.items()):
        seeds = sorted({r["seed"] for r in rs})
        if len(seeds) != len(rs):
            raise UserError(f"{task}/{method}/{position}/{stop} has several rows for one seed at length {length}: "
                            f"pass each run once")
        mean, err = mean_stderr([r["accuracy"] for r in rs])
        tok, _ = mean_stderr([r["token_accuracy"] for r in rs])
        out.append({"task": task, "method": method, "position": position, "stop": stop, "length": length,
                    "accuracy": mean, "stderr": err, "seeds": len(rs), "token_accuracy": tok,
                    "train_max": rs[0]["train_max"], "baseline": rs[0]["baseline"],
                    "samples": sum(r["n"] for r in rs)})
    return out


SERIES = ("method", "position", "stop")


def series_key(a: dict) -> tuple:
    return tuple(a[k] for k in SERIES)


def series_label(key: tuple, positions_differ: bool) -> str:
    method, position, stop = key
    label = f"{method} ({position})" if positions_differ else method
    return f"{label}, {stop} stop" if stop else label


def _cell(a: dict | None) -> str:
    if a is None:
        return "–"
    err = "" if math.isnan(a["stderr"]) else f" ± {a['stderr']:.3f}"
    return f"{a['accuracy']:.3f}{err} ({a['seeds']})"


def at_multiple(lengths: list[int], train_max: int, factor: float) -> int | None:
    """The shortest evaluated length at or beyond factor x train_max (None if none)."""
    beyond = [n for n in lengths if n >= factor * train_max]
    return min(beyond) if beyond else None


def task_view(agg: list[dict], task: str) -> dict:
    """One task's aggregated rows, indexed the way both report tables read them."""
    rows = [a for a in agg if a["task"] == task]
    # decided over the whole report: colours are per series across panels and the figure's
    # legend merges equal labels, so a label must name the same series in every panel
    differ = len({a["position"] for a in agg}) > 1
    series = sorted({series_key(a) for a in rows})
    own = {series_key(a): a["train_max"] for a in rows}  # one per series (aggregate checks it)
    return {"rows": rows, "series": series, "labels": [series_label(k, differ) for k in series],
            "lengths": sorted({a["length"] for a in rows}), "train_max": max(own.values()), "own_max": own,
            "at": {(*series_key(a), a["length"]): a for a in rows},
            "baseline": {a["length"]: a["baseline"] for a in rows}}


def summary(agg: list[dict], factors: tuple[float, ...] = (1.5, 2.0)) -> str:
    """One row per (task, series): accuracy at 1.5x and 2x the training maximum,
    the paper's headline comparison, so tasks can be read side by side."""
    head = " | ".join(f"{f:g}× train max" for f in factors)
    lines = [f"| task | series | {head} | random |", "|---|---|" + "---:|" * (len(factors) + 1)]
    for task in sorted({a["task"] for a in agg}):
        v = task_view(agg, task)
        for key, label in zip(v["series"], v["labels"]):  # each series at multiples of its own train_max
            targets = [at_multiple(v["lengths"], v["own_max"][key], f) for f in factors]
            chance = " / ".join(f"{v['baseline'][n]:.2g}" for n in targets if n)
            cells = [f"{_cell(v['at'][(*key, n)])} @{n}" if n and (*key, n) in v["at"] else "–" for n in targets]
            lines.append(f"| {task} | {label} | " + " | ".join(cells) + f" | {chance} |")
    return "\n".join(lines) + "\n"


def markdown(agg: list[dict]) -> str:
    parts = []
    for task in sorted({a["task"] for a in agg}):
        v = task_view(agg, task)
        rows, series, labels, lengths, train_max, at = (v[k] for k in ("rows", "series", "labels", "lengths",
                                                                         "train_max", "at"))
        trained = f"{train_max}" if len(set(v["own_max"].values())) == 1 else \
            ", ".join(f"{v['own_max'][k]} ({label})" for k, label in zip(series, labels))
        lines = [f"### {task}", "",
                 f"Exact-match accuracy, mean ± standard error over seeds (number of seeds in brackets); "
                 f"trained on lengths ≤ {trained}; `random` is the chance of a uniform random guess.", "",
                 "| length | " + " | ".join(labels) + " | random |",
                 "|---:|" + "---:|" * (len(labels) + 1)]
        for n in lengths:
            base = v["baseline"][n]
            name = f"{n}" if n <= train_max else f"**{n}**"
            lines.append(f"| {name} | " + " | ".join(_cell(at.get((*k, n))) for k in series) + f" | {base:.2g} |")
        lines += ["", "Bold lengths are beyond training (of every series). Mean over lengths, each series "
                  "split at its own training maximum:", "",
                  "| series | ≤ train max | > train max |", "|---|---:|---:|"]
        for key, label in zip(series, labels):
            inside = [a["accuracy"] for a in rows if series_key(a) == key and a["length"] <= v["own_max"][key]]
            beyond = [a["accuracy"] for a in rows if series_key(a) == key and a["length"] > v["own_max"][key]]
            fmt = lambda xs: f"{sum(xs) / len(xs):.3f}" if xs else "–"  # noqa: E731
            lines.append(f"| {label} | {fmt(inside)} | {fmt(beyond)} |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def series_colors(agg: list[dict]) -> dict[tuple, str]:
    """One colour per series, the same in every panel."""
    return {key: f"C{i % 10}" for i, key in enumerate(sorted({series_key(a) for a in agg}))}


def plot(agg: list[dict], path: Path) -> None:
    """Accuracy vs length, one panel per task, training range shaded, one legend below."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({a["task"] for a in agg})
    colors = series_colors(agg)
    cols = min(3, len(tasks))
    rows_n = math.ceil(len(tasks) / cols)
    fig, axes = plt.subplots(rows_n, cols, figsize=(5 * cols, 3.4 * rows_n), squeeze=False)
    legend: dict[str, object] = {}  # label -> handle, across panels
    for ax, task in zip(axes.flat, tasks):
        v = task_view(agg, task)
        if min(v["lengths"]) <= v["train_max"]:  # shade only training lengths that were evaluated
            ax.axvspan(min(v["lengths"]) - 0.5, v["train_max"] + 0.5, color="0.9", label="training lengths")
        for key, label in zip(v["series"], v["labels"]):
            s = [v["at"][(*key, n)] for n in v["lengths"] if (*key, n) in v["at"]]
            err = [0 if math.isnan(a["stderr"]) else a["stderr"] for a in s]
            seeds = max(a["seeds"] for a in s)
            ax.errorbar([a["length"] for a in s], [a["accuracy"] for a in s], yerr=err, marker="o", ms=3,
                        capsize=2, color=colors[key], label=f"{label} ({seeds} seed{'s' * (seeds > 1)})")
        ax.plot(v["lengths"], [v["baseline"][n] for n in v["lengths"]], "k--", lw=1, label="random guess")
        ax.set(title=task, xlabel="problem length n", ylabel="exact-match accuracy", ylim=(-0.03, 1.03))
        handles, labels = ax.get_legend_handles_labels()
        legend.update(zip(labels, handles))
    for ax in axes.flat[len(tasks):]:
        ax.axis("off")
    ncol = min(cols, len(legend))  # a legend column per panel column keeps the labels inside the figure
    legend_height = 0.2 * math.ceil(len(legend) / ncol) + 0.2  # inches
    fig.set_figheight(3.4 * rows_n + legend_height)
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, legend_height / fig.get_figheight(), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def collect_per_step(paths: list[Path]) -> list[dict]:
    """Rows of every per_step.csv under the given folders (written by `eval --per-step`)."""
    rows = []
    for path in map(Path, paths):
        files = [path] if path.is_file() and path.name == "per_step.csv" else \
            sorted(path.rglob("per_step.csv")) if path.is_dir() else []
        for f in files:
            rows += read_per_step(f)
    return rows


def plot_per_step(steps: list[dict], evals: list[dict], path: Path, max_lines: int = 6) -> None:
    """Accuracy vs iteration, one line per test length (mean over seeds), one panel per
    (task, method, position); markers show the step each stop rule picked (mean over seeds)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = sorted({(r["task"], r["method"], r["position"]) for r in steps})
    differ = len({p[2] for p in panels}) > 1  # name the scheme only where it tells panels apart
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    markers = {"oracle": ("o", "oracle T(n)"), "confidence": ("x", "confidence (per batch)"),
               "confidence-per-sample": ("^", "confidence (per sample, mean)")}
    for ax, (task, method, position) in zip(axes.flat, panels):
        rows = [r for r in steps if (r["task"], r["method"], r["position"]) == (task, method, position)]
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
            for stop, (marker, _) in markers.items():
                chosen = [e["stop_step"] for e in evals if (e["task"], e["method"], e["position"], e["stop"],
                                                            e["length"]) == (task, method, position, stop, n)]
                if chosen:
                    t = sum(chosen) / len(chosen)
                    y = acc.get(round(t), float("nan"))
                    ax.plot([t], [y], marker=marker, color=color, ms=8, mfc="none" if marker != "x" else color)
        for stop, (marker, label) in markers.items():
            ax.plot([], [], marker=marker, color="k", ls="none", mfc="none" if marker != "x" else "k", label=label)
        name = f"{method}, {position}" if differ else method
        ax.set(title=f"{task}: {name} ({seeds} seed{'s' * (seeds > 1)})", xlabel="iteration t",
               ylabel="exact-match accuracy", ylim=(-0.03, 1.03))
        ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(paths: list[Path], out: Path, title: str = "lengthgen report", command: str = "",
                 failures: list[str] = ()) -> Path:
    """report.md, results.csv and accuracy_vs_length.png (plus accuracy_vs_iteration.png
    when runs have per_step.csv) in `out`; returns report.md's path."""
    rows = collect(paths)
    agg = aggregate(rows)
    steps = collect_per_step(paths)  # every input is read and checked before anything is written
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; give a folder for report.md, results.csv and the figures")
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
    text += [f"{runs} runs, {len(rows)} result rows (results.csv). Every number below is rebuilt from those rows.", ""]
    if failures:
        text += [f"**{len(failures)} run(s) failed** and are not in the tables:", ""] + [f"- {f}" for f in failures] + [""]
    text += ["## Summary", "", "Exact match at 1.5× and 2× the longest training length (the evaluated length "
             "after @), mean ± standard error over seeds (number of seeds in brackets).", "",
             summary(agg), "## Per task", "", markdown(agg), "![accuracy vs length](accuracy_vs_length.png)", ""]
    if steps:
        plot_per_step(steps, rows, out / "accuracy_vs_iteration.png")
        text += ["## Accuracy after every iteration", "",
                 "Lines: mean exact match over seeds after iteration t, per test length. Markers: the step "
                 "each stop rule picked (per-sample confidence: its mean step).", "",
                 "![accuracy vs iteration](accuracy_vs_iteration.png)", ""]
    (out / "report.md").write_text("\n".join(text))
    return out / "report.md"
