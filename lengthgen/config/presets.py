"""Load a config: defaults <- preset TOML <- --set, then validated against the registries.

lengthgen.config.schema reads and types the data; the checks here also need the task,
method, scheme and transform registries, so they sit above those modules in the
import graph (the schema imports none of them). Every message is one line naming
the key; the CLI turns it into exit code 2 before anything is written.
"""
from __future__ import annotations

import inspect
import itertools
import math
from dataclasses import fields
from pathlib import Path

from lengthgen.config.schema import (ATTENTION_DROPOUT_ON, CONFIDENCE_PRECISIONS, DEVICE_PATTERN, LENGTH_SAMPLING,
                                     LOG_SINKS, MAX_DATASET, MAX_EVAL_SEED, MAX_LENGTH, MAX_SEED, MAX_THREADS,
                                     PRECISIONS, Config, Dependence, _hint, from_data, parse_lengths, read)
from lengthgen.config.schedules import SCHEDULES
from lengthgen.errors import ConfigError
from lengthgen.methods.looped.stop_rules import parse_rule
from lengthgen.methods.registry import METHODS, get_method
from lengthgen.model.position_transforms import TRANSFORMS, base_ids, build_transform, real_columns
from lengthgen.model.positions import SCHEMES
from lengthgen.model.transformer import INITS, MLPS, NORMS, RESIDUALS  # the registries the block is built from
from lengthgen.tasks import TASKS, get_task, task_of


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


