"""The checks each section of a config makes of its own values: ranges, types and choices that need
no registry. What needs the task, method, scheme or transform registries (names, options, whether
the parts suit each other) is checked where the run is assembled (lengthgen.assembly). Every
message is one line naming the key; the CLI turns it into exit code 2 before anything is written.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import fields

from lengthgen.config.schema import (ATTENTION_DROPOUT_ON, CONFIDENCE_PRECISIONS, DEVICE_PATTERN, LENGTH_SAMPLING,
                                     LOG_SINKS, MAX_DATASET, MAX_EVAL_SEED, MAX_LENGTH, MAX_SEED, MAX_THREADS,
                                     PRECISIONS, Config, DataConfig, EvalConfig, ModelConfig, OptimConfig, TaskConfig,
                                     TrainConfig, TrainTestsConfig, _hint, parse_lengths)
from lengthgen.config.dependence import Dependence
from lengthgen.config.schedules import SCHEDULES
from lengthgen.errors import ConfigError

NO_OPTIONS = "none (it takes no options)"


def check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def check_options(key: str, options: dict, cls: type, owner: str, skip: tuple[str, ...] = ()) -> None:
    """Every key of an options table (`task.options`, `model.position_options`, ...) must be
    a keyword of `cls`'s constructor. The messages are built only for a key that fails: reading a
    signature and finding close names cost a config load about half its time."""
    if not options:
        return
    params = inspect.signature(cls.__init__).parameters.values()  # object's (*args, **kwargs): none
    accepted = [p.name for p in params
                if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in ("self", *skip)]
    for name in options:
        if name not in accepted:
            raise ConfigError(f"{key}.{name} is not an option of {owner}{_hint(name, accepted)}; "
                              f"its options: {', '.join(accepted) or NO_OPTIONS}")


def check_choice(key: str, value, choices) -> None:
    """`value` is one of `choices` (a registry or a tuple), else a message naming the close ones."""
    if value in choices:
        return
    where = choices.unknown() if hasattr(choices, "unknown") else ""  # a registry: where a plugin's name comes from
    raise ConfigError(f"{key} {value!r} is unknown{_hint(value, choices)}; choose from {', '.join(choices)}{where}")


def rule(variant_check) -> None:
    """A variant's own check: its ValueError, whose message names the key, as a ConfigError."""
    try:
        variant_check()
    except ValueError as err:
        raise ConfigError(str(err)) from None


def built(key: str, make):
    """make(), with its TypeError / ValueError (a bad option value) as a ConfigError naming `key`."""
    try:
        return make()
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{key}: {err}") from None


def validate(cfg: Config) -> Config:
    """Reject impossible values of each section on its own; each message names the key."""
    check_finite(cfg)
    check_task(cfg.task)
    check_model(cfg.model)
    check_train(cfg.train)
    check_optim(cfg.optim, cfg.train.steps)
    check_schedule(cfg.optim)
    check_data(cfg.data, cfg.task, cfg.train.batch_size)
    check_run_settings(cfg.train)
    check_eval(cfg.eval)
    check_tests(cfg.tests)
    check_token_eval(cfg.eval)
    return cfg


def check_finite(cfg: Config) -> None:
    """TOML has inf and nan: `optim.lr=inf` would pass `> 0`."""
    for section in ("model", "train", "optim", "data"):
        for f in fields(getattr(cfg, section)):
            value = getattr(getattr(cfg, section), f.name)
            check(f.type != "float" or math.isfinite(value), f"{section}.{f.name} must be a finite number, got {value}")


def check_task(t: TaskConfig) -> None:
    check(t.train_min >= 1, f"task.train_min must be >= 1, got {t.train_min}")
    check(t.train_max >= t.train_min, f"task.train_max ({t.train_max}) must be >= task.train_min ({t.train_min})")
    check(t.train_max <= MAX_LENGTH, f"task.train_max must be <= {MAX_LENGTH}, got {t.train_max}")
    check(0 <= t.trailing_pad <= MAX_LENGTH, f"task.trailing_pad must be in 0..{MAX_LENGTH}, got {t.trailing_pad}")


