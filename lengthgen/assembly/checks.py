"""The checks of a config against the registries, each part built once on the way: the task, the
method, the positional scheme's class and the position transform (`checked_parts`), and the
evaluation sweep (`check_sweep`, which evaluation and a reproduction's plan run on sweeps of their own).

lengthgen.config checks each section's own values (plain data); the checks here need the registries
(a name, an options table, whether the parts suit each other). Every message is one line naming the
key; the CLI turns it into exit code 2 before anything is written. The runs these parts make up are
lengthgen.assembly.runs'.
"""
from __future__ import annotations

import inspect

from lengthgen.config.checks import built, check, check_choice, check_options, rule, validate
from lengthgen.config.schema import Config, ModelConfig, TrainTestsConfig, option_combinations, parse_lengths
from lengthgen.errors import ConfigError
from lengthgen.methods.looped.stop_rules import parse_rule
from lengthgen.methods.registry import METHODS, Method, get_method
from lengthgen.model.position_transforms import TRANSFORMS, PositionTransform, build_transform
from lengthgen.model.positions import SCHEMES
from lengthgen.model.rope_scaling import AS_TRAINED, SCALINGS
from lengthgen.model.rotary import RoPE
from lengthgen.model.transformer import INITS, MLPS, NORMS, RESIDUALS  # the registries the block is built from
from lengthgen.plugins import load as import_plugins
from lengthgen.tasks import TASKS, Task, TrailingPad, get_task, task_of

POSITION_SWEEP = ("position.scaling", "position.factor")  # eval.sweep keys of RoPE stretched at test time


def checked_parts(cfg: Config) -> tuple[Task, Method, type, PositionTransform]:
    """(task, method, scheme class, transform) of `cfg`, checked section by section, then against the
    registries (its plugins loaded first), each part built once. What needs the widest training
    sequence (the position range) is checked where the run is measured (lengthgen.assembly.runs)."""
    import_plugins(cfg.plugins)  # (and every installed one), once per process: registered before any name is read
    validate(cfg)
    _check_names(cfg)
    task = _checked_task(cfg)
    check_options("method_options", cfg.method_options, METHODS[cfg.method], cfg.method, skip=("cfg",))
    method = built("method_options", lambda: get_method(cfg.method, cfg))
    _check_stops(cfg.tests, method)
    check(cfg.model.causal or method.bidirectional,
          f"model.causal = false (bidirectional attention) needs a method that reads whole answers from blank slots "
          f"without decoding (one with the bidirectional capability: {', '.join(_bidirectional_methods())}); "
          f"method {cfg.method} would see the tokens it predicts")
    _with_task_levels(cfg, task)
    scheme = _checked_scheme(cfg.model)
    check_sweep(cfg, task)
    _check_token_reading(cfg, method, scheme)
    transform = _checked_transform(cfg, task, method, scheme)
    _check_id_levels(cfg, task, scheme, transform)
    return task, method, scheme, transform


def check_sweep(cfg: Config, task: Task) -> None:
    """eval.sweep: task options, each with a non-empty list of values the task accepts without
    changing its vocabulary; and the position.* keys of RoPE stretched at test time (_check_position_sweep)."""
    t = cfg.task
    sweep = {k: v for k, v in cfg.eval.sweep.items() if not k.startswith("position.")}
    check_options("eval.sweep", sweep, TASKS[t.name], t.name)
    for key, values in cfg.eval.sweep.items():
        check(isinstance(values, list) and values and len(set(map(repr, values))) == len(values),
              f"eval.sweep.{key} must be a non-empty list of distinct values, got {values!r}")
    _check_position_sweep(cfg)
    shortest = min(parse_lengths(cfg.eval.lengths))
    for combo in option_combinations(sweep) if sweep else ():  # no sweep: the run's own task, checked
        options = {**t.options, **combo}
        where = f"eval.sweep ({', '.join(f'{k}={v!r}' for k, v in combo.items())})"
        swept = built(where, lambda: get_task(t.name, **options))
        check(swept.vocab == task.vocab, f"{where} changes the task's vocabulary, which the trained model cannot read")
        check(shortest >= swept.min_length,
              f"eval.lengths includes {shortest}; {t.name} with {where[12:-1]} needs lengths >= {swept.min_length}")


def _bidirectional_methods() -> list[str]:
    return [name for name, cls in METHODS.items() if cls.bidirectional]


