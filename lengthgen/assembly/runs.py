"""A run ready to train, evaluate or size: `Run`, a config with its parts built, and the two ways to
get one, each checking the config once (lengthgen.assembly.checks) and building each part once:

    new_run(preset, overrides)   a new run: defaults <- a preset (a bundled name, a TOML path or a
                                 Config) <- --set overrides, with the defaults that follow from its parts
    saved_run(source)            a saved run (its folder, its config.toml, or a checkpoint's config),
                                 as it was trained: no default added

`new_run_config` and `saved_run_config` are their configs, for callers that read only the config;
`Run.from_checked` builds the parts of a config one of them checked before (a reproduction's job
carries one to its worker) without checking it again. Training, evaluation, a reproduction, the
memory check and the benchmarks receive the assembled `Run` and build none of its parts again.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from lengthgen.assembly.checks import checked_parts
from lengthgen.config.checks import built, check
from lengthgen.config.schema import Config, from_data, read, to_dict, with_overrides
from lengthgen.errors import ConfigError, PluginError
from lengthgen.methods.base import Method
from lengthgen.methods.registry import get_method
from lengthgen.model.position_transforms import PositionTransform, base_ids, build_transform, real_columns
from lengthgen.model.positions import SCHEMES
from lengthgen.plugins import load as import_plugins
from lengthgen.tasks import Task, task_of
from lengthgen.tasks.coupled_levels import largest_level_id


@dataclass
class Run:
    """A config with its parts built: what every command that trains, evaluates or sizes a run reads."""
    cfg: Config
    task: Task
    method: Method
    scheme: type  # the positional scheme's class (the model builds its instance)
    transform: PositionTransform
    widest: int = 0  # tokens in the widest training sequence at task.train_max (training_positions), measured once

    @classmethod
    def from_checked(cls, cfg: Config) -> Run:
        """The parts of a config that new_run or saved_run checked before (a reproduction's job carries
        the config its plan checked; a test edits one), built without checking it again."""
        import_plugins(cfg.plugins)  # a worker process (spawned, or on Ray) imports the run's plugins first
        d = cfg.data
        run = cls(cfg, task_of(cfg.task), get_method(cfg.method, cfg), SCHEMES[cfg.model.position],
                  build_transform(d.position_transform, d.position_transform_options))
        run.widest = training_positions(run)[0]
        return run


def new_run(preset: str | Path | Config | None = None, overrides: Sequence[str] = (),
            plugins: Sequence[str] = ()) -> Run:
    """A new run: defaults <- `preset` (a bundled preset's name, a TOML path, or a Config, left as it
    is) <- `overrides` (KEY=VALUE strings), checked, with the defaults that follow from its parts
    (_derived_defaults). `plugins`: imported first and recorded after the preset's own."""
    sets = list(overrides)
    cfg = with_overrides(from_data(to_dict(preset)), sets) if isinstance(preset, Config) else read(preset, sets)
    cfg.plugins = list(dict.fromkeys(cfg.plugins + import_plugins(list(plugins))))  # each recorded once
    return _derived_defaults(_checked(cfg))


def saved_run(source: str | Path | dict, holder: Path | None = None) -> Run:
    """A saved run (its folder or its config.toml, or a dict such as a checkpoint's config),
    checked, as the run was trained: no default is added. `holder`: the file the dict was read from
    (a checkpoint's state.json), named in the message of a bad config."""
    if not isinstance(source, dict) and Path(source).is_dir():
        source = Path(source) / "config.toml"
    try:
        cfg = from_data(source) if isinstance(source, dict) else read(source)
        where = f" (recorded in {holder or source})" if holder or not isinstance(source, dict) else ""
        import_plugins(cfg.plugins, where)
        return _checked(cfg)
    except PluginError:
        raise
    except ConfigError as err:
        if holder is None:
            raise
        raise ConfigError(f"checkpoint {holder} holds a bad config: {err}") from None


def new_run_config(preset: str | Path | Config | None = None, overrides: Sequence[str] = ()) -> Config:
    """The config of `new_run(preset, overrides)`, checked against every registry, for callers
    that read only the config (it cannot be checked below the registries: lengthgen.config)."""
    return new_run(preset, overrides).cfg


def saved_run_config(source: str | Path | dict) -> Config:
    """The config of `saved_run(source)`, as the run was trained."""
    return saved_run(source).cfg


def _checked(cfg: Config) -> Run:
    """`cfg` checked (lengthgen.assembly.checks), its parts built once, its widest training
    sequence measured once and the position range checked against it."""
    run = Run(cfg, *checked_parts(cfg))
    run.widest, largest = training_positions(run)
    _check_position_range(run, largest)
    return run


def _check_position_range(run: Run, largest_base: int) -> None:
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


def _given_ids_table_init(run: Run) -> Run:
    """A new run with GIVEN_IDS_TABLE_STD where its learned table reads coupled or predicted IDs
    and no std is set. Applied to new runs, never to a saved run's config (saved_run): a run
    keeps the init it was trained with."""
    m = run.cfg.model
    if run.scheme.trains_table and "std" not in m.position_options and reads_given_ids(run):
        m.position_options = {**m.position_options, "std": GIVEN_IDS_TABLE_STD}
    return run


def _training_window_option(run: Run) -> Run:
    """A new run whose scheme sizes itself by the positions trained (`window_option`, FoPE's `window`)
    with that option set to the largest position ID training reaches + 1, unless the config sets it.
    Saved in the run's config, so evaluation reads the window training used."""
    m, option = run.cfg.model, getattr(run.scheme, "window_option", None)
    if option and option not in m.position_options:
        window = largest_position_id(run, training_positions(run)[1]) + 1
        m.position_options = {**m.position_options, option: window}
    return run


def _derived_defaults(run: Run) -> Run:
    """The defaults a new run takes from its parts: a learned table's init (_given_ids_table_init) and
    a scheme's training window (_training_window_option). Never applied to a saved run."""
    return _training_window_option(_given_ids_table_init(run))
