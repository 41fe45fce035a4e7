"""Evaluator: accuracy at every requested length on a fixed evaluation seed.

Each length draws its samples from its own generator seeded by (eval seed,
length), so a length's test set is the same whichever other lengths are
requested and in whatever order. Results are rows keyed by values
(run, task, method, seed, length, ...), written to RUN/eval.csv; rows of a
previous evaluation of the same checkpoint at other lengths are kept.

The method reads out each batch (`Method.read_out`: under its stop rules, with the curve over
iterations); the evaluator draws the samples, batches them, loops over lengths and writes rows.
"""
from __future__ import annotations

import hashlib
import math
import sys
from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from lengthgen.assembly.checks import check_sweep
from lengthgen.assembly.runs import Run, saved_run
from lengthgen.config.schema import Config, TrainConfig, option_combinations
from lengthgen.errors import ResourceError, UserError, path_problem
from lengthgen.evaluation.bounds import check_stop_bounds
from lengthgen.evaluation.position_scaling import Stretcher, split_options, with_factor
from lengthgen.evaluation.settings import EvalSettings
from lengthgen.results.rows import (COLUMNS, METRICS, PER_STEP_COLUMNS, POSITION_LOSS, cell, columns_of, read_labels,
                                    read_rows, with_labels, write_csv, write_position_loss, write_rows)
from lengthgen.methods.base import Method
from lengthgen.accel import heap
from lengthgen.accel.compiling import compile_blocks, compile_failed, fall_back
from lengthgen.model.position_transforms import PositionTransform
from lengthgen.runtime import checkpoint, exported
from lengthgen.runtime.devices import autocast, native_bf16, pick_device
from lengthgen.runtime.resources import batches_that_fit, is_out_of_memory, oom_detail
from lengthgen.runtime.run_folders import check_eval_out, check_writable, rows_lock, run_lock
from lengthgen.tasks import Batch, Task, task_of

def latest_state(folder: Path) -> tuple[Path, dict, Run]:
    """(the latest checkpoint, its state, the run it trained, assembled) of a run folder."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"run folder {folder} {path_problem(folder, 'folder')}")
    if exported.is_export(folder):  # a folder of `lengthgen export`: the run's config is in its config.json
        state = exported.exported_state(folder)
        return folder, state, saved_run(state["config"], folder / "config.json")
    path = checkpoint.latest(folder)
    if path is None:
        raise UserError(f"{folder} has no checkpoint (is it a run folder written by `lengthgen train`?)")
    state = checkpoint.read_state(path)
    return path, state, saved_run(state["config"], path / "state.json")


def load_assembled(folder: Path, device: torch.device | None = None, use_ema: bool = True):
    """(run, model, step) from a run folder's latest checkpoint."""
    path, state, run = latest_state(folder)
    device = device or pick_device(run.cfg.train.device)
    model = run.method.build_model(run.cfg, run.task)
    if exported.is_export(path):
        exported.load_exported_weights(model, path)
        return run, model.to(device).eval(), state["step"]
    weights = path / "ema.safetensors"
    checkpoint.load_weights(model, weights if use_ema and weights.exists() else path / "model.safetensors",
                            state.get("sha256"))
    return run, model.to(device).eval(), state["step"]


def load_run(folder: Path, device: torch.device | None = None, use_ema: bool = True):
    """(cfg, task, method, model, step) from a run folder's latest checkpoint."""
    run, model, step = load_assembled(folder, device, use_ema)
    return run.cfg, run.task, run.method, model, step


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
def accuracy_at(ctx: Measure, task: Task, length: int, stop: str | None = None) -> tuple[float, float, float]:
    """(exact-match accuracy, token accuracy, mean read-out step) over `ctx.samples` test samples
    of one length, read out under `stop` alone; the step is NaN for methods without a stop rule."""
    results, _ = rules_at(replace(ctx, stops=[stop]), task, length)
    return tuple(results[stop][k] for k in METRICS)


