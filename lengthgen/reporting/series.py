"""Series: rows grouped by the values that tell two configs apart, averaged over seeds.

Rows are grouped into series by every column that is not a metric, a per-run
number or the length: task, arm, method, position, stop rule, the run's labels
(dotted config keys such as task.options.k, written by a reproduction) and the
task options swept in evaluation. A series' value at a length is the mean over
its seeds with the standard error of that mean (sample standard deviation /
sqrt(seeds)) and the number of seeds. Runs whose saved configs (config.toml)
differ in anything but their seeds are never one series: `collect` labels them
with the keys that differ, and refuses a run whose config it cannot read (no
config.toml, or an empty one) where it would be averaged with other runs. The
replicates of a series are its runs' (train.model_seed, data.seed) pairs:
runs that differ only in their data seed are two seeds of one config. Runs of
one series that differ in train_max, or at one length in baseline or n, are
runs of different configs, not seeds: `aggregate` refuses to average them. The report's tables
(lengthgen.reporting.report) and figures (lengthgen.reporting.figures) read what this module builds.
"""
from __future__ import annotations

import math
import sys
from collections import defaultdict
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from lengthgen.config.schema import PER_RUN_KEYS, RUNTIME_KEYS, flat, read, to_dict
from lengthgen.errors import ConfigError, UserError, path_problem
from lengthgen.results.rows import BOOKKEEPING, METRICS, cell, metric_names, own_metrics, read_per_step, read_rows

KEYS = ("task", "arm", "method", "position", "stop")  # columns every row has that tell series apart
STEP_VALUES = ("iteration", "accuracy", "confidence", "oracle_step")  # per_step.csv's measured columns


def eval_files(path: Path) -> list[Path]:
    """The eval.csv files a report reads from `path` (one, or every one under a folder); refused in
    one line when there are none."""
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(path.rglob("eval.csv"))
    else:  # missing, a dangling link, a FIFO, a device: said as what it is
        raise UserError(f"{path} {path_problem(path, 'run folder or eval.csv')}")
    if not files:
        raise UserError(f"no eval.csv under {path} (run `lengthgen eval RUN_DIR` first)")
    return files


def collect(paths: list[Path]) -> list[dict]:
    """Rows of every eval.csv in the given run folders, CSV files or folders of runs."""
    rows = []
    for path in map(Path, paths):
        for f in eval_files(path):
            got = read_rows(f)
            if not got:
                raise UserError(f"{f} holds no result rows (evaluate the run again or leave it out)")
            rows += [{**r, "source": str(f.parent)} for r in got]  # names the run in error messages
    label_config_differences(rows)
    return rows


# Keys that do not change what a run computes or which test set it was scored on: seeds, how it
# ran, and the evaluation defaults that `lengthgen eval` options override (the rows record those).
NOT_CONFIG = RUNTIME_KEYS | set(PER_RUN_KEYS) | {
    "train.log_interval", "train.checkpoint_interval", "eval.lengths", "eval.samples", "eval.batch_size"}


def saved_config(folder: Path) -> dict | None:
    """The flattened config.toml of a run folder (None where there is none, e.g. a CSV file alone).
    An empty one (truncated, or a placeholder) would read as every default and label the run as
    another config: it is damaged, as a garbled one is."""
    path = folder / "config.toml"
    if not path.is_file():
        return None
    try:
        empty = not tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # not TOML or not UTF-8: `read` names what is wrong
        empty = False
    if empty:
        raise UserError(f"{path} is empty, not a readable run config (it would read as every default): restore it, "
                        "or leave the run out of the report")
    try:
        return flat(to_dict(read(path)))
    except ConfigError as err:
        raise UserError(f"{path} is not a readable run config: {err}") from None


def label_config_differences(rows: list[dict]) -> None:
    """Runs the report would average as seeds of one series (same task, arm, method, position and
    labels) but whose saved configs differ in more than their seeds get each differing key as a
    label column (e.g. optim.lr), as a reproduction labels its runs: two configs are never one
    series. Each row gets its run's data.seed (`data_seed`), which tells replicates apart
    with the model seed. A run without a config.toml cannot be checked: it is reported only
    where it is alone in its series (a single run, or an eval.csv of its own), and refused where
    it would be averaged with other runs (see refuse_unchecked)."""
    configs = {source: saved_config(Path(source)) for source in dict.fromkeys(r["source"] for r in rows)}
    runs = defaultdict(set)
    for r in rows:  # what every row of a run shares; swept options and the stop rule vary within a run
        runs[tuple((k, r.get(k, "")) for k in KEYS if k != "stop") +
             tuple(sorted((k, v) for k, v in r.items() if "." in k))].add(r["source"])
    added = {}
    for sources in runs.values():
        if len(sources) > 1 and any(configs[s] is None for s in sources):
            refuse_unchecked([r for r in rows if r["source"] in sources], configs)
        known = sorted(s for s in sources if configs[s] is not None)
        keys = sorted({k for s in known for k in configs[s]} - NOT_CONFIG)
        differ = [k for k in keys if len({repr(configs[s].get(k)) for s in known}) > 1]
        added.update({s: {k: cell(configs[s].get(k, "")) for k in differ} for s in known})
    for r in rows:
        r.update(added.get(r["source"], {}))
        if configs[r["source"]] is not None:
            r["data_seed"] = configs[r["source"]].get("data.seed", "")