def _check_names(cfg: Config) -> None:
    """Each name a registry must know."""
    m = cfg.model
    check_choice("method", cfg.method, METHODS)
    check_choice("task.name", cfg.task.name, TASKS)
    check_choice("model.position", m.position, SCHEMES)
    for key, choices in (("init", INITS), ("norm", NORMS), ("mlp", MLPS), ("residual", RESIDUALS)):
        check_choice(f"model.{key}", getattr(m, key), choices)
    check_choice("data.position_transform", cfg.data.position_transform, TRANSFORMS)


def _checked_task(cfg: Config) -> Task:
    """The run's task, built once, with its options, its pads and the lengths it is asked for checked."""
    t, te = cfg.task, cfg.tests
    check_options("task.options", t.options, TASKS[t.name], t.name)
    task = built("task.options", lambda: get_task(t.name, **t.options))
    if te.options:  # the tested samples' task: the run's, these options replacing its own
        check_options("tests.options", te.options, TASKS[t.name], t.name)
        built("tests.options", lambda: task_of(t, **te.options))
    if t.trailing_pad or t.pad_to_row:  # refused for tasks scored inside the sequence and for coupled position IDs
        import torch

        key = "task.trailing_pad" if t.trailing_pad else "task.pad_to_row"
        task = built(key, lambda: TrailingPad(task, t.trailing_pad, t.pad_to_row))
        built(key, lambda: task.sample(2, t.train_min, torch.Generator()))
    check(t.train_min >= task.min_length,
          f"task.train_min must be >= {task.min_length} for {t.name}, got {t.train_min}")
    check(not (task.draws_own_lengths and cfg.data.length_sampling == "per_batch"),
          f"task.options of {t.name} draw each sample's lengths by the task's own law; data.length_sampling "
          "per_batch would bypass it (set data.length_sampling=per_sample)")
    shortest = min(parse_lengths(cfg.eval.lengths))
    check(shortest >= task.min_length, f"eval.lengths includes {shortest}; {t.name} needs lengths >= {task.min_length}")
    shortest = min(parse_lengths(te.lengths)) if te.lengths else task.min_length
    check(shortest >= task.min_length,
          f"tests.lengths includes {shortest}; {t.name} needs lengths >= {task.min_length}")
    return task


def _check_stops(te: TrainTestsConfig, method: Method) -> None:
    """tests.stops: rules the method can apply (a method without stop rules ignores them: a
    grid's ntp arm on a looped preset)."""
    for stop in te.stops:
        try:
            stop_rule = parse_rule(str(stop))
            if method.has_stop_rules:
                stop_rule.check(method)
        except ValueError as err:
            raise ConfigError(f"tests.stops: {err}") from None


def _checked_scheme(m: ModelConfig) -> type:
    """The positional scheme's class, its settings and option values checked (it checks its own)."""
    scheme = SCHEMES[m.position]
    rule(lambda: scheme.check(m))
    check(m.causal or scheme.bidirectional,
          f"model.causal = false (bidirectional attention) needs a scheme that can attend both ways; model.position "
          f"{m.position} is defined on past keys only (use "
          f"{', '.join(name for name, s in SCHEMES.items() if s.bidirectional)})")
    check_options("model.position_options", m.position_options, scheme, m.position, skip=("cfg",))
    if m.position_options:  # a scheme checks its own option values when built
        built("model.position_options", lambda: scheme(m, **m.position_options))
    return scheme


def _check_position_sweep(cfg: Config) -> None:
    """eval.sweep's position.scaling (none, pi, ntk, yarn; all but none need a rotary scheme) and
    position.factor (dynamic, or a number >= 1; only beside position.scaling)."""
    sweep, position = cfg.eval.sweep, cfg.model.position
    for key in (k for k in sweep if k.startswith("position.") and k not in POSITION_SWEEP):
        raise ConfigError(f"eval.sweep.{key} is unknown; the position keys are {', '.join(POSITION_SWEEP)}")
    for scaling in sweep.get("position.scaling", []):
        check(scaling in SCALINGS,
              f"eval.sweep.position.scaling {scaling!r} is unknown; choose from {', '.join(SCALINGS)}")
        check(scaling == AS_TRAINED or issubclass(SCHEMES[position], RoPE),
              f"eval.sweep.position.scaling {scaling} stretches rotary positions; model.position {position} has none "
              f"(rotary schemes: {', '.join(n for n, s in SCHEMES.items() if issubclass(s, RoPE))})")
    check("position.factor" not in sweep or "position.scaling" in sweep,
          "eval.sweep.position.factor needs eval.sweep.position.scaling (which stretch to apply)")
    for factor in sweep.get("position.factor", []):
        number = isinstance(factor, (int, float)) and not isinstance(factor, bool)
        check(factor == "dynamic" or (number and 1 <= factor < float("inf")),
              f"eval.sweep.position.factor must be dynamic or a number >= 1, got {factor!r}")


