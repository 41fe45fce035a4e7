"""Evaluator: accuracy at every requested length on a fixed evaluation seed.

Each length draws its samples from its own generator seeded by (eval seed,
length), so a length's test set is the same whichever other lengths are
requested and in whatever order. Results are rows keyed by values
(run, task, method, seed, length, ...), written to RUN/eval.csv; rows of a
previous evaluation of the same checkpoint at other lengths are kept.
"""
from __future__ import annotations

import csv
import hashlib
import io
import itertools
import json
import math
import shutil
import sys
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from lengthgen.config.presets import from_dict
from lengthgen.config.schema import Config
from lengthgen.errors import ResourceError, UserError
from lengthgen.methods.looped.stop_passes import confidence_precision, trace
from lengthgen.methods.looped.stop_rules import default_t_max, parse_rule, readout
from lengthgen.methods.registry import METHODS, Method, get_method
from lengthgen.model.compiling import compile_blocks, compile_failed, fall_back
from lengthgen.model.position_transforms import PositionTransform, build_transform
from lengthgen.runtime import checkpoint
from lengthgen.runtime.devices import autocast, native_bf16, pick_device
from lengthgen.runtime.resources import is_out_of_memory, oom_detail
from lengthgen.runtime.run_folders import check_eval_out, check_writable
from lengthgen.tasks import TASKS, Batch, Task, measure, task_of

COLUMNS = ["run", "task", "method", "arm", "position", "stop", "seed", "length", "n", "accuracy", "token_accuracy",
           "stop_step", "train_max", "baseline", "step"]
# arm: the reproduction arm that trained the run ("" outside a grid); stop: the looped model's stop
# rule ("" for methods without one); stop_step: mean read-out iteration under that rule; n: test
# samples at this length; baseline: exact-match chance of a uniform random guess; step: training
# step of the evaluated weights. Beyond these a row may carry (see `row`): the run's labels from
# RUN/series.json (config keys, dotted, e.g. task.options.k), the task options swept in evaluation
# (eval.sweep, by option name) and the task's and method's own metrics (Task.metric_names,
# Method.metric_names).
METRICS = ("accuracy", "token_accuracy", "stop_step")  # per length, averaged over seeds; tasks add theirs
BOOKKEEPING = ("run", "seed", "n", "train_max", "baseline", "step", "source")  # per run, not what tells series apart
PER_STEP_COLUMNS = ["run", "task", "method", "arm", "position", "seed", "length", "n", "iteration", "accuracy",
                    "confidence", "oracle_step", "train_max"]
POSITION_LOSS = "position_loss.csv"  # in a run folder of a language-model task: window,position,loss
LABELS = "series.json"  # in a run folder: {"arm": ..., config key: value} its rows carry (written by reproduce)


def metric_names(task: str, method: str = "") -> tuple[str, ...]:
    """Every metric column of a task's rows: the common ones, the task's own and the method's."""
    return METRICS + (TASKS[task].metric_names if task in TASKS else ()) + \
        (METHODS[method].metric_names if method in METHODS else ())


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


def with_labels(rows: list[dict], labels: dict[str, str]) -> list[dict]:
    """Rows carrying exactly `labels`: the arm, and the dotted config-key columns (older ones dropped)."""
    out = []
    for r in rows:
        kept = {k: v for k, v in r.items() if "." not in k}
        out.append({**kept, "arm": labels.get("arm", ""), **{k: v for k, v in labels.items() if k != "arm"}})
    return out


