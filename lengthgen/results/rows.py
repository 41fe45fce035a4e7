"""The rows evaluation writes and reporting reads: eval.csv's and per_step.csv's columns, typed
reading that names a damaged file and line, atomic writing and merging, the run's labels
(series.json), the loss at each window position, and the table `lengthgen eval` prints."""
from __future__ import annotations

import csv
import io
import json
import math
import sys
from pathlib import Path

from lengthgen.config.schema import MAX_LENGTH, MAX_SEED
from lengthgen.errors import UserError

COLUMNS = ["run", "task", "method", "arm", "position", "stop", "seed", "length", "n", "accuracy", "token_accuracy",
           "stop_step", "train_max", "baseline", "step", "metrics"]
# arm: the reproduction arm that trained the run ("" outside a grid); stop: the looped model's stop
# rule ("" for methods without one); stop_step: mean read-out iteration under that rule; n: test
# samples at this length; baseline: exact-match chance of a uniform random guess; step: training
# step of the evaluated weights. Beyond these a row may carry (see `row`): the run's labels from
# RUN/series.json (config keys, dotted, e.g. task.options.k), the task options swept in evaluation
# (eval.sweep, by option name) and the task's and method's own metrics (Task.metric_names,
# Method.metric_names), named in the row's `metrics` cell (space-separated), so that a reader
# needs no registry to tell a metric from a swept option.
METRICS = ("accuracy", "token_accuracy", "stop_step")  # per length, averaged over seeds; tasks add theirs
# per run, not what tells series apart; a report adds data_seed (data.seed) from the run's config.toml
BOOKKEEPING = ("run", "seed", "data_seed", "n", "train_max", "baseline", "step", "source", "metrics")
PER_STEP_COLUMNS = ["run", "task", "method", "arm", "position", "seed", "length", "n", "iteration", "accuracy",
                    "confidence", "oracle_step", "train_max"]
POSITION_LOSS = "position_loss.csv"  # in a run folder of a language-model task: window,position,loss
LABELS = "series.json"  # in a run folder: {"arm": ..., config key: value} its rows carry (written by reproduce)


# What each number of a row may be, as evaluation writes it: (lowest, highest, NaN allowed). accuracy,
# token_accuracy (shares of samples or tokens) and baseline (the chance of a random guess, 0 where it
# underflows for long answers) are probabilities; stop_step is NaN where no stop rule ran (evaluate.row
# writes NaN then), else an iteration; n counts test samples (tokens for a text task), so it is positive.
# A value outside its range is an edited or damaged file, and a named error rather than a mean. The
# task's and method's own metrics are only read as numbers: without a registry their ranges are unknown.
# seed is train.model_seed (0 <= seed < 2**63), length and train_max problem lengths (1..MAX_LENGTH):
# a seed of -1 would count as a second seed of its run in a report.
RUN_RANGES = {"seed": (0, MAX_SEED - 1, False), "length": (1, MAX_LENGTH, False), "train_max": (1, MAX_LENGTH, False)}
EVAL_RANGES = {"accuracy": (0, 1, False), "token_accuracy": (0, 1, False), "baseline": (0, 1, False),
               "stop_step": (0, math.inf, True), "n": (1, math.inf, False), "step": (0, math.inf, False), **RUN_RANGES}
# per_step.csv: oracle_step is T(n) averaged over samples; confidence (-log max softmax) is left
# unchecked: a broken model's non-finite logits make it +inf, and evaluation writes that as it is
PER_STEP_RANGES = {"accuracy": (0, 1, False), "oracle_step": (0, math.inf, False), "n": (1, math.inf, False),
                   "iteration": (1, math.inf, False), **RUN_RANGES}

# what a damaged result file asks for: `lengthgen eval` reads the eval.csv it merges into, so it must go first
AGAIN = "move it away and evaluate the run again"

