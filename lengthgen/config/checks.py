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
                                     PRECISIONS, Config, EvalConfig, ModelConfig, TaskConfig, TrainConfig, _hint,
                                     parse_lengths)
from lengthgen.config.dependence import Dependence
from lengthgen.config.schedules import SCHEDULES
from lengthgen.errors import ConfigError

NO_OPTIONS = "none (it takes no options)"


def check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def check_options(key: str, options: dict, cls: type, owner: str, skip: tuple[str, ...] = ()) -> None:
    """Every key of an options table (`task.options`, `model.position_options`, ...) must be
    a keyword of `cls`'s constructor."""
    params = inspect.signature(cls.__init__).parameters.values()  # object's (*args, **kwargs): none
    accepted = [p.name for p in params
                if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in ("self", *skip)]
    for name in options:
        check(name in accepted, f"{key}.{name} is not an option of {owner}{_hint(name, accepted)}; "
                                f"its options: {', '.join(accepted) or NO_OPTIONS}")


def check_choice(key: str, value, choices) -> None:
    """`value` is one of `choices` (a registry or a tuple), else a message naming the close ones."""
    check(value in choices, f"{key} {value!r} is unknown{_hint(value, choices)}; choose from {', '.join(choices)}")


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
    check_train(cfg)
    check_schedule(cfg.train)
    check_finite_set(cfg.train)
    check_run_settings(cfg.train)
    check_eval(cfg.eval)
    check_tests(cfg.train)
    check_token_eval(cfg.eval)
    return cfg


def check_finite(cfg: Config) -> None:
    """TOML has inf and nan: `train.lr=inf` would pass `> 0`."""
    for section in ("model", "train"):
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


def check_train(cfg: Config) -> None:
    t, tr = cfg.task, cfg.train
    for key in ("steps", "batch_size", "log_interval", "checkpoint_interval", "curriculum_interval"):
        check(getattr(tr, key) >= 1, f"train.{key} must be >= 1, got {getattr(tr, key)}")
    check(tr.lr > 0, f"train.lr must be > 0, got {tr.lr}")
    check(tr.weight_decay >= 0, f"train.weight_decay must be >= 0, got {tr.weight_decay}")
    check(len(tr.betas) == 2 and all(isinstance(b, (int, float)) and not isinstance(b, bool)
                                     and 0 <= b < 1 for b in tr.betas),
          f"train.betas must be two numbers in [0, 1), got {tr.betas}")
    tr.betas = [float(b) for b in tr.betas]  # AdamW refuses ints: `[0, 0.99]` means [0.0, 0.99]
    check(tr.grad_clip >= 0, f"train.grad_clip must be >= 0, got {tr.grad_clip}")
    check(tr.curriculum_start == 0 or t.train_min <= tr.curriculum_start <= t.train_max,
          f"train.curriculum_start ({tr.curriculum_start}) must be 0 (off) or between task.train_min and task.train_max")
    check(tr.length_sampling in LENGTH_SAMPLING, f"train.length_sampling {tr.length_sampling!r} is unknown; choose from {', '.join(LENGTH_SAMPLING)}")
    check(0 <= tr.ema < 1, f"train.ema must be in [0, 1), got {tr.ema}")
    check(0 <= tr.ema_start < max(tr.steps, 1), f"train.ema_start must be in 0..train.steps - 1 ({tr.steps - 1}), got {tr.ema_start}")


def check_schedule(tr: TrainConfig) -> None:
    """The learning-rate schedule and the settings it reads."""
    check_choice("train.schedule", tr.schedule, SCHEDULES)
    check(tr.warmup_steps >= 0, f"train.warmup_steps must be >= 0, got {tr.warmup_steps}")
    check(0 <= tr.min_lr_ratio <= 1, f"train.min_lr_ratio must be in [0, 1], got {tr.min_lr_ratio}")
    check(tr.cosine_start >= 0, f"train.cosine_start must be >= 0, got {tr.cosine_start}")
    for problem in SCHEDULES[tr.schedule].problems(tr):
        check(False, problem)


def check_run_settings(tr: TrainConfig) -> None:
    """Where and how a run executes: precision, threads, shards, log sinks, seeds, device."""
    check(tr.precision in PRECISIONS, f"train.precision {tr.precision!r} is unknown; choose from {', '.join(PRECISIONS)}")
    check(0 <= tr.threads <= MAX_THREADS, f"train.threads must be in 0..{MAX_THREADS}, got {tr.threads}")
    check(1 <= tr.data_shards <= tr.batch_size and tr.batch_size % tr.data_shards == 0,
          f"train.data_shards ({tr.data_shards}) must be >= 1 and divide train.batch_size ({tr.batch_size})")
    for sink in tr.log_to:
        check(sink in LOG_SINKS, f"train.log_to names {sink!r}{_hint(str(sink), LOG_SINKS)}; choose from {', '.join(LOG_SINKS)}")
    for key in ("model_seed", "data_seed"):
        check(0 <= getattr(tr, key) < MAX_SEED, f"train.{key} must be in [0, 2**63), got {getattr(tr, key)}")
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


def check_finite_set(tr: TrainConfig) -> None:
    """train.dataset_size: 0 (fresh samples) or a set drawn once over the whole training range,
    read by one stream (lengthgen.training.finite_set)."""
    check(0 <= tr.dataset_size <= MAX_DATASET, f"train.dataset_size must be in 0..{MAX_DATASET} (0 = fresh samples "
                                               f"every step), got {tr.dataset_size}")
    if not tr.dataset_size:
        return
    check(tr.curriculum_start == 0, "train.dataset_size fixes the training set over task.train_min..train_max once; "
                                    "it cannot follow a curriculum (set train.curriculum_start=0)")
    check(tr.length_sampling == "per_sample", "train.dataset_size draws lengths per sample, as the task's law gives "
                                              "them; set train.length_sampling=per_sample")
    check(tr.data_shards == 1, f"train.dataset_size is read as one stream; set train.data_shards=1 "
                               f"(now {tr.data_shards})")


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


def check_tests(tr: TrainConfig) -> None:
    """train.test_*: an interval, an offset within it, lengths as eval.lengths. (The stop rules are
    checked against the method where the run is assembled.)"""
    check(tr.test_interval >= 0, f"train.test_interval must be >= 0 (0 = off), got {tr.test_interval}")
    check(tr.test_samples >= 1, f"train.test_samples must be >= 1, got {tr.test_samples}")
    check(0 <= tr.test_offset < max(tr.test_interval, 1),
          f"train.test_offset must be in 0..train.test_interval - 1, got {tr.test_offset}")
    if tr.test_lengths:
        try:
            parse_lengths(tr.test_lengths)
        except ConfigError as err:
            raise ConfigError(f"train.test_{err}") from None