def refuse_unchecked(rows: list[dict], configs: dict) -> None:
    """Runs that share a series' labels, some without a config.toml: nothing tells their configs
    apart, so averaging them as seeds could mix two configs. Refused rather than reported each
    alone under a made-up label: a report's series stay what a grid or a config names, and the
    fix (copy the run's config.toml beside its eval.csv; `lengthgen eval --out` writes one) is
    one step. Unchecked runs whose rows already differ in train_max, baseline or n are named by that."""
    unchecked = [r for r in rows if configs[r["source"]] is None]
    check_same_config(unchecked, key_columns(unchecked))
    unread = sorted({r["source"] for r in unchecked})
    others = sorted({r["source"] for r in rows} - set(unread))
    peers = f"those of {', '.join(others[:3] + ['…'] * (len(others) > 3))}" if others else "each other"
    whose = "its" if len(unread) == 1 else "their"
    raise UserError(f"no config.toml in {', '.join(unread)}: {whose} rows would be averaged as seeds with {peers} "
                    "without checking that the configs are one; put each run's config.toml beside its eval.csv, "
                    "or report the runs one at a time")


def key_columns(rows: list[dict], measured: tuple[str, ...] = ()) -> list[str]:
    """KEYS, then every other column that is neither measured (a metric), bookkeeping nor the
    length: the labels and swept options that tell series apart. Rows lacking one get ""."""
    metrics = {m for r in rows for m in metric_names(r)} | set(measured)
    extra = sorted({k for r in rows for k in r} - set(KEYS) - set(BOOKKEEPING) - metrics - {"length"},
                   key=lambda k: ("." not in k, k))  # the run's config labels first, then swept options
    keys = list(KEYS) + extra
    for r in rows:
        for k in keys:
            r.setdefault(k, "")
    return keys


def mean_stderr(values: list[float]) -> tuple[float, float]:
    k = len(values)
    mean = sum(values) / k
    if k < 2:
        return mean, float("nan")
    var = sum((v - mean) ** 2 for v in values) / (k - 1)
    return mean, math.sqrt(var / k)


def describe(key: tuple) -> str:
    """A series key ((column, value), ...) as text for error messages."""
    return "/".join(str(v) for _, v in key if v != "")


def check_same_config(rows: list[dict], keys: list[str]) -> None:
    """Refuse to average runs of different configs as seeds: within a series every run
    must have one train_max, and at each length one baseline (task options) and one n."""
    def refuse(a: dict, b: dict, field: str, where: str) -> None:
        name = lambda r: r.get("source", r["run"])  # noqa: E731
        series = describe(tuple((k, a[k]) for k in keys))
        raise UserError(f"{name(a)} and {name(b)} differ in {field} ({a[field]} vs {b[field]}) in "
                        f"{series}{where}: they are runs of different configs, not seeds; report them separately")

    first: dict[tuple, dict] = {}
    for r in rows:
        series = tuple(r[k] for k in keys)
        other = first.setdefault(series, r)
        if other["train_max"] != r["train_max"]:
            refuse(other, r, "train_max", "")
        other = first.setdefault((*series, r["length"]), r)
        for field in ("baseline", "n"):
            if other[field] != r[field]:
                refuse(other, r, field, f" at length {r['length']}")


def replicate(row: dict) -> tuple[str, str]:
    """Which replicate of its config a row's run is: its model seed and its data seed (read from the
    run's config.toml by `collect`; "" where unknown), as text, so that results.csv reads alike."""
    return str(row["seed"]), str(row.get("data_seed", ""))


def aggregate(rows: list[dict]) -> list[dict]:
    """One row per series and length: the key columns, `series` (its key without the task, as
    ((column, value), ...)), each metric's mean (accuracy's standard error as `stderr`, the
    others' as `<metric>_stderr`), seeds, baseline, train_max, samples."""
    keys = key_columns(rows)
    check_same_config(rows, keys)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(tuple(r[k] for k in keys), r["length"])].append(r)
    out = []
    for (values, length), rs in sorted(groups.items(), key=lambda item: (tuple(map(str, item[0][0])), item[0][1])):
        key = dict(zip(keys, values))
        seeds = [replicate(r) for r in rs]
        if len(set(seeds)) != len(rs):
            twice = sorted({str(r.get("source", r.get("run"))) for r, s in zip(rs, seeds) if seeds.count(s) > 1})
            raise UserError(f"{describe(tuple(key.items()))} has several rows for one seed at length {length} "
                            f"(from {', '.join(twice)}): runs of one config need different seeds; pass each run once")
        a = {**key, "series": tuple((k, v) for k, v in key.items() if k != "task"), "length": length,
             "seeds": len(rs), "train_max": rs[0]["train_max"], "baseline": rs[0]["baseline"],
             "samples": sum(r["n"] for r in rs), "metrics": " ".join(dict.fromkeys(m for r in rs for m in own_metrics(r)))}
        for metric in METRICS + tuple(a["metrics"].split()):
            mean, err = mean_stderr([r.get(metric, math.nan) for r in rs])
            a[metric], a["stderr" if metric == "accuracy" else f"{metric}_stderr"] = mean, err
        out.append(a)
    return out