@torch.no_grad()
def rules_at(ctx: Measure, task: Task, length: int) -> tuple[dict, list[dict]]:
    """({stop: {metric: mean over the samples}}, per-step rows) on one length's test samples,
    read out by the method under each of `ctx.stops` (`Method.read_out`); the metrics are accuracy
    (exact match), token_accuracy, stop_step (NaN without a stop rule) and the task's and
    method's own. A transform that draws position IDs at evaluation (`randomized`) reads each
    sample under `ctx.draws` independent draws, and every mean is over samples x draws. With
    `ctx.per_step` (methods with stop rules), the per-step rows hold the means after every iteration
    t <= 2 T(n) (accuracy, confidence, the oracle step)."""
    stops, samples = ctx.stops, ctx.samples
    sums = {stop: defaultdict(float) for stop in stops}
    curve = None  # per-iteration sums over the samples so far: {column: (T,)}
    draws = ctx.draws if ctx.transform is not None and ctx.transform.random_at_evaluation else 1
    batches = (batch for draw in range(draws) for batch in
               eval_batches(task, length, samples, ctx.batch_size, ctx.seed, ctx.device, ctx.transform, draw))
    for batch in batches:
        read, part = ctx.method.read_out(ctx.model, batch, task, stops, ctx.per_step)
        for stop, (values, steps) in zip(stops, read):
            for name, value in values.items():
                sums[stop][name] += float(value.float().sum())
            sums[stop]["stop_step"] += float(steps.float().sum()) if steps is not None else math.nan
        curve = part if curve is None else add_curves(curve, part)
    count = samples * draws
    results = {stop: {name: total / count for name, total in sums[stop].items()} for stop in stops}
    iterations = len(next(iter(curve.values()))) if curve else 0
    steps_rows = [{"length": length, "n": samples, "iteration": t + 1,
                   **{column: float(sums_t[t]) / count for column, sums_t in curve.items()}} for t in range(iterations)]
    return results, steps_rows


def add_curves(total: dict, part: dict) -> dict:
    """Per-iteration sums of two sets of samples over the iterations both have: T(n) can differ
    between batches (multiplication)."""
    t = min(len(column) for column in (*total.values(), *part.values()))
    return {name: part[name][:t] + total[name][:t] for name in part}


@dataclass
class Measure:
    """What every length of one evaluation shares: the method and its model; `samples` test samples
    per length, drawn from `seed`, in batches of `batch_size` on `device`; the stop rules read out
    (None: a method's one read-out), the curve over iterations (`per_step`), the position transform
    and its draws per sample; the tokens per forward pass of a perplexity evaluation; whether the
    blocks run compiled. The evaluator sets `batch_size` and `window_tokens` length by length (lower
    where a batch would not fit) and clears `compiled` where a block fails to compile."""

    method: Method
    model: torch.nn.Module
    samples: int
    batch_size: int
    seed: int
    device: torch.device
    stops: list = field(default_factory=lambda: [None])
    per_step: bool = False
    transform: PositionTransform | None = None
    draws: int = 1
    window_tokens: int = 0
    compiled: bool = False


def exact_match(ctx: Measure, task: Task, length: int) -> tuple[dict, list[dict], list[dict]]:
    """({stop: metrics}, per-step rows, []) on the task's test samples at `length`; a block that
    fails to compile is evaluated eagerly."""
    try:
        results, curve = rules_at(ctx, task, length)
    except Exception as err:
        if not (ctx.compiled and compile_failed(err)):
            raise
        fall_back(ctx.model, err, "eval.compile")
        ctx.compiled = False
        results, curve = rules_at(ctx, task, length)
    return results, curve, []


def perplexity(ctx: Measure, task: Task, length: int) -> tuple[dict, list[dict], list[dict]]:
    """({None: metrics}, [], loss at each window position) on the test split in windows of `length`
    (eval.samples counts test tokens for such a task; lengthgen.evaluation.language_model)."""
    from lengthgen.evaluation.language_model import perplexity_at

    values, losses = perplexity_at(task, ctx.method, ctx.model, length, ctx.samples, ctx.window_tokens, ctx.device)
    return {None: values}, [], [{"window": length, "position": p, "loss": float(v)} for p, v in enumerate(losses)]


# what a task declares (Task.evaluation) -> how its rows are measured
EVALUATORS = {"exact_match": exact_match, "perplexity": perplexity}


def run_folder(folder: Path) -> Path:
    """The run folder a path names: `eval LINK` or `eval .` name the real run in their rows."""
    folder = Path(folder)
    return folder.resolve() if folder.is_symlink() or not folder.name else folder


def evaluate_run(folder: Path, settings: EvalSettings | None = None) -> list[dict]:
    """Evaluate a run as `settings` asks (lengthgen.evaluation.settings; a setting left None, or no
    settings, is the run's own [eval] value): at its lengths, under each of its stop rules (methods
    with stop rules; default oracle), for every combination of the task options in its sweep (its
    position.* keys read a rotary run with RoPE stretched at test time,
    lengthgen.evaluation.position_scaling); write RUN/eval.csv (and RUN/per_step.csv with per_step),
    or into `settings.out` (with a copy of the run's config.toml, which the report reads) for a run
    one cannot write. A position transform that draws IDs at evaluation reads each sample under
    `position_draws` draws; `compile` runs the blocks through torch.compile (lengthgen.accel.compiling).
    A run reached through a symbolic link is evaluated as itself. The run is held (shared) so that
    no `train` replaces it meanwhile, and the rows are merged into eval.csv under a lock: evaluations
    of one run side by side keep all rows. The CLI checks the settings against the run (`--stop` and
    `--per-step` need a method with stop rules, `--position-draws` a transform that draws IDs at
    evaluation)."""
    folder = run_folder(folder)
    with run_lock(folder, shared=True):
        return evaluate_held(folder, settings or EvalSettings())