def _check_token_reading(cfg: Config, method: Method, scheme: type) -> None:
    """eval.token_contexts: read by a method that takes position IDs and has no stop rules, within
    a position table."""
    contexts, m = cfg.eval.token_contexts, cfg.model
    if contexts:
        check(method.accepts_position_ids and not method.has_stop_rules,
              f"eval.token_contexts needs a next-token method that reads position IDs, not {cfg.method}")
        check(not scheme.has_table or max(contexts) <= m.max_positions,
              f"eval.token_contexts reaches {max(contexts)} tokens, past model.max_positions ({m.max_positions})")


def _checked_transform(cfg: Config, task: Task, method: Method, scheme: type) -> PositionTransform:
    """The position transform, built once, after the task's and the method's own rules about it."""
    d, draws = cfg.data, cfg.eval.position_draws
    name = d.position_transform
    transform = TRANSFORMS[name]
    rule(lambda: task.check(cfg, transform))  # each variant's own rules
    rule(lambda: method.check(cfg, task, transform, scheme))
    check_options("data.position_transform_options", d.position_transform_options, transform, name)
    built_transform = built("data.position_transform_options",
                            lambda: build_transform(name, d.position_transform_options))
    check(draws == 1 or transform.random_at_evaluation,
          f"eval.position_draws = {draws} needs a position transform that draws IDs at evaluation "
          f"(randomized); data.position_transform {name!r} evaluates on the task's own IDs")
    return built_transform


def _with_task_levels(cfg: Config, task: Task) -> None:
    """A task that lays out several levels of position IDs (lengthgen.tasks.coupled_levels) sets
    `levels` of the scheme and the transform that take it, unless the config does: one knob,
    task.options.coupled. Written into the run's config.toml, so a saved run reads it back."""
    levels, m, d = task.id_levels, cfg.model, cfg.data
    if levels == 1:
        return
    if "levels" in inspect.signature(SCHEMES[m.position].__init__).parameters and "levels" not in m.position_options:
        m.position_options = {**m.position_options, "levels": levels}
    takes = "levels" in inspect.signature(TRANSFORMS[d.position_transform].__init__).parameters
    if takes and "levels" not in d.position_transform_options:
        d.position_transform_options = {**d.position_transform_options, "levels": levels}


def _check_id_levels(cfg: Config, task: Task, scheme: type, transform: PositionTransform) -> None:
    """Packed multi-level IDs (lengthgen.tasks.coupled_levels) are read by a scheme that unpacks as many
    levels as the task lays out, and moved by a transform that shifts each level on its own; a scheme or
    transform set to unpack levels reads a task that has them."""
    levels, m, d = task.id_levels, cfg.model, cfg.data
    unpacks = "levels" in inspect.signature(scheme.__init__).parameters
    check(m.position_options.get("levels", 1) == levels and (levels == 1 or unpacks),
          f"task {cfg.task.name} lays out {levels} level(s) of position IDs; model.position {m.position} must read "
          f"as many: " + (f"set model.position_options.levels = {levels}" if unpacks else
                          "use a scheme with a levels option (learned)"))
    shifts = getattr(transform, "levels", 1)
    check(shifts == levels or (levels > 1 and not transform.changes_ids),
          f"task {cfg.task.name} lays out {levels} level(s) of position IDs; data.position_transform "
          f"{d.position_transform} must move as many: " + (
              f"set data.position_transform_options.levels = {levels}" if hasattr(transform, "levels")
              else "use random_offset with levels, or none"))
    if levels > 1 and transform.changes_ids:  # each level's range holds that level's IDs (one bound checks the largest)
        import torch

        batch = task.sample(256, cfg.task.train_max, torch.Generator().manual_seed(0))
        built("data.position_transform_options", lambda: transform(batch, torch.Generator().manual_seed(0)))