def short_name(column: str) -> str:
    return column.rsplit(".", 1)[-1]  # task.options.k_train -> k_train


def series_labels(agg: list[dict], reserved: frozenset = frozenset()) -> dict[tuple, str]:
    """A label per series, the same in every panel: the arm (or the method outside a grid),
    then, in brackets, each other column whose value differs between series of that arm
    anywhere in the report (an axis such as k_train, a positional scheme), then the stop rule.
    A column is named by the last part of its key unless that is ambiguous (or `reserved`)."""
    every = sorted({a["series"] for a in agg}, key=lambda s: tuple(map(str, s)))
    primary = {s: dict(s)["arm"] or dict(s)["method"] for s in every}
    shown: dict[str, list[str]] = defaultdict(list)
    for name in set(primary.values()):
        mine = [dict(s) for s in every if primary[s] == name]
        for column in mine[0]:
            if column not in ("arm", "stop") and len({m.get(column) for m in mine}) > 1:
                shown[name].append(column)
    labels = {}
    for s in every:
        d = dict(s)
        columns = shown[primary[s]]
        shorts = [short_name(c) for c in columns]  # the full key where two shown columns end alike
        names = [short_name(c) if shorts.count(short_name(c)) == 1 and short_name(c) not in reserved else c
                 for c in columns]
        parts = ", ".join(f"{name}={d[c]}" for name, c in zip(names, columns) if d[c] != "")
        label = f"{primary[s]} ({parts})" if parts else primary[s]
        labels[s] = f"{label}, {d['stop']} stop" if d["stop"] else label
    return labels


def at_multiple(lengths: list[int], train_max: int, factor: float) -> int | None:
    """The shortest evaluated length at or beyond factor x train_max (None if none)."""
    beyond = [n for n in lengths if n >= factor * train_max]
    return min(beyond) if beyond else None


def chance(baselines: list[float]) -> str:
    """The random baseline of one length across series: one value, or its range when the
    series differ in it (e.g. a swept task option)."""
    lo, hi = min(baselines), max(baselines)
    return f"{lo:.2g}" if f"{lo:.2g}" == f"{hi:.2g}" else f"{lo:.2g}–{hi:.2g}"


def task_view(agg: list[dict], task: str, labels: dict[tuple, str]) -> dict:
    """One task's aggregated rows, indexed the way the report's tables and figures read them."""
    rows = [a for a in agg if a["task"] == task]
    series = sorted({a["series"] for a in rows}, key=lambda s: (dict(s)["arm"] or dict(s)["method"], natural(s)))
    own = {a["series"]: a["train_max"] for a in rows}  # one per series (aggregate checks it)
    baselines = defaultdict(list)
    for a in rows:
        baselines[a["length"]].append(a["baseline"])
    return {"rows": rows, "series": series, "labels": [labels[s] for s in series],
            "lengths": sorted({a["length"] for a in rows}), "train_max": max(own.values()), "own_max": own,
            "at": {(a["series"], a["length"]): a for a in rows},
            "chance": {n: chance(b) for n, b in baselines.items()}}


def series_colors(agg: list[dict], labels: dict[tuple, str] | None = None) -> dict[tuple, str]:
    """One colour per series label, the same in every panel: series of different tasks that
    the legend names alike (one arm) share it, and different labels never do (tab20 past 10)."""
    labels = labels or series_labels(agg)
    names = sorted(set(labels.values()))
    palette = [f"C{i}" for i in range(10)] if len(names) <= 10 else \
        [f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}" for r, g, b, _ in _tab20()]
    return {key: palette[names.index(label) % len(palette)] for key, label in labels.items()}


def _tab20() -> list[tuple]:
    from matplotlib import colormaps
    return [colormaps["tab20"](i) for i in range(20)]


def natural(series: tuple) -> tuple:
    """A sort key of a series' values in which numbers sort as numbers (k = 2 before k = 10)."""
    values = [as_number(str(v)) for _, v in series]
    return tuple((0, v, "") if isinstance(v, (int, float)) else (1, 0, v) for v in values)


def as_number(text: str):
    """'4' -> 4, '0.5' -> 0.5, anything else as it is: swept values sort as numbers."""
    for kind in (int, float):
        try:
            return kind(text)
        except (TypeError, ValueError):
            pass
    return text


def collect_per_step(paths: list[Path]) -> list[dict]:
    """Rows of every per_step.csv under the given folders (written by `eval --per-step`)."""
    rows = []
    for path in map(Path, paths):
        files = [path] if path.is_file() and path.name == "per_step.csv" else \
            sorted(path.rglob("per_step.csv")) if path.is_dir() else []
        for f in files:
            rows += read_per_step(f)
    return rows