def evaluate_held(folder: Path, settings: EvalSettings) -> list[dict]:
    """`evaluate_run` under the run's lock."""
    run, model, step = load_assembled(folder)
    cfg, task, method = run.cfg, run.task, run.method
    asked = settings.resolved(cfg.eval)  # what was not given is the run's own
    labels = read_labels(folder)
    out = output_folder(folder, asked.out)
    try:
        stops = method.stops(list(asked.stops) or None)  # each rule once, checked against the method (a halting head)
    except ValueError as err:
        raise UserError(str(err)) from None
    check_stop_bounds(stops, task, [cfg.task.train_max, *asked.lengths])  # no count past what the run could need
    named = Evaluated(folder, cfg, step, tuple(task.metric_names + method.metric_names))
    sweep, variants = swept_tasks(cfg, task, asked.sweep, [*named.own, *labels])
    device = next(model.parameters()).device
    heap.keep(device)  # the batches' buffers stay in the heap between lengths (1.4-1.9x on a looped run's)
    precision = eval_precision(cfg.train, device, folder)
    compiled = asked.compile and compile_blocks(model, device, "eval.compile")
    ctx = Measure(method, model, asked.samples, asked.batch_size, asked.seed, device, stops, asked.per_step,
                  run.transform, asked.position_draws, asked.batch_size * cfg.task.train_max, compiled)
    cases = [(options, variant, length) for options, variant in variants for length in asked.lengths]
    fits = fitting_batches(cfg, cases, asked.samples, asked.batch_size, device)
    rows, steps_rows, position_rows = [], [], []
    stretcher = Stretcher(run)
    for options, variant, length in tqdm(cases, desc=f"eval {folder.name}", disable=not asked.progress,
                                         dynamic_ncols=True):
        ctx.batch_size, ctx.window_tokens = fits[variant, length]
        with autocast(device, precision), stretcher.at(model, options, variant, length):
            results, curve, positions = evaluate_length(ctx, variant, length)
        position_rows += [{**r, **split_options(options)[1]} for r in positions]
        steps_rows += [{**named.ident(options), **r} for r in curve]
        rows += [named.row(length, results[stop].pop("tokens", asked.samples), results[stop],
                           variant.random_baseline(length), stop, options) for stop in stops]
    rows = with_labels(rows, labels)
    write_results(folder, out, rows, with_labels(steps_rows, labels) if asked.per_step else None, position_rows,
                  labels, sweep)
    if cfg.eval.token_contexts:  # per token, fixed context (and the dependence search): lengthgen.evaluation.dependence
        from lengthgen.evaluation.dependence import evaluate_tokens
        from lengthgen.evaluation.language_model import Scorer

        with autocast(device, precision):
            evaluate_tokens(out, cfg.eval, task, Scorer(method, model, asked.batch_size * cfg.task.train_max, device),
                            step)
    return rows


def output_folder(folder: Path, out: Path | None) -> Path:
    """Where the rows go (`out`, else the run folder), checked writable, and its eval.csv read
    before the long evaluation: an unreadable old file must stop us now, not after it."""
    out = folder if out is None else Path(out)
    if out.resolve() != folder.resolve():
        check_eval_out(out, folder)
    check_writable(out, "give --out DIR to write the evaluation elsewhere" if out == folder else "give another --out")
    if (out / "eval.csv").exists():
        read_rows(out / "eval.csv")
    return out


def swept_tasks(cfg: Config, task: Task, sweep: dict | None, columns: list[str]) -> tuple[dict, list]:
    """(the sweep, [(its options, the task with them)] a combination each): `sweep` (default the
    run's eval.sweep), checked as eval.sweep and against the names of eval.csv's columns (those
    of every row, and `columns`: the row's own metrics and the run's labels). A combination's
    position.* keys stretch RoPE, not the task: combinations differing only in them share one task."""
    if sweep is not None and sweep != cfg.eval.sweep:  # given for this evaluation (--sweep): check it as eval.sweep
        check_sweep(replace(cfg, eval=replace(cfg.eval, sweep=sweep)), task)
    sweep = with_factor(cfg.eval.sweep if sweep is None else sweep)
    clash = set(sweep) & (set(COLUMNS) | set(METRICS) | set(columns))
    if clash:
        raise UserError(f"eval.sweep option {sorted(clash)[0]!r} has the name of an eval.csv column; it cannot be swept")
    combos, tasks = option_combinations(sweep), {}  # one task per combination of task options
    for options in combos:
        own = split_options(options)[0]
        if repr(own) not in tasks:
            tasks[repr(own)] = task_of(cfg.task, **own) if own else task
    return sweep, [(options, tasks[repr(split_options(options)[0])]) for options in combos]