def load_run(folder: Path, device: torch.device | None = None, use_ema: bool = True):
    """(cfg, task, method, model, step) from a run folder's latest checkpoint."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"run folder {folder} " + ("is a file, not a folder" if folder.exists() else "does not exist"))
    path = checkpoint.latest(folder)
    if path is None:
        raise UserError(f"{folder} has no checkpoint (is it a run folder written by `lengthgen train`?)")
    state = checkpoint.read_state(path)
    cfg = from_dict(state["config"])
    task, method = task_of(cfg.task), get_method(cfg.method, cfg)
    device = device or pick_device(cfg.train.device)
    model = method.build_model(cfg, task)
    weights = path / "ema.safetensors"
    checkpoint.load_weights(model, weights if use_ema and weights.exists() else path / "model.safetensors",
                            state.get("sha256"))
    return cfg, task, method, model.to(device).eval(), state["step"]


def eval_generator(seed: int, length: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + length)


# Test samples are drawn this many at a time, whatever the evaluation batch size, so that
# the test set depends only on (seed, length, samples): a smaller --batch-size to save
# memory must not change the accuracy.
EVAL_CHUNK = 256


def ids_generator(seed: int, length: int, draw: int) -> torch.Generator:
    """The stream of evaluation position IDs (a transform that draws them at evaluation), apart
    from the samples' stream: draw d of one length's test set is the same whatever else is asked."""
    digest = hashlib.sha256(f"position-ids:{seed}:{length}:{draw}".encode()).digest()
    return torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)


def eval_batches(task: Task, length: int, samples: int, batch_size: int, seed: int, device: torch.device,
                 transform: PositionTransform | None = None, draw: int = 0):
    """The fixed test set of one length, `samples` samples in batches of `batch_size` on `device`,
    with the position IDs `transform` gives at evaluation (draw `draw` of them)."""
    generator = eval_generator(seed, length)
    chunks = [task.sample(min(EVAL_CHUNK, samples - done), length, generator) for done in range(0, samples, EVAL_CHUNK)]
    if transform is not None and transform.random_at_evaluation:
        ids = ids_generator(seed, length, draw)
        chunks = [transform.evaluation(chunk, ids) for chunk in chunks]
    test = Batch.concat(chunks)
    for start in range(0, samples, batch_size):
        yield test.select(torch.arange(start, min(start + batch_size, samples))).to(device)


@torch.no_grad()
def accuracy_at(task: Task, method: Method, model, length: int, samples: int, batch_size: int,
                seed: int, device: torch.device, stop: str | None = None,
                transform: PositionTransform | None = None) -> tuple[float, float, float]:
    """(exact-match accuracy, token accuracy, mean read-out step) over `samples` test samples
    of one length; the step is NaN for methods without a stop rule."""
    results, _ = rules_at(task, method, model, length, samples, batch_size, seed, device, [stop], transform=transform)
    return tuple(results[stop][k] for k in METRICS)


@torch.no_grad()
def rules_at(task: Task, method: Method, model, length: int, samples: int, batch_size: int, seed: int,
             device: torch.device, stops: list[str | None], per_step: bool = False,
             transform: PositionTransform | None = None, draws: int = 1) -> tuple[dict, list[dict]]:
    """({stop: {metric: mean over the samples}}, per-step rows) on one length's test samples;
    the metrics are accuracy (exact match), token_accuracy, stop_step (NaN without a stop
    rule) and the task's own. A `transform` that draws position IDs at evaluation
    (`randomized`) reads each sample under `draws` independent draws, and every mean is
    over samples x draws.

    With several looped rules or `per_step`, each batch runs once to the longest
    iteration any of them needs (`stopping.trace`) and every rule is read out of
    that pass: the same choices as the rules' own passes at a fraction of the
    cost. A lone rule runs its own pass (per-sample confidence then retires
    finished samples). The per-step rows hold accuracy and confidence after every
    iteration t <= 2 T(n)."""

    rules = [None if stop is None else parse_rule(stop) for stop in stops]
    task_metrics = (lambda pred, b: task.metrics(pred, b)) if task.metric_names else None
    sums = {stop: defaultdict(float) for stop in stops}
    curve = None  # per-step sums over samples: exact (T,), confidence (T,)
    oracle_sum = 0.0
    draws = draws if transform is not None and transform.random_at_evaluation else 1
    batches = (batch for draw in range(draws)
               for batch in eval_batches(task, length, samples, batch_size, seed, device, transform, draw))
    for batch in batches:
        tr = None
        if per_step or len(stops) > 1:
            needs = [rule.steps_needed(batch) for rule in rules] + ([default_t_max(batch)] if per_step else [])
            tr = trace(model, batch, max(needs), task_metrics)
        for stop, rule in zip(stops, rules):
            got = readout(tr, batch, rule) if tr is not None else None
            if got is None:
                pred, steps = (method.predict(model, batch), None) if rule is None else \
                    method.predict_stop(model, batch, rule)
                got = ({**measure(task, pred, batch), **method.metrics(model, batch)}, steps)
            values, steps = got
            for name, value in values.items():
                sums[stop][name] += float(value.float().sum())
            sums[stop]["stop_step"] += float(steps.float().sum()) if steps is not None else math.nan
        if per_step:
            t = default_t_max(batch)  # T(n) can differ between batches (multiplication): keep the common steps
            exact, conf = tr.exact[:t].float().sum(1), tr.confidence[:t].sum(1)
            if curve is not None:
                t = min(len(curve[0]), t)
                exact, conf = exact[:t] + curve[0][:t], conf[:t] + curve[1][:t]
            curve = (exact, conf)
            oracle_sum += float(batch.n_steps.float().sum())
    count = samples * draws
    results = {stop: {name: total / count for name, total in sums[stop].items()} for stop in stops}
    steps_rows = [{"length": length, "n": samples, "iteration": t + 1, "accuracy": float(a) / count,
                   "confidence": float(c) / count, "oracle_step": oracle_sum / count}
                  for t, (a, c) in enumerate(zip(*curve))] if per_step else []
    return results, steps_rows


def write_position_loss(path: Path, rows: list[dict]) -> None:
    """RUN/position_loss.csv: window,position,loss; rows of windows not evaluated now are kept."""
    windows = {r["window"] for r in rows}
    old = [r for r in read_position_loss(path) if r["window"] not in windows] if path.exists() else []
    write_csv(path, sorted(old + rows, key=lambda r: (r["window"], r["position"])), ["window", "position", "loss"])


def read_position_loss(path: Path) -> list[dict]:
    return read_table(path, ["window", "position", "loss"], ("window", "position"), ("loss",))


def sweep_variants(sweep: dict) -> list[dict]:
    """eval.sweep {option: [values]} -> one {option: value} per combination ([{}] without one)."""
    return [dict(zip(sweep, combo)) for combo in itertools.product(*sweep.values())]


@dataclass
class Measure:
    """What every length of one evaluation shares."""

    method: Method
    model: torch.nn.Module
    samples: int
    batch_size: int
    seed: int
    device: torch.device
    stops: list
    per_step: bool
    transform: PositionTransform
    draws: int
    window_tokens: int  # tokens per forward pass of a perplexity evaluation
    compiled: bool


def exact_match(ctx: Measure, task: Task, length: int) -> tuple[dict, list[dict], list[dict]]:
    """({stop: metrics}, per-step rows, []) on the task's test samples at `length`; a block that
    fails to compile is evaluated eagerly."""
    measure = lambda: rules_at(task, ctx.method, ctx.model, length, ctx.samples, ctx.batch_size, ctx.seed,  # noqa: E731
                               ctx.device, ctx.stops, ctx.per_step, ctx.transform, ctx.draws)
    try:
        results, curve = measure()
    except Exception as err:
        if not (ctx.compiled and compile_failed(err)):
            raise
        fall_back(ctx.model, err, "eval.compile")
        ctx.compiled = False
        results, curve = measure()
    return results, curve, []


def perplexity(ctx: Measure, task: Task, length: int) -> tuple[dict, list[dict], list[dict]]:
    """({None: metrics}, [], loss at each window position) on the test split in windows of `length`
    (eval.samples counts test tokens for such a task; lengthgen.evaluation.language_model)."""
    from lengthgen.evaluation.language_model import perplexity_at

    values, losses = perplexity_at(task, ctx.method, ctx.model, length, ctx.samples, ctx.window_tokens, ctx.device)
    return {None: values}, [], [{"window": length, "position": p, "loss": float(v)} for p, v in enumerate(losses)]


# what a task declares (Task.evaluation) -> how its rows are measured
EVALUATORS = {"exact_match": exact_match, "perplexity": perplexity}


def evaluate_run(folder: Path, lengths: list[int], samples: int, batch_size: int | None = None,
                 seed: int | None = None, stops: list[str] | None = None, per_step: bool = False,
                 progress: bool = True, sweep: dict | None = None, out: Path | None = None,
                 position_draws: int | None = None, compile: bool | None = None) -> list[dict]:
    """Evaluate a run at `lengths` under each stop rule in `stops` (methods with stop rules;
    default oracle), for every combination of the task options in `sweep` (default the
    run's eval.sweep); write RUN/eval.csv (and RUN/per_step.csv with per_step), or into `out`
    (with a copy of the run's config.toml, which the report reads) for a run one cannot write.
    A position transform that draws IDs at evaluation reads each sample under `position_draws`
    draws (default the run's eval.position_draws). `compile`: torch.compile the blocks (default
    the run's eval.compile; lengthgen.model.compiling)."""
    folder = Path(folder)
    lengths = list(dict.fromkeys(lengths))  # a length given twice would give duplicate rows
    cfg, task, method, model, step = load_run(folder)
    labels = read_labels(folder)
    out = folder if out is None else Path(out)
    if out.resolve() != folder.resolve():
        check_eval_out(out, folder)
    check_writable(out, "give --out DIR to write the evaluation elsewhere" if out == folder else "give another --out")
    # read before the long evaluation: an unreadable old file must stop us now, not after it
    old = read_rows(out / "eval.csv") if (out / "eval.csv").exists() else []
    if stops and not method.has_stop_rules:
        raise UserError(f"--stop applies to methods with stop rules (looped); {folder} was trained with method {cfg.method!r}")
    if per_step and not method.has_stop_rules:
        raise UserError(f"--per-step applies to methods with stop rules (looped); {folder} was trained with method {cfg.method!r}")
    if method.has_stop_rules:
        stops = list(dict.fromkeys(stops or ["oracle"]))  # a rule given twice is evaluated once
        try:
            for stop in stops:
                parse_rule(stop).check(method)
        except ValueError as err:
            raise UserError(str(err)) from None
    stops = stops or [None]
    if sweep is not None and sweep != cfg.eval.sweep:  # given for this evaluation (--sweep): check it as eval.sweep
        from lengthgen.config.presets import check_sweep
        check_sweep(replace(cfg, eval=replace(cfg.eval, sweep=sweep)), task)
    sweep = cfg.eval.sweep if sweep is None else sweep
    clash = set(sweep) & (set(COLUMNS) | set(metric_names(cfg.task.name, cfg.method)) | set(labels))
    if clash:
        raise UserError(f"eval.sweep option {sorted(clash)[0]!r} has the name of an eval.csv column; it cannot be swept")
    variants = sweep_variants(sweep)
    tasks = [task_of(cfg.task, **options) if options else task for options in variants]
    device = next(model.parameters()).device
    precision = cfg.train.precision
    if precision == "bf16" and not native_bf16(device):  # the weights are fp32: evaluate them as they are
        print(f"note: {folder} trained in bf16; this {device.type} has no native bf16, so it is evaluated in fp32",
              file=sys.stderr)
        precision = "fp32"
    seed = cfg.eval.seed if seed is None else seed
    batch_size = batch_size or cfg.eval.batch_size
    transform = build_transform(cfg.train.position_transform, cfg.train.position_transform_options)
    draws = cfg.eval.position_draws if position_draws is None else position_draws
    if draws > 1 and not transform.random_at_evaluation:
        raise UserError(f"--position-draws {draws} applies to runs whose position transform draws IDs at evaluation "
                        f"(randomized); {folder} was trained with {cfg.train.position_transform!r}")
    rows, steps_rows, position_rows = [], [], []
    compiled = (cfg.eval.compile if compile is None else compile) and compile_blocks(model, device, "eval.compile")
    ctx = Measure(method, model, samples, batch_size, seed, device, stops, per_step, transform, draws,
                  batch_size * cfg.task.train_max, compiled)
    cases = [(options, variant, length) for options, variant in zip(variants, tasks) for length in lengths]
    for options, variant, length in tqdm(cases, desc=f"eval {folder.name}", disable=not progress, dynamic_ncols=True):
        try:
            with autocast(device, precision), confidence_precision(cfg.eval.confidence_precision):
                results, curve, positions = EVALUATORS[variant.evaluation](ctx, variant, length)
                position_rows += positions
        except ValueError as err:  # e.g. a length past the learned position table
            raise UserError(f"cannot evaluate length {length}: {err}") from None
        except (MemoryError, RuntimeError) as err:
            if not is_out_of_memory(err):
                raise
            raise ResourceError(f"out of memory evaluating length {length} in batches of {batch_size} "
                                f"({oom_detail(err)}): lower --batch-size (eval.batch_size); the rows of "
                                "earlier evaluations stay in eval.csv") from None
        ident = {"run": folder.name, "task": cfg.task.name, "method": cfg.method, "position": cfg.model.position,
                 "seed": cfg.train.model_seed, "train_max": cfg.task.train_max,
                 **{k: cell(v) for k, v in options.items()}}
        steps_rows += [{**ident, **r} for r in curve]
        rows += [row(folder, cfg, length, results[stop].pop("tokens", samples), results[stop],
                     variant.random_baseline(length), step, stop, options) for stop in stops]
    rows = with_labels(rows, labels)
    if out != folder and not (out / "config.toml").exists():
        shutil.copyfile(folder / "config.toml", out / "config.toml")
    write_rows(out / "eval.csv", rows, with_labels(old, labels), list(sweep))
    if position_rows:
        write_position_loss(out / POSITION_LOSS, position_rows)
    if cfg.eval.token_contexts:  # per token, fixed context (and the dependence search): lengthgen.evaluation.dependence
        from lengthgen.evaluation.dependence import evaluate_tokens

        with autocast(device, precision):
            evaluate_tokens(out, cfg, task, method, model, device, batch_size * cfg.task.train_max, step)
    if per_step:
        steps_rows = with_labels(steps_rows, labels)
        write_csv(out / "per_step.csv", steps_rows, columns_of(steps_rows, PER_STEP_COLUMNS))
    return rows


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


def row(folder: Path, cfg: Config, length: int, samples: int, values: dict, baseline: float, step: int,
        stop: str | None = None, options: dict | None = None) -> dict:
    """One eval.csv row: the run, one length (and swept task options), one stop rule, `values`
    {metric: mean} (the metrics of `rules_at`)."""
    return {"run": folder.name, "task": cfg.task.name, "method": cfg.method, "arm": "", "position": cfg.model.position,
            "stop": stop or "", "seed": cfg.train.model_seed, "length": length, "n": samples, "stop_step": math.nan,
            **values, "train_max": cfg.task.train_max, "baseline": baseline, "step": step,
            **{k: cell(v) for k, v in (options or {}).items()}}


def columns_of(rows: list[dict], first: list[str]) -> list[str]:
    """`first`, then every other column any row has (labels, swept options, task metrics), sorted."""
    extra = sorted({k for r in rows for k in r} - set(first) - {"source"})
    return list(first) + extra


def read_table(path: Path, columns: list[str], ints: tuple[str, ...], floats: tuple[str, ...],
               defaults: dict | None = None) -> list[dict]:
    """Typed rows of a CSV this module wrote. A missing column or a value that is not a
    number (a truncated or hand-edited file) is a UserError naming the file and line."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        line = path.read_bytes()[:err.start].count(b"\n") + 1
        raise UserError(f"{path} line {line} is not text (binary data?); evaluate the run again") from None
    if text and not text.endswith("\n"):  # every line the csv writer writes ends in one
        raise UserError(f"{path} ends in the middle of a line (truncated?); evaluate the run again")
    if "\0" in text:
        raise UserError(f"{path} line {text[:text.index(chr(0))].count(chr(10)) + 1} holds a NUL byte (damaged?); "
                        "evaluate the run again")
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
            try:
                r[key] = kind(r[key])
            except (TypeError, ValueError):
                raise UserError(f"{path} line {line}: {key} is {r[key]!r}, not a number "
                                "(truncated or edited? evaluate the run again)") from None
    return rows


def read_rows(path: Path) -> list[dict]:
    """The rows of an eval.csv, typed (the task's and method's own metric columns as floats too;
    labels and swept options stay text)."""
    rows = read_table(path, COLUMNS, ("seed", "length", "n", "train_max", "step"),
                      ("accuracy", "token_accuracy", "baseline", "stop_step"),
                      {"stop": "", "stop_step": "nan", "arm": ""})
    for line, r in enumerate(rows, start=2):
        for name in metric_names(r["task"], r["method"])[len(METRICS):]:
            try:
                r[name] = float(r.get(name, "nan") or "nan")
            except ValueError:
                raise UserError(f"{path} line {line}: {name} is {r[name]!r}, not a number "
                                "(truncated or edited? evaluate the run again)") from None
    return rows


def read_per_step(path: Path) -> list[dict]:
    """The rows of a per_step.csv, typed."""
    return read_table(path, PER_STEP_COLUMNS, ("seed", "length", "n", "iteration", "train_max"),
                      ("accuracy", "confidence", "oracle_step"), {"arm": ""})


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
    key = lambda r: (r["stop"], *(str(r.get(k, "")) for k in swept), r["length"])  # noqa: E731
    new_keys = {key(r) for r in rows}
    kept = [r for r in old if r["step"] == step and key(r) not in new_keys]
    merged = sorted(kept + rows, key=key)
    write_csv(path, merged, columns_of(merged, COLUMNS))


def format_table(rows: list[dict]) -> str:
    """Plain-text table of one run's rows (one stop rule and swept option values), lengths
    beyond training marked; the task's own metrics as further columns."""
    stop = rows[0]["stop"]
    own = metric_names(rows[0]["task"])[len(METRICS):]
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