def check_model(m: ModelConfig) -> None:
    for key in ("d_model", "n_layer", "n_head", "mlp_ratio", "max_positions"):
        check(getattr(m, key) >= 1, f"model.{key} must be >= 1, got {getattr(m, key)}")
    check(m.d_model % m.n_head == 0, f"model.n_head ({m.n_head}) must divide model.d_model ({m.d_model})")
    for key in ("dropout", "attn_dropout", "mlp_dropout", "embed_dropout"):
        check(0.0 <= getattr(m, key) < 1.0, f"model.{key} must be in [0, 1), got {getattr(m, key)}")
    check(not (m.dropout and m.embed_dropout), "model.dropout already acts on the embedding; set model.embed_dropout "
          "only without it (the embedding's own rate, for a block with no residual dropout)")
    check_choice("model.attn_dropout_on", m.attn_dropout_on, ATTENTION_DROPOUT_ON)


def check_train(tr: TrainConfig) -> None:
    for key in ("steps", "batch_size", "log_interval", "checkpoint_interval"):
        check(getattr(tr, key) >= 1, f"train.{key} must be >= 1, got {getattr(tr, key)}")


def check_optim(op: OptimConfig, steps: int) -> None:
    check(op.lr > 0, f"optim.lr must be > 0, got {op.lr}")
    check(op.weight_decay >= 0, f"optim.weight_decay must be >= 0, got {op.weight_decay}")
    check(len(op.betas) == 2 and all(isinstance(b, (int, float)) and not isinstance(b, bool)
                                     and 0 <= b < 1 for b in op.betas),
          f"optim.betas must be two numbers in [0, 1), got {op.betas}")
    op.betas = [float(b) for b in op.betas]  # AdamW refuses ints: `[0, 0.99]` means [0.0, 0.99]
    check(op.grad_clip >= 0, f"optim.grad_clip must be >= 0, got {op.grad_clip}")
    check(0 <= op.ema < 1, f"optim.ema must be in [0, 1), got {op.ema}")
    check(0 <= op.ema_start < max(steps, 1), f"optim.ema_start must be in 0..train.steps - 1 ({steps - 1}), got {op.ema_start}")


def check_schedule(op: OptimConfig) -> None:
    """The learning-rate schedule and the settings it reads."""
    check_choice("optim.schedule", op.schedule, SCHEDULES)
    check(op.warmup_steps >= 0, f"optim.warmup_steps must be >= 0, got {op.warmup_steps}")
    check(0 <= op.min_lr_ratio <= 1, f"optim.min_lr_ratio must be in [0, 1], got {op.min_lr_ratio}")
    check(op.cosine_start >= 0, f"optim.cosine_start must be >= 0, got {op.cosine_start}")
    for problem in SCHEDULES[op.schedule].problems(op):
        check(False, problem)


def check_data(d: DataConfig, t: TaskConfig, batch_size: int) -> None:
    """The training stream: its seed, curriculum, length law, shards and finite set."""
    check(0 <= d.seed < MAX_SEED, f"data.seed must be in [0, 2**63), got {d.seed}")
    check(d.curriculum_interval >= 1, f"data.curriculum_interval must be >= 1, got {d.curriculum_interval}")
    check(d.curriculum_start == 0 or t.train_min <= d.curriculum_start <= t.train_max,
          f"data.curriculum_start ({d.curriculum_start}) must be 0 (off) or between task.train_min and task.train_max")
    check_choice("data.length_sampling", d.length_sampling, LENGTH_SAMPLING)
    check(1 <= d.shards <= batch_size and batch_size % d.shards == 0,
          f"data.shards ({d.shards}) must be >= 1 and divide train.batch_size ({batch_size})")
    check_finite_set(d)


def check_run_settings(tr: TrainConfig) -> None:
    """Where and how a run executes: precision, threads, log sinks, the weights' seed, device."""
    check(tr.precision in PRECISIONS, f"train.precision {tr.precision!r} is unknown; choose from {', '.join(PRECISIONS)}")
    check(0 <= tr.threads <= MAX_THREADS, f"train.threads must be in 0..{MAX_THREADS}, got {tr.threads}")
    for sink in tr.log_to:
        check(sink in LOG_SINKS, f"train.log_to names {sink!r}{_hint(str(sink), LOG_SINKS)}; choose from {', '.join(LOG_SINKS)}")
    check(0 <= tr.model_seed < MAX_SEED, f"train.model_seed must be in [0, 2**63), got {tr.model_seed}")
    check(DEVICE_PATTERN.fullmatch(tr.device) is not None,
          f"train.device {tr.device!r} must be auto, cpu, cuda, cuda:N or mps")


