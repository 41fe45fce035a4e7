"""Getting a run ready: a config read (a preset with its --set overrides, or a saved run's),
checked once, and its parts built once: the task, the method, the positional scheme and the
position transform. Training, evaluation, a reproduction, the memory check and the benchmarks
receive the assembled `Run` and build none of them again.

lengthgen.config checks each section's own values (plain data); the checks here need the
registries (a name, an options table, whether the parts suit each other), so this stage sits above
lengthgen.methods and lengthgen.model. Every message is one line naming the key; the CLI turns it
into exit code 2 before anything is written.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path

from lengthgen.config.checks import built, check, check_choice, check_options, rule, validate
from lengthgen.config.schema import Config, ModelConfig, TrainTestsConfig, from_data, option_combinations, parse_lengths, read
from lengthgen.errors import ConfigError, PluginError
from lengthgen.methods.looped.stop_rules import parse_rule
from lengthgen.methods.registry import METHODS, Method, get_method
from lengthgen.model.position_transforms import TRANSFORMS, PositionTransform, base_ids, build_transform, real_columns
from lengthgen.model.positions import SCHEMES
from lengthgen.model.rope_scaling import AS_TRAINED, SCALINGS
from lengthgen.model.rotary import RoPE
from lengthgen.model.transformer import INITS, MLPS, NORMS, RESIDUALS  # the registries the block is built from
from lengthgen.plugins import load as import_plugins
from lengthgen.tasks import TASKS, Task, TrailingPad, get_task, task_of
from lengthgen.tasks.coupled_levels import largest_level_id

POSITION_SWEEP = ("position.scaling", "position.factor")  # eval.sweep keys of RoPE stretched at test time


@dataclass
class Run:
    """A config with its parts built: what every command that trains, evaluates or sizes a run reads."""
    cfg: Config
    task: Task
    method: Method
    scheme: type  # the positional scheme's class (the model builds its instance)
    transform: PositionTransform
    widest: int = 0  # tokens in the widest training sequence at task.train_max (training_positions), measured once


def assemble(preset: str | Path | None = None, overrides: list[str] = ()) -> Run:
    """A new run: defaults <- preset TOML <- --set overrides, checked, with the defaults that follow
    from its parts (derived_defaults)."""
    return derived_defaults(checked(read(preset, overrides)))


def assemble_saved(source: str | Path | dict, holder: Path | None = None) -> Run:
    """A saved run (its config.toml, or a dict such as a checkpoint's config), checked, as the run
    was trained: no default is added. `holder`: the file the dict was read from (a checkpoint's
    state.json), named in the message of a bad config."""
    try:
        cfg = from_data(source) if isinstance(source, dict) else read(source)
        import_plugins(cfg.plugins, f" (recorded in {holder or source})" if holder or not isinstance(source, dict) else "")
        return checked(cfg)
    except PluginError:
        raise
    except ConfigError as err:
        if holder is None:
            raise
        raise ConfigError(f"checkpoint {holder} holds a bad config: {err}") from None


def assembled(cfg: Config) -> Run:
    """The parts of a config checked before (a reproduction's job carries the config its plan
    checked), built without checking it again."""
    import_plugins(cfg.plugins)  # a worker process (spawned, or on Ray) imports the run's plugins before building its parts
    d = cfg.data
    run = Run(cfg, task_of(cfg.task), get_method(cfg.method, cfg), SCHEMES[cfg.model.position],
              build_transform(d.position_transform, d.position_transform_options))
    run.widest = training_positions(run)[0]
    return run


def checked(cfg: Config) -> Run:
    """`cfg` checked section by section, then against the registries (its plugins loaded first), each
    part built once."""
    import_plugins(cfg.plugins)  # (and every installed one), once per process: registered before any name is read
    validate(cfg)
    check_names(cfg)
    task = checked_task(cfg)
    check_options("method_options", cfg.method_options, METHODS[cfg.method], cfg.method, skip=("cfg",))
    method = built("method_options", lambda: get_method(cfg.method, cfg))
    check_stops(cfg.tests, method)
    check(cfg.model.causal or method.bidirectional,
          f"model.causal = false (bidirectional attention) needs a method that reads whole answers from blank slots "
          f"without decoding (one with the bidirectional capability: {', '.join(bidirectional_methods())}); "
          f"method {cfg.method} would see the tokens it predicts")
    with_task_levels(cfg, task)
    scheme = checked_scheme(cfg.model)
    check_sweep(cfg, task)
    check_token_reading(cfg, method, scheme)
    transform = checked_transform(cfg, task, method, scheme)
    check_id_levels(cfg, task, scheme, transform)
    run = Run(cfg, task, method, scheme, transform)
    run.widest, largest = training_positions(run)
    check_position_range(run, largest)
    return run


def bidirectional_methods() -> list[str]:
    return [name for name, cls in METHODS.items() if cls.bidirectional]


def check_names(cfg: Config) -> None:
    """Each name a registry must know."""
    m = cfg.model
    check_choice("method", cfg.method, METHODS)
    check_choice("task.name", cfg.task.name, TASKS)
    check_choice("model.position", m.position, SCHEMES)
    for key, choices in (("init", INITS), ("norm", NORMS), ("mlp", MLPS), ("residual", RESIDUALS)):
        check_choice(f"model.{key}", getattr(m, key), choices)
    check_choice("data.position_transform", cfg.data.position_transform, TRANSFORMS)


def checked_task(cfg: Config) -> Task:
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
    check(t.train_min >= task.min_length, f"task.train_min must be >= {task.min_length} for {t.name}, got {t.train_min}")
    check(not (task.draws_own_lengths and cfg.data.length_sampling == "per_batch"),
          f"task.options of {t.name} draw each sample's lengths by the task's own law; data.length_sampling "
          "per_batch would bypass it (set data.length_sampling=per_sample)")
    shortest = min(parse_lengths(cfg.eval.lengths))
    check(shortest >= task.min_length, f"eval.lengths includes {shortest}; {t.name} needs lengths >= {task.min_length}")
    shortest = min(parse_lengths(te.lengths)) if te.lengths else task.min_length
    check(shortest >= task.min_length, f"tests.lengths includes {shortest}; {t.name} needs lengths >= {task.min_length}")
    return task


def check_stops(te: TrainTestsConfig, method: Method) -> None:
    """tests.stops: rules the method can apply (a method without stop rules ignores them: a
    grid's ntp arm on a looped preset)."""
    for stop in te.stops:
        try:
            stop_rule = parse_rule(str(stop))
            if method.has_stop_rules:
                stop_rule.check(method)
        except ValueError as err:
            raise ConfigError(f"tests.stops: {err}") from None


def checked_scheme(m: ModelConfig) -> type:
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


def check_sweep(cfg: Config, task: Task) -> None:
    """eval.sweep: task options, each with a non-empty list of values the task accepts without
    changing its vocabulary; and the position.* keys of RoPE stretched at test time (check_position_sweep)."""
    t = cfg.task
    sweep = {k: v for k, v in cfg.eval.sweep.items() if not k.startswith("position.")}
    check_options("eval.sweep", sweep, TASKS[t.name], t.name)
    for key, values in cfg.eval.sweep.items():
        check(isinstance(values, list) and values and len(set(map(repr, values))) == len(values),
              f"eval.sweep.{key} must be a non-empty list of distinct values, got {values!r}")
    check_position_sweep(cfg)
    shortest = min(parse_lengths(cfg.eval.lengths))
    for combo in option_combinations(sweep) if sweep else ():  # no sweep: the run's own task, checked
        options = {**t.options, **combo}
        where = f"eval.sweep ({', '.join(f'{k}={v!r}' for k, v in combo.items())})"
        swept = built(where, lambda: get_task(t.name, **options))
        check(swept.vocab == task.vocab, f"{where} changes the task's vocabulary, which the trained model cannot read")
        check(shortest >= swept.min_length,
              f"eval.lengths includes {shortest}; {t.name} with {where[12:-1]} needs lengths >= {swept.min_length}")


def check_position_sweep(cfg: Config) -> None:
    """eval.sweep's position.scaling (none, pi, ntk, yarn; all but none need a rotary scheme) and
    position.factor (dynamic, or a number >= 1; only beside position.scaling)."""
    sweep, position = cfg.eval.sweep, cfg.model.position
    for key in (k for k in sweep if k.startswith("position.") and k not in POSITION_SWEEP):
        raise ConfigError(f"eval.sweep.{key} is unknown; the position keys are {', '.join(POSITION_SWEEP)}")
    for scaling in sweep.get("position.scaling", []):
        check(scaling in SCALINGS, f"eval.sweep.position.scaling {scaling!r} is unknown; choose from {', '.join(SCALINGS)}")
        check(scaling == AS_TRAINED or issubclass(SCHEMES[position], RoPE),
              f"eval.sweep.position.scaling {scaling} stretches rotary positions; model.position {position} has none "
              f"(rotary schemes: {', '.join(n for n, s in SCHEMES.items() if issubclass(s, RoPE))})")
    check("position.factor" not in sweep or "position.scaling" in sweep,
          "eval.sweep.position.factor needs eval.sweep.position.scaling (which stretch to apply)")
    for factor in sweep.get("position.factor", []):
        number = isinstance(factor, (int, float)) and not isinstance(factor, bool)
        check(factor == "dynamic" or (number and 1 <= factor < float("inf")),
              f"eval.sweep.position.factor must be dynamic or a number >= 1, got {factor!r}")


def check_token_reading(cfg: Config, method: Method, scheme: type) -> None:
    """eval.token_contexts: read by a method that takes position IDs and has no stop rules, within
    a position table."""
    contexts, m = cfg.eval.token_contexts, cfg.model
    if contexts:
        check(method.accepts_position_ids and not method.has_stop_rules,
              f"eval.token_contexts needs a next-token method that reads position IDs, not {cfg.method}")
        check(not scheme.has_table or max(contexts) <= m.max_positions,
              f"eval.token_contexts reaches {max(contexts)} tokens, past model.max_positions ({m.max_positions})")


def checked_transform(cfg: Config, task: Task, method: Method, scheme: type) -> PositionTransform:
    """The position transform, built once, after the task's and the method's own rules about it."""
    d, draws = cfg.data, cfg.eval.position_draws
    name = d.position_transform
    transform = TRANSFORMS[name]
    rule(lambda: task.check(cfg, transform))  # each variant's own rules
    rule(lambda: method.check(cfg, task, transform, scheme))
    check_options("data.position_transform_options", d.position_transform_options, transform, name)
    built_transform = built("data.position_transform_options", lambda: build_transform(name, d.position_transform_options))
    check(draws == 1 or transform.random_at_evaluation,
          f"eval.position_draws = {draws} needs a position transform that draws IDs at evaluation "
          f"(randomized); data.position_transform {name!r} evaluates on the task's own IDs")
    return built_transform


def with_task_levels(cfg: Config, task: Task) -> None:
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


def check_id_levels(cfg: Config, task: Task, scheme: type, transform: PositionTransform) -> None:
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


def check_position_range(run: Run, largest_base: int) -> None:
    """A table (or ppc's ID head) of max_positions rows holds every ID training makes (the largest
    before the transform: `largest_base`): an overrun would fail at step 1, after the run folder is made."""
    m, name = run.cfg.model, run.cfg.data.position_transform
    sized = run.scheme.has_table or run.method.needs_target_ids
    if not (sized or run.transform.changes_ids):
        return
    largest = largest_position_id(run, largest_base)
    if not run.transform.changes_ids:
        check(largest < m.max_positions,
              f"model.max_positions ({m.max_positions}) is shorter than the longest training sequence "
              f"({largest + 1} tokens at task.train_max {run.cfg.task.train_max}); set it to at least {largest + 1}")
    elif sized:
        check(largest < m.max_positions,
              f"model.max_positions ({m.max_positions}) is too small for data.position_transform {name}, which "
              f"trains position IDs up to {largest}; set it to at least {largest + 1}")


def training_positions(run: Run) -> tuple[int, int]:
    """(tokens in the widest training sequence, its largest position ID before any transform),
    measured on a fixed sample at task.train_max, as the method lays it out (the pause
    tokens of ntp-pause); widths differ between samples of some tasks."""
    import torch

    cfg = run.cfg
    samples = max(1, min(256, 1_000_000 // cfg.task.train_max))  # bounded memory at huge lengths
    batch = run.task.sample(samples, cfg.task.train_max, torch.Generator().manual_seed(0))
    batch = built(f"method {cfg.method}", lambda: run.method.model_batch(batch))
    largest = largest_level_id(base_ids(batch).masked_fill(~real_columns(batch), 0), run.task.id_levels)
    if batch.target_ids is not None:  # the last answer token's ID is a target (ppc), never an input
        largest = max(largest, int(batch.target_ids.max()))
    return batch.inputs.shape[1], largest


def largest_position_id(run: Run, base: int) -> int:
    """The largest position ID training can produce: the task's (or 0..L-1's) at task.train_max,
    `base`, as the position transform maps it. ConfigError if it does not fit the transform's range."""
    return built("data.position_transform_options", lambda: run.transform.largest_id(base))


# A learned table that reads coupled or predicted IDs starts at T5's N(0, 1), as Cho et al.'s does,
# unless model.position_options.std is set: at GPT-2's N(0, 0.02) its rows are 50x smaller than the
# token embeddings they are added to, and coupled addition does not train at CPU scale
# (docs/positions.md, "Which init each learned table uses").
GIVEN_IDS_TABLE_STD = 1.0


def reads_given_ids(run: Run) -> bool:
    """Whether the model reads position IDs that are not 0..L-1: the task's own (coupled, abacus)
    or the ones the method predicts (ppc)."""
    import torch

    if run.method.needs_target_ids:
        return True
    batch = run.task.sample(2, run.cfg.task.train_min, torch.Generator().manual_seed(0))
    return batch.position_ids is not None


def given_ids_table_init(run: Run) -> Run:
    """A new run with GIVEN_IDS_TABLE_STD where its learned table reads coupled or predicted IDs
    and no std is set. Applied to presets, never to a saved run's config (assemble_saved): a run
    keeps the init it was trained with."""
    m = run.cfg.model
    if run.scheme.trains_table and "std" not in m.position_options and reads_given_ids(run):
        m.position_options = {**m.position_options, "std": GIVEN_IDS_TABLE_STD}
    return run


def training_window_option(run: Run) -> Run:
    """A new run whose scheme sizes itself by the positions trained (`window_option`, FoPE's `window`)
    with that option set to the largest position ID training reaches + 1, unless the config sets it.
    Saved in the run's config, so evaluation reads the window training used."""
    m, option = run.cfg.model, getattr(run.scheme, "window_option", None)
    if option and option not in m.position_options:
        window = largest_position_id(run, training_positions(run)[1]) + 1
        m.position_options = {**m.position_options, option: window}
    return run


def derived_defaults(run: Run) -> Run:
    """The defaults a new run takes from its parts: a learned table's init (given_ids_table_init) and
    a scheme's training window (training_window_option). Never applied to a saved run."""
    return training_window_option(given_ids_table_init(run))


def load(preset: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """The config of `assemble(preset, overrides)`, for callers that read only the config."""
    return assemble(preset, overrides).cfg


def load_saved(path: str | Path) -> Config:
    """The config of `assemble_saved(path)`."""
    return assemble_saved(path).cfg


def from_dict(data: dict) -> Config:
    """The config of `assemble_saved(data)` (a checkpoint's state)."""
    return assemble_saved(data).cfg