def eval_precision(tr: TrainConfig, device: torch.device, folder: Path) -> str:
    """train.precision, or fp32 where the device has no native bf16 (the weights are fp32: they
    are evaluated as they are)."""
    if tr.precision == "bf16" and not native_bf16(device):
        print(f"note: {folder} trained in bf16; this {device.type} has no native bf16, so it is evaluated in fp32",
              file=sys.stderr)
        return "fp32"
    return tr.precision


def fitting_batches(cfg: Config, cases: list, samples: int, batch_size: int, device: torch.device) -> dict:
    """{(task, length): (batch size, window tokens)} that fit, every case checked before the first
    runs (lengthgen.runtime.resources), with a note where a batch was lowered."""
    unique = list(dict.fromkeys((variant, length) for _, variant, length in cases))  # stretches share a task
    fits, note = batches_that_fit(cfg, unique, samples, batch_size, device)
    if note:
        print(note, file=sys.stderr)
    return fits


def evaluate_length(ctx: Measure, task: Task, length: int) -> tuple[dict, list[dict], list[dict]]:
    """The task's evaluator (`EVALUATORS`) at one length, its failures as one line: a length the
    model cannot read (past a learned position table), or out of memory."""
    try:
        return EVALUATORS[task.evaluation](ctx, task, length)
    except ValueError as err:  # e.g. a length past the learned position table
        raise UserError(f"cannot evaluate length {length}: {err}") from None
    except (MemoryError, RuntimeError) as err:
        if not is_out_of_memory(err):
            raise
        raise ResourceError(f"out of memory evaluating length {length} in batches of {ctx.batch_size} "
                            f"({oom_detail(err)}): lower --batch-size (eval.batch_size); the rows of "
                            "earlier evaluations stay in eval.csv") from None


def write_results(folder: Path, out: Path, rows: list[dict], steps_rows: list[dict] | None, position_rows: list[dict],
                  labels: dict, sweep: dict) -> None:
    """eval.csv (merged with the rows there), per_step.csv (unless None) and position_loss.csv
    in `out`, with a copy of the run's config.toml where `out` is not the run folder."""
    if out != folder and not (out / "config.toml").exists():  # whole or not at all: a retry must find none
        checkpoint.write_atomic(out / "config.toml", (folder / "config.toml").read_text(encoding="utf-8"))
    with rows_lock(out):  # read again: another evaluation may have written rows since
        old = read_rows(out / "eval.csv") if (out / "eval.csv").exists() else []
        write_rows(out / "eval.csv", rows, with_labels(old, labels), list(sweep))
    if position_rows:
        write_position_loss(out / POSITION_LOSS, position_rows)
    if steps_rows is not None:
        write_csv(out / "per_step.csv", steps_rows, columns_of(steps_rows, PER_STEP_COLUMNS))


@dataclass(frozen=True)
class Evaluated:
    """What every row of one evaluation names: the run folder, its config, the checkpoint's step, and
    the names of the task's and method's own metrics (the row's `metrics` cell)."""

    folder: Path
    cfg: Config
    step: int
    own: tuple[str, ...] = ()

    def ident(self, options: dict) -> dict:
        """The cells naming the run, and the swept task options `options`, in a per_step.csv row."""
        cfg = self.cfg
        return {"run": self.folder.name, "task": cfg.task.name, "method": cfg.method, "position": cfg.model.position,
                "seed": cfg.train.model_seed, "train_max": cfg.task.train_max,
                **{k: cell(v) for k, v in options.items()}}

    def row(self, length: int, samples: int, values: dict, baseline: float, stop: str | None = None,
            options: dict | None = None) -> dict:
        """One eval.csv row: the run, one length (and swept task options), one stop rule, `values`
        {metric: mean} (the metrics of `rules_at`) over `samples`, the random baseline at that length."""
        cfg = self.cfg
        return {"run": self.folder.name, "task": cfg.task.name, "method": cfg.method, "arm": "",
                "position": cfg.model.position, "stop": stop or "", "seed": cfg.train.model_seed, "length": length,
                "n": samples, "stop_step": math.nan, **values, "train_max": cfg.task.train_max, "baseline": baseline,
                "step": self.step, "metrics": " ".join(self.own), **{k: cell(v) for k, v in (options or {}).items()}}