# eval.csv written before 2026-11-26 did not name its own metrics; these were all there were
OLD_OWN_METRICS = ("perplexity", "loss", "glitch_rate", "sequence_accuracy", "id_accuracy")
# Metrics whose name now means another statistic: {name: (what files written before held under it, the
# name that tells them apart)}. Until 2026-11-29 `chomsky_accuracy` was the per-sequence mean; it is now
# the authors' pooled score, written beside `chomsky_accuracy_per_sequence` (lengthgen.tasks.chomsky_common).
# A row naming the old name without the new one is read as what it holds, and its run counts as not yet
# evaluated (`outdated`), so a reproduction evaluates it again.
RENAMED_METRICS = {"chomsky_accuracy": "chomsky_accuracy_per_sequence"}


def own_metrics(row: dict) -> tuple[str, ...]:
    """The task's and the method's own metric columns of a row, as its `metrics` cell names them."""
    return tuple(row.get("metrics", "").split())


def metric_names(row: dict) -> tuple[str, ...]:
    """Every metric column of a row: the common ones, then the task's and the method's own."""
    return METRICS + own_metrics(row)


def cell(value) -> str:
    """A label or option value as a CSV cell, spelt as in TOML (true, not True)."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def read_labels(folder: Path) -> dict[str, str]:
    """RUN/series.json as CSV cells ({} outside a reproduction); a damaged file is a UserError."""
    path = Path(folder) / LABELS
    if not path.exists():
        return {}
    try:
        labels = json.loads(path.read_text())
        if not isinstance(labels, dict) or not all(isinstance(k, str) for k in labels):
            raise ValueError("not an object")
    except (OSError, ValueError) as err:
        raise UserError(f"{path} is unreadable ({err}); run the reproduction again to rewrite it") from None
    return {k: cell(v) for k, v in labels.items()}


# eval.csv columns that are dotted but no config key: RoPE stretched at test time, swept in evaluation
# (lengthgen.evaluation.position_scaling); never a label, so never dropped as one
EVALUATION_KEYS = ("position.",)


def is_label(column: str) -> bool:
    """A dotted config-key column (task.options.k) that RUN/series.json gives a run's rows."""
    return "." in column and not column.startswith(EVALUATION_KEYS)


def with_labels(rows: list[dict], labels: dict[str, str]) -> list[dict]:
    """Rows carrying exactly `labels`: the arm, and the dotted config-key columns (older ones dropped)."""
    out = []
    for r in rows:
        kept = {k: v for k, v in r.items() if not is_label(k)}
        out.append({**kept, "arm": labels.get("arm", ""), **{k: v for k, v in labels.items() if k != "arm"}})
    return out


def write_position_loss(path: Path, rows: list[dict]) -> None:
    """RUN/position_loss.csv: window,position,loss (and the position.* options of RoPE stretched at test
    time, where swept); rows of windows (and options) not evaluated now are kept."""
    def curve(r: dict) -> tuple:  # the window, and the stretch it was read with (none for an unswept row)
        return r["window"], *sorted((k, str(v)) for k, v in r.items() if k.startswith(EVALUATION_KEYS) and v != "")

    now = {curve(r) for r in rows}
    old = [r for r in read_position_loss(path) if curve(r) not in now] if path.exists() else []
    merged = sorted(old + rows, key=lambda r: (curve(r), r["position"]))
    write_csv(path, merged, columns_of(merged, ["window", "position", "loss"]))


def read_position_loss(path: Path) -> list[dict]:  # loss is NaN at positions no window scored
    return read_table(path, ["window", "position", "loss"], ("window", "position"), ("loss",),
                      ranges={"loss": (0, math.inf, True)})


def relabel(folder: Path) -> None:
    """Give RUN/eval.csv and RUN/per_step.csv the labels RUN/series.json holds now (a grid that
    gained an arm may tell its series apart by more config keys), without evaluating again."""
    folder, labels = Path(folder), read_labels(folder)
    for name, read, columns in (("eval.csv", read_rows, COLUMNS), ("per_step.csv", read_per_step, PER_STEP_COLUMNS)):
        path = folder / name
        if path.exists():
            rows = read(path)
            new = with_labels(rows, labels)
            if new != rows:
                write_csv(path, new, columns_of(new, columns))