def check_eval(ev: EvalConfig) -> None:
    check(ev.confidence_precision in CONFIDENCE_PRECISIONS, f"eval.confidence_precision {ev.confidence_precision!r} "
          f"is unknown; choose from {', '.join(CONFIDENCE_PRECISIONS)}")
    check(0 <= ev.seed < MAX_EVAL_SEED, f"eval.seed must be in [0, 2**40), got {ev.seed}")
    try:
        parse_lengths(ev.lengths)
    except ConfigError as err:  # its message starts "lengths ...": name the key
        raise ConfigError(f"eval.{err}") from None
    check(ev.samples >= 1, f"eval.samples must be >= 1, got {ev.samples}")
    check(ev.batch_size >= 1, f"eval.batch_size must be >= 1, got {ev.batch_size}")
    check(isinstance(ev.position_draws, int) and 1 <= ev.position_draws <= 1000,
          f"eval.position_draws must be an integer in [1, 1000], got {ev.position_draws}")


def check_finite_set(d: DataConfig) -> None:
    """data.dataset_size: 0 (fresh samples) or a set drawn once over the whole training range,
    read by one stream (lengthgen.training.finite_set)."""
    check(0 <= d.dataset_size <= MAX_DATASET, f"data.dataset_size must be in 0..{MAX_DATASET} (0 = fresh samples "
                                              f"every step), got {d.dataset_size}")
    if not d.dataset_size:
        return
    check(d.curriculum_start == 0, "data.dataset_size fixes the training set over task.train_min..train_max once; "
                                   "it cannot follow a curriculum (set data.curriculum_start=0)")
    check(d.length_sampling == "per_sample", "data.dataset_size draws lengths per sample, as the task's law gives "
                                             "them; set data.length_sampling=per_sample")
    check(d.shards == 1, f"data.dataset_size is read as one stream; set data.shards=1 (now {d.shards})")


def check_token_eval(ev: EvalConfig) -> None:
    """eval.token_*: distinct contexts within the longest length; eval.dependence: two contexts at
    least, options of lengthgen.config.dependence.Dependence. (Which method and table can read them is
    the assembled run's check.)"""
    contexts = ev.token_contexts
    check(all(isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= MAX_LENGTH for c in contexts)
          and len(set(contexts)) == len(contexts),
          f"eval.token_contexts must be distinct integers in [1, {MAX_LENGTH}], got {contexts!r}")
    check(isinstance(ev.token_stride, int) and ev.token_stride >= 1, f"eval.token_stride must be >= 1, got {ev.token_stride}")
    check(ev.token_limit >= 0, f"eval.token_limit must be >= 0 (0 = every token), got {ev.token_limit}")
    check(not ev.dependence or len(contexts) >= 2,
          "eval.dependence needs eval.token_contexts with two contexts at least (near = the smallest, "
          "full = the largest)")
    check_options("eval.dependence_options", ev.dependence_options, Dependence, "the dependence measurement")
    built("eval.dependence_options", lambda: Dependence(**ev.dependence_options))


def check_tests(te: TrainTestsConfig) -> None:
    """tests.*: an interval, an offset within it, lengths as eval.lengths. (The stop rules are
    checked against the method where the run is assembled.)"""
    check(te.interval >= 0, f"tests.interval must be >= 0 (0 = off), got {te.interval}")
    check(te.samples >= 1, f"tests.samples must be >= 1, got {te.samples}")
    check(0 <= te.offset < max(te.interval, 1), f"tests.offset must be in 0..tests.interval - 1, got {te.offset}")
    if te.lengths:
        try:
            parse_lengths(te.lengths)
        except ConfigError as err:
            raise ConfigError(f"tests.{err}") from None