def training_positions(cfg: Config, task=None) -> tuple[int, int]:
    """(tokens in the widest training sequence, its largest position ID before any transform),
    measured on a fixed sample at task.train_max, as the method lays it out (the pause
    tokens of ntp-pause); widths differ between samples of some tasks."""
    import torch

    samples = max(1, min(256, 1_000_000 // cfg.task.train_max))  # bounded memory at huge lengths
    batch = (task or task_of(cfg.task)).sample(samples, cfg.task.train_max, torch.Generator().manual_seed(0))
    batch = built(f"method {cfg.method}", lambda: get_method(cfg.method).model_batch(batch))
    largest = int(base_ids(batch).masked_fill(~real_columns(batch), 0).max())
    if batch.target_ids is not None:  # the last answer token's ID is a target (ppc), never an input
        largest = max(largest, int(batch.target_ids.max()))
    return batch.inputs.shape[1], largest


def longest_sequence(cfg: Config) -> int:
    """Tokens in the widest training sequence at task.train_max."""
    return training_positions(cfg)[0]


def largest_position_id(cfg: Config, task=None) -> int:
    """The largest position ID training can produce: the task's (or 0..L-1's) at
    task.train_max, as the position transform maps it. ConfigError if it does not fit the
    transform's range."""
    _, base = training_positions(cfg, task)
    transform = build_transform(cfg.train.position_transform, cfg.train.position_transform_options)
    return built("train.position_transform_options", lambda: transform.largest_id(base))


def validate(cfg: Config) -> Config:
    """Reject impossible values; each message names the key."""
    t, m, tr, ev = cfg.task, cfg.model, cfg.train, cfg.eval
    for section in ("model", "train"):  # TOML has inf and nan: `train.lr=inf` would pass `> 0`
        for f in fields(getattr(cfg, section)):
            value = getattr(getattr(cfg, section), f.name)
            check(f.type != "float" or math.isfinite(value), f"{section}.{f.name} must be a finite number, got {value}")
    check(cfg.method in METHODS, f"method {cfg.method!r} is unknown{_hint(cfg.method, METHODS)}; choose from {', '.join(METHODS)}")
    check(t.name in TASKS, f"task.name {t.name!r} is unknown{_hint(t.name, TASKS)}; choose from {', '.join(TASKS)}")
    check(t.train_min >= 1, f"task.train_min must be >= 1, got {t.train_min}")
    check(t.train_max >= t.train_min, f"task.train_max ({t.train_max}) must be >= task.train_min ({t.train_min})")
    check(t.train_max <= MAX_LENGTH, f"task.train_max must be <= {MAX_LENGTH}, got {t.train_max}")
    check(m.position in SCHEMES, f"model.position {m.position!r} is unknown{_hint(m.position, SCHEMES)}; choose from {', '.join(SCHEMES)}")
    for key in ("d_model", "n_layer", "n_head", "mlp_ratio", "max_positions"):
        check(getattr(m, key) >= 1, f"model.{key} must be >= 1, got {getattr(m, key)}")
    check(m.d_model % m.n_head == 0, f"model.n_head ({m.n_head}) must divide model.d_model ({m.d_model})")
    rule(lambda: SCHEMES[m.position].check(m))
    for key in ("dropout", "attn_dropout", "mlp_dropout", "embed_dropout"):
        check(0.0 <= getattr(m, key) < 1.0, f"model.{key} must be in [0, 1), got {getattr(m, key)}")
    check(not (m.dropout and m.embed_dropout), "model.dropout already acts on the embedding; set model.embed_dropout "
          "only without it (the embedding's own rate, for a block with no residual dropout)")
    for key, choices in (("init", INITS), ("norm", NORMS), ("mlp", MLPS), ("residual", RESIDUALS),
                         ("attn_dropout_on", ATTENTION_DROPOUT_ON)):
        value = getattr(m, key)
        check(value in choices, f"model.{key} {value!r} is unknown{_hint(value, choices)}; choose from {', '.join(choices)}")
    for key in ("steps", "batch_size", "log_interval", "checkpoint_interval", "curriculum_interval"):
        check(getattr(tr, key) >= 1, f"train.{key} must be >= 1, got {getattr(tr, key)}")
    check(tr.lr > 0, f"train.lr must be > 0, got {tr.lr}")
    check(tr.weight_decay >= 0, f"train.weight_decay must be >= 0, got {tr.weight_decay}")
    check(len(tr.betas) == 2 and all(isinstance(b, (int, float)) and not isinstance(b, bool)
                                     and 0 <= b < 1 for b in tr.betas),
          f"train.betas must be two numbers in [0, 1), got {tr.betas}")
    tr.betas = [float(b) for b in tr.betas]  # AdamW refuses ints: `[0, 0.99]` means [0.0, 0.99]
    check(tr.grad_clip >= 0, f"train.grad_clip must be >= 0, got {tr.grad_clip}")
    check(tr.schedule in SCHEDULES, f"train.schedule {tr.schedule!r} is unknown{_hint(tr.schedule, SCHEDULES)}; choose from {', '.join(SCHEDULES)}")
    check(tr.warmup_steps >= 0, f"train.warmup_steps must be >= 0, got {tr.warmup_steps}")
    check(0 <= tr.min_lr_ratio <= 1, f"train.min_lr_ratio must be in [0, 1], got {tr.min_lr_ratio}")
    check(tr.curriculum_start == 0 or t.train_min <= tr.curriculum_start <= t.train_max,
          f"train.curriculum_start ({tr.curriculum_start}) must be 0 (off) or between task.train_min and task.train_max")
    check(tr.cosine_start >= 0, f"train.cosine_start must be >= 0, got {tr.cosine_start}")
    for problem in SCHEDULES[tr.schedule].problems(tr):  # the settings the schedule reads
        check(False, problem)
    check_finite_set(cfg)
    check(tr.length_sampling in LENGTH_SAMPLING, f"train.length_sampling {tr.length_sampling!r} is unknown; choose from {', '.join(LENGTH_SAMPLING)}")
    check(0 <= tr.ema < 1, f"train.ema must be in [0, 1), got {tr.ema}")
    check(0 <= tr.ema_start < max(tr.steps, 1), f"train.ema_start must be in 0..train.steps - 1 ({tr.steps - 1}), got {tr.ema_start}")
    check(ev.confidence_precision in CONFIDENCE_PRECISIONS, f"eval.confidence_precision {ev.confidence_precision!r} "
          f"is unknown; choose from {', '.join(CONFIDENCE_PRECISIONS)}")
    check(tr.precision in PRECISIONS, f"train.precision {tr.precision!r} is unknown; choose from {', '.join(PRECISIONS)}")
    check(0 <= tr.threads <= MAX_THREADS, f"train.threads must be in 0..{MAX_THREADS}, got {tr.threads}")
    check(1 <= tr.data_shards <= tr.batch_size and tr.batch_size % tr.data_shards == 0,
          f"train.data_shards ({tr.data_shards}) must be >= 1 and divide train.batch_size ({tr.batch_size})")
    for sink in tr.log_to:
        check(sink in LOG_SINKS, f"train.log_to names {sink!r}{_hint(str(sink), LOG_SINKS)}; choose from {', '.join(LOG_SINKS)}")
    for key in ("model_seed", "data_seed"):
        check(0 <= getattr(tr, key) < MAX_SEED, f"train.{key} must be in [0, 2**63), got {getattr(tr, key)}")
    check(0 <= ev.seed < MAX_EVAL_SEED, f"eval.seed must be in [0, 2**40), got {ev.seed}")
    check(DEVICE_PATTERN.fullmatch(tr.device) is not None,
          f"train.device {tr.device!r} must be auto, cpu, cuda, cuda:N or mps")
    try:
        parse_lengths(ev.lengths)
    except ConfigError as err:  # its message starts "lengths ...": name the key
        raise ConfigError(f"eval.{err}") from None
    check(ev.samples >= 1, f"eval.samples must be >= 1, got {ev.samples}")
    check_tests(cfg)
    check(ev.batch_size >= 1, f"eval.batch_size must be >= 1, got {ev.batch_size}")
    check_options("task.options", t.options, TASKS[t.name], t.name)
    task = built("task.options", lambda: get_task(t.name, **t.options))
    if tr.test_options:  # the tested samples' task: the run's, these options replacing its own
        check_options("train.test_options", tr.test_options, TASKS[t.name], t.name)
        built("train.test_options", lambda: task_of(t, **tr.test_options))
    check(0 <= t.trailing_pad <= MAX_LENGTH, f"task.trailing_pad must be in 0..{MAX_LENGTH}, got {t.trailing_pad}")
    if t.trailing_pad or t.pad_to_row:  # refused for tasks scored inside the sequence and for coupled position IDs
        import torch

        built("task.trailing_pad" if t.trailing_pad else "task.pad_to_row", lambda: task_of(t).sample(2, t.train_min, torch.Generator()))
    check(t.train_min >= task.min_length, f"task.train_min must be >= {task.min_length} for {t.name}, got {t.train_min}")
    check(not (task.draws_own_lengths and tr.length_sampling == "per_batch"),
          f"task.options of {t.name} draw each sample's lengths by the task's own law; train.length_sampling "
          "per_batch would bypass it (set train.length_sampling=per_sample)")
    shortest = min(parse_lengths(ev.lengths))
    check(shortest >= task.min_length, f"eval.lengths includes {shortest}; {t.name} needs lengths >= {task.min_length}")
    shortest = min(parse_lengths(tr.test_lengths)) if tr.test_lengths else task.min_length
    check(shortest >= task.min_length, f"train.test_lengths includes {shortest}; {t.name} needs lengths >= {task.min_length}")
    check(tr.id_loss_weight >= 0, f"train.id_loss_weight must be >= 0, got {tr.id_loss_weight}")
    check(tr.halt_loss_weight >= 0, f"train.halt_loss_weight must be >= 0, got {tr.halt_loss_weight}")
    check_options("model.position_options", m.position_options, SCHEMES[m.position], m.position, skip=("cfg",))
    if m.position_options:  # a scheme checks its own option values when built
        built("model.position_options", lambda: SCHEMES[m.position](m, **m.position_options))
    check_sweep(cfg, task)
    check_token_eval(cfg)
    name = tr.position_transform
    check(name in TRANSFORMS, f"train.position_transform {name!r} is unknown{_hint(name, TRANSFORMS)}; "
                              f"choose from {', '.join(TRANSFORMS)}")
    transform, scheme, method = TRANSFORMS[name], SCHEMES[m.position], get_method(cfg.method)
    rule(lambda: task.check(cfg, transform))  # each variant's own rules
    rule(lambda: method.check(cfg, task, transform, scheme))
    check_options("train.position_transform_options", tr.position_transform_options, TRANSFORMS[name], name)
    built("train.position_transform_options", lambda: build_transform(name, tr.position_transform_options))
    draws_at_eval = transform.random_at_evaluation
    check(isinstance(cfg.eval.position_draws, int) and 1 <= cfg.eval.position_draws <= 1000,
          f"eval.position_draws must be an integer in [1, 1000], got {cfg.eval.position_draws}")
    check(cfg.eval.position_draws == 1 or draws_at_eval,
          f"eval.position_draws = {cfg.eval.position_draws} needs a position transform that draws IDs at evaluation "
          f"(randomized); train.position_transform {name!r} evaluates on the task's own IDs")
    sized = scheme.has_table or method.needs_target_ids  # a table, or ppc's ID head, of max_positions rows
    if sized or transform.changes_ids:  # an overrun would fail at step 1, after the folder is made
        largest = largest_position_id(cfg, task)
        if not transform.changes_ids:
            check(largest < m.max_positions,
                  f"model.max_positions ({m.max_positions}) is shorter than the longest training sequence "
                  f"({largest + 1} tokens at task.train_max {t.train_max}); set it to at least {largest + 1}")
        elif sized:
            check(largest < m.max_positions,
                  f"model.max_positions ({m.max_positions}) is too small for train.position_transform {name}, which "
                  f"trains position IDs up to {largest}; set it to at least {largest + 1}")
    return cfg


def check_finite_set(cfg: Config) -> None:
    """train.dataset_size: 0 (fresh samples) or a set drawn once over the whole training range,
    read by one stream (lengthgen.training.finite_set)."""
    tr = cfg.train
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


def check_token_eval(cfg: Config) -> None:
    """eval.token_*: contexts of a language-model task, read by a method that takes position IDs
    and has no stop rules, within a position table; eval.dependence: two contexts at least, options
    of lengthgen.config.schema.Dependence."""
    ev, m = cfg.eval, cfg.model
    contexts = ev.token_contexts
    check(all(isinstance(c, int) and not isinstance(c, bool) and 1 <= c <= MAX_LENGTH for c in contexts)
          and len(set(contexts)) == len(contexts),
          f"eval.token_contexts must be distinct integers in [1, {MAX_LENGTH}], got {contexts!r}")
    check(isinstance(ev.token_stride, int) and ev.token_stride >= 1, f"eval.token_stride must be >= 1, got {ev.token_stride}")
    check(ev.token_limit >= 0, f"eval.token_limit must be >= 0 (0 = every token), got {ev.token_limit}")
    if contexts:
        method = get_method(cfg.method)
        check(method.accepts_position_ids and not method.has_stop_rules,
              f"eval.token_contexts needs a next-token method that reads position IDs, not {cfg.method}")
        check(not SCHEMES[m.position].has_table or max(contexts) <= m.max_positions,
              f"eval.token_contexts reaches {max(contexts)} tokens, past model.max_positions ({m.max_positions})")
    check(not ev.dependence or len(contexts) >= 2,
          "eval.dependence needs eval.token_contexts with two contexts at least (near = the smallest, "
          "full = the largest)")
    check_options("eval.dependence_options", ev.dependence_options, Dependence, "the dependence measurement")
    built("eval.dependence_options", lambda: Dependence(**ev.dependence_options))


def check_tests(cfg: Config) -> None:
    """train.test_*: lengths as eval.lengths, rules the method can apply, tasks scored by exact match."""
    tr = cfg.train
    check(tr.test_interval >= 0, f"train.test_interval must be >= 0 (0 = off), got {tr.test_interval}")
    check(tr.test_samples >= 1, f"train.test_samples must be >= 1, got {tr.test_samples}")
    check(0 <= tr.test_offset < max(tr.test_interval, 1),
          f"train.test_offset must be in 0..train.test_interval - 1, got {tr.test_offset}")
    if tr.test_lengths:
        try:
            parse_lengths(tr.test_lengths)
        except ConfigError as err:
            raise ConfigError(f"train.test_{err}") from None
    method = get_method(cfg.method)
    for stop in tr.test_stops:  # a method without stop rules ignores them (a grid's ntp arm on a looped preset)
        try:
            rule = parse_rule(str(stop))
            if method.has_stop_rules:
                rule.check(method)
        except ValueError as err:
            raise ConfigError(f"train.test_stops: {err}") from None


def check_sweep(cfg: Config, task) -> None:
    """eval.sweep: task options, each with a non-empty list of values the task accepts
    without changing its vocabulary."""
    t, sweep = cfg.task, cfg.eval.sweep
    check_options("eval.sweep", sweep, TASKS[t.name], t.name)
    for key, values in sweep.items():
        check(isinstance(values, list) and values and len(set(map(repr, values))) == len(values),
              f"eval.sweep.{key} must be a non-empty list of distinct values, got {values!r}")
    vocab = task.vocab
    for combo in itertools.product(*sweep.values()):
        options = {**t.options, **dict(zip(sweep, combo))}
        where = f"eval.sweep ({', '.join(f'{k}={v!r}' for k, v in zip(sweep, combo))})"
        swept = built(where, lambda: get_task(t.name, **options))
        check(swept.vocab == vocab, f"{where} changes the task's vocabulary, which the trained model cannot read")
        shortest = min(parse_lengths(cfg.eval.lengths))
        check(shortest >= swept.min_length,
              f"eval.lengths includes {shortest}; {t.name} with {where[12:-1]} needs lengths >= {swept.min_length}")


# A learned table that reads coupled or predicted IDs starts at T5's N(0, 1), as Cho et al.'s does,
# unless model.position_options.std is set: at GPT-2's N(0, 0.02) its rows are 50x smaller than the
# token embeddings they are added to, and coupled addition does not train at CPU scale
# (docs/positions.md, "Which init each learned table uses").
GIVEN_IDS_TABLE_STD = 1.0


def reads_given_ids(cfg: Config, task=None) -> bool:
    """Whether the model reads position IDs that are not 0..L-1: the task's own (coupled, abacus)
    or the ones the method predicts (ppc)."""
    import torch

    if get_method(cfg.method).needs_target_ids:
        return True
    batch = (task or task_of(cfg.task)).sample(2, cfg.task.train_min, torch.Generator().manual_seed(0))
    return batch.position_ids is not None


def given_ids_table_init(cfg: Config) -> Config:
    """A new run's config with GIVEN_IDS_TABLE_STD where its learned table reads coupled or
    predicted IDs and no std is set. Applied to presets, never to a saved run's config (load_saved):
    a run keeps the init it was trained with."""
    m = cfg.model
    if SCHEMES[m.position].trains_table and "std" not in m.position_options and reads_given_ids(cfg):
        m.position_options = {**m.position_options, "std": GIVEN_IDS_TABLE_STD}
    return cfg


def load(preset: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """A new run's config: defaults <- preset TOML <- --set overrides, validated, with the
    defaults that follow from its parts (given_ids_table_init)."""
    return given_ids_table_init(validate(read(preset, overrides)))


def load_saved(path: str | Path) -> Config:
    """A run folder's config.toml, validated, as the run was trained: no default is added."""
    return validate(read(path))


def from_dict(data: dict) -> Config:
    """A validated Config from a dict such as to_dict's (a checkpoint's state)."""
    return validate(from_data(data))