def columns_of(rows: list[dict], first: list[str]) -> list[str]:
    """`first`, then every other column any row has (labels, swept options, task metrics), sorted."""
    extra = sorted({k for r in rows for k in r} - set(first) - {"source"})
    return list(first) + extra


def read_text(path: Path) -> str:
    """A UTF-8 file this project wrote, a byte-order mark dropped (a spreadsheet saving the CSV
    adds one); bytes that are not UTF-8 are a UserError naming the file and line."""
    path = Path(path)
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data[:err.start].count(b"\n") + 1
        raise UserError(f"{path} line {line} is not text (binary data?); {AGAIN}") from None


def check_range(path: Path, line: int, key: str, value: float, raw: str, bounds: tuple) -> None:
    """A typed cell within `bounds` (lowest, highest, NaN allowed), else a UserError naming it."""
    lo, hi, nan = bounds
    if (math.isnan(value) and nan) or (math.isfinite(value) and lo <= value <= hi):
        return
    why = ("not a finite number" if not math.isfinite(value) else f"not between {lo:g} and {hi:g}" if hi <= 1
           else "negative" if value < lo == 0 else "not positive" if value < lo else f"above {hi:,}")
    raise UserError(f"{path} line {line}: {key} is {raw!r}, {why} (edited or damaged?); {AGAIN}")


def read_table(path: Path, columns: list[str], ints: tuple[str, ...], floats: tuple[str, ...],
               defaults: dict | None = None, ranges: dict | None = None) -> list[dict]:
    """Typed rows of a CSV this module wrote. A missing column, a value that is not a number
    (a truncated or hand-edited file) or one outside its `ranges` entry (see EVAL_RANGES) is a
    UserError naming the file and line."""
    path = Path(path)
    text = read_text(path)
    if text and not text.endswith("\n"):  # every line the csv writer writes ends in one
        raise UserError(f"{path} ends in the middle of a line (truncated?); {AGAIN}")
    if "\0" in text:
        raise UserError(f"{path} line {text[:text.index(chr(0))].count(chr(10)) + 1} holds a NUL byte (damaged?); "
                        f"{AGAIN}")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    rows, header = list(reader), reader.fieldnames
    if not header:
        raise UserError(f"{path} is empty (no CSV header)")
    missing = set(columns) - set(header) - set(defaults or {})
    if missing:
        raise UserError(f"{path} lacks the columns {sorted(missing)}")
    for line, r in enumerate(rows, start=2):
        for key, value in (defaults or {}).items():  # files written before a column existed
            r.setdefault(key, value)
        for key, kind in [(k, int) for k in ints] + [(k, float) for k in floats]:
            raw = r[key]
            try:
                r[key] = kind(raw)
            except (TypeError, ValueError):
                raise UserError(f"{path} line {line}: {key} is {raw!r}, not a number (truncated or edited?); "
                                f"{AGAIN}") from None
            if key in (ranges or {}):
                check_range(path, line, key, r[key], raw, ranges[key])
    return rows


def read_rows(path: Path) -> list[dict]:
    """The rows of an eval.csv, typed (the task's and method's own metric columns as floats too;
    labels and swept options stay text)."""
    rows = read_table(path, COLUMNS, ("seed", "length", "n", "train_max", "step"),
                      ("accuracy", "token_accuracy", "baseline", "stop_step"),
                      {"stop": "", "stop_step": "nan", "arm": "", "metrics": None}, EVAL_RANGES)
    for line, r in enumerate(rows, start=2):
        if r["metrics"] is None:  # a file from before 2026-11-26
            r["metrics"] = " ".join(m for m in OLD_OWN_METRICS if m in r)
        for old, new in renamed(r).items():  # a metric written before its name changed meaning
            r[new] = r.pop(old)
            r["metrics"] = " ".join(new if m == old else m for m in own_metrics(r))
        for name in own_metrics(r):
            try:
                r[name] = float(r.get(name, "nan") or "nan")
            except ValueError:
                raise UserError(f"{path} line {line}: {name} is {r[name]!r}, not a number (truncated or edited?); "
                                f"{AGAIN}") from None
    return rows


def renamed(row: dict) -> dict[str, str]:
    """{old name: new name} of the row's metrics written under a name that has since changed meaning."""
    own = own_metrics(row)
    return {old: new for old, new in RENAMED_METRICS.items() if old in own and new not in own}


def outdated(path: Path) -> bool:
    """Whether an eval.csv holds a metric under a name that has since changed meaning (RENAMED_METRICS):
    its run is to be evaluated again."""
    try:
        text = read_text(path)
    except (OSError, UserError):
        return False
    return any(renamed({"metrics": r.get("metrics") or ""}) for r in csv.DictReader(io.StringIO(text, newline="")))


def read_per_step(path: Path) -> list[dict]:
    """The rows of a per_step.csv, typed."""
    return read_table(path, PER_STEP_COLUMNS, ("seed", "length", "n", "iteration", "train_max"),
                      ("accuracy", "confidence", "oracle_step"), {"arm": ""}, PER_STEP_RANGES)


def write_csv(path: Path, rows: list[dict], columns: list[str]) -> None:
    """Atomically; a column a row lacks (a file written before it existed) is left empty."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with tmp.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=columns)
            writer.writeheader()
            writer.writerows({k: r.get(k, "") for k in columns} for r in rows)
        tmp.replace(path)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk leaves the old file as it was, and no partial one
        raise


def write_rows(path: Path, rows: list[dict], old: list[dict] | None = None, swept: list[str] = ()) -> None:
    """Merge into an existing eval.csv (its rows `old`, read from `path` when None): new rows
    replace old ones of the same (length, stop, swept option values), and old rows of another
    checkpoint step are dropped, so that the file describes one set of weights."""
    path = Path(path)
    if old is None:
        old = read_rows(path) if path.exists() else []
    step = rows[0]["step"]
    stale = [r for r in old if r["step"] != step]
    if stale:
        steps = ", ".join(map(str, sorted({r["step"] for r in stale})))
        print(f"note: dropped {len(stale)} row(s) of {path} evaluated at step {steps}; "
              f"these weights are step {step}", file=sys.stderr)
    measured = set(own_metrics(rows[0]))  # rows measured with other metrics (a metric renamed since) go too
    unlike = [r for r in old if r["step"] == step and set(own_metrics(r)) != measured]
    if unlike:
        lacking = ", ".join(sorted(measured ^ set(own_metrics(unlike[0]))))
        print(f"note: dropped {len(unlike)} row(s) of {path} measured without {lacking} (written before it was); "
              "evaluate their lengths again to have them", file=sys.stderr)
    key = lambda r: (r["stop"], *(str(r.get(k, "")) for k in swept), r["length"])  # noqa: E731
    new_keys = {key(r) for r in rows}
    kept = [r for r in old if r["step"] == step and set(own_metrics(r)) == measured and key(r) not in new_keys]
    merged = sorted(kept + rows, key=key)
    write_csv(path, merged, columns_of(merged, COLUMNS))


def format_table(rows: list[dict]) -> str:
    """Plain-text table of one run's rows (one stop rule and swept option values), lengths
    beyond training marked; the task's own metrics as further columns."""
    stop = rows[0]["stop"]
    own = own_metrics(rows[0])
    lines = [f"{'length':>7}  {'accuracy':>8}  {'token_acc':>9}" + "".join(f"  {m:>10}" for m in own)
             + f"  {'random':>8}" + ("  stop_step" if stop else "")]
    for r in rows:
        mark = " *" if r["length"] > r["train_max"] else ""
        at = f"  {r['stop_step']:>9.2f}" if stop else ""
        mine = "".join(f"  {r[m]:>10.4f}" for m in own)
        lines.append(f"{r['length']:>7}  {r['accuracy']:>8.4f}  {r['token_accuracy']:>9.4f}{mine}  "
                     f"{r['baseline']:>8.2g}{at}{mark}")
    if stop:
        lines.append(f"stop rule: {stop}")
    if any(r["length"] > r["train_max"] for r in rows):
        lines.append(f"* beyond training (length > train_max = {rows[0]['train_max']})")
    return "\n".join(lines)
