"""Typed configuration: dataclasses, TOML presets and `--set section.key=value`.

Every field is typed and commented. Loading checks every key and value and
raises ConfigError with a one-line message naming the key; the CLI turns that
into exit code 2 before anything is written.
"""
from __future__ import annotations

import difflib
import inspect
import math
import re
import sys
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from .errors import ConfigError

INITS = ("gpt2", "torch")  # model.init choices, see ModelConfig


@dataclass
class TaskConfig:
    name: str = "parity"  # registry name, see `lengthgen tasks`
    train_min: int = 1  # shortest problem length trained on
    train_max: int = 12  # longest problem length trained on (the real maximum)
    options: dict = field(default_factory=dict)  # task-specific options, e.g. {symbols = 50}


@dataclass
class ModelConfig:
    d_model: int = 64  # embedding width
    n_layer: int = 2  # blocks in the stack (the looped block's depth for looped methods)
    n_head: int = 4  # attention heads; must divide d_model
    mlp_ratio: int = 4  # MLP hidden width = mlp_ratio * d_model
    position: str = "nope"  # positional scheme: nope, learned, sinusoidal, rope, alibi
    rope_theta: float = 10000.0  # RoPE base frequency
    max_positions: int = 2048  # table size of learned / sinusoidal positions
    dropout: float = 0.0  # dropout on attention weights, residual and MLP outputs
    init: str = "gpt2"  # weight init: gpt2 (normal 0.02, scaled residual projections) or torch (torch's module defaults)
    tie_embeddings: bool = True  # lm_head shares the token embedding matrix


@dataclass
class TrainConfig:
    steps: int = 2000  # optimizer steps
    batch_size: int = 64  # samples per step
    lr: float = 3e-4  # peak learning rate
    weight_decay: float = 0.01  # AdamW weight decay
    betas: list = field(default_factory=lambda: [0.9, 0.999])  # AdamW betas
    grad_clip: float = 1.0  # max gradient norm; 0 = off
    # cosine (warm-up, then cosine), curriculum_cosine (warm-up, constant until the curriculum ends, then cosine), constant
    schedule: str = "cosine"
    warmup_steps: int = 0  # linear warm-up steps (cosine and curriculum_cosine; must be 0 with constant)
    min_lr_ratio: float = 0.0  # cosine decays to lr * min_lr_ratio
    curriculum_start: int = 0  # first maximum length; 0 = no curriculum (train_max from the start)
    curriculum_interval: int = 500  # steps between +1 increments of the maximum length
    length_sampling: str = "per_sample"  # per_sample (lengths mixed in a batch) or per_batch (one length per batch)
    ema: float = 0.0  # decay of an EMA of the weights used for evaluation; 0 = off
    model_seed: int = 0  # seeds weight initialisation
    data_seed: int = 0  # seeds the training data stream
    device: str = "auto"  # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps
    threads: int = 0  # torch CPU threads, 0..1024; 0 = torch's default
    precision: str = "fp32"  # fp32, or bf16 (autocast mixed precision on CPU and GPU; weights stay fp32)
    log_interval: int = 50  # steps between metric lines in metrics.jsonl
    checkpoint_interval: int = 500  # steps between checkpoints (one is always written at the end)


@dataclass
class EvalConfig:
    lengths: str = "1:24"  # problem lengths: "a:b" (inclusive), "a:b:step", "1,5,10" or one number
    samples: int = 512  # test samples per length
    batch_size: int = 256  # samples per forward pass
    seed: int = 1234  # evaluation data seed, fixed and separate from training


@dataclass
class Config:
    method: str = "ntp"  # training and prediction recipe, see lengthgen.methods
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)


SCHEDULES = ("cosine", "curriculum_cosine", "constant")
LENGTH_SAMPLING = ("per_sample", "per_batch")
PRECISIONS = ("fp32", "bf16")
DEVICE_PATTERN = re.compile(r"auto|cpu(:0)?|cuda(:[0-9]+)?|mps(:0)?")  # what pick_device can serve
TABLE_POSITIONS = ("learned", "sinusoidal")  # schemes with a table of model.max_positions rows
MAX_THREADS = 1024  # far above any machine's cores; a huge value crashes torch
MAX_SEED = 2**63  # seeds are 0 <= seed < MAX_SEED (torch takes 64-bit seeds)
# eval seeds one generator per length with seed * 1_000_003 + length, which must stay below 2**64
MAX_EVAL_SEED = 2**40
MAX_LENGTH = 100_000  # longest problem length, trained or tested
MAX_LENGTHS = 10_000  # most test lengths in one eval.lengths


def _hint(key: str, options) -> str:
    close = difflib.get_close_matches(key, list(options), n=1, cutoff=0.5)
    return f" (did you mean {close[0]}?)" if close else ""


def _coerce(path: str, value, typ):
    """Check `value` against the annotated type; ints are accepted for floats."""
    expected = {"int": int, "float": float, "str": str, "bool": bool, "dict": dict, "list": list}[typ]
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) and expected is not bool:
        raise ConfigError(f"{path} must be {typ}, got bool {value!r}")
    if not isinstance(value, expected):
        raise ConfigError(f"{path} must be {typ}, got {type(value).__name__} {value!r}")
    return value


def _apply(cfg, data: dict, prefix: str = "") -> None:
    known = {f.name: f for f in fields(cfg)}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in known:
            full = [f"{prefix}{k}" for k in known]
            raise ConfigError(f"unknown config key {path}{_hint(path, full)}")
        if path == "eval.lengths" and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)  # `--set eval.lengths=24` is a TOML integer: one test length
        current = getattr(cfg, key)
        if is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{path} is a section; set its keys, e.g. {path}.{next(iter(fields(current))).name}=...")
            _apply(current, value, prefix=f"{path}.")
        else:
            setattr(cfg, key, _coerce(path, value, known[key].type))


def parse_override(text: str) -> dict:
    """'model.n_layer=3' -> {'model': {'n_layer': 3}}. Values are TOML literals;
    anything that is not one (e.g. rope) is taken as a string."""
    if "=" not in text:
        raise ConfigError(f"--set expects section.key=value, got {text!r}")
    key, raw = text.split("=", 1)
    key, raw = key.strip(), raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    out: dict = {}
    node = out
    parts = key.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return out


def parse_lengths(spec: str) -> list[int]:
    """'1:40' -> 1..40 inclusive, '10:50:10' -> 10,20,..,50, '1,5,9' -> [1, 5, 9], '24' -> [24]."""
    try:
        if ":" in spec:
            parts = [int(p) for p in spec.split(":")]
            if len(parts) not in (2, 3):
                raise ValueError
            start, stop, step = parts[0], parts[1], (parts[2] if len(parts) == 3 else 1)
            if step < 1:
                raise ValueError
            lengths = range(start, stop + 1, step)  # a range knows its size: '1:2000000000' is not built
        else:
            lengths = [int(p) for p in spec.split(",") if p.strip()]
    except ValueError:
        raise ConfigError(f"lengths {spec!r} is not 'a:b', 'a:b:step' or a comma list of integers") from None
    if not lengths:
        raise ConfigError(f"lengths {spec!r} selects no length")
    if len(lengths) > MAX_LENGTHS:
        raise ConfigError(f"lengths {spec!r} selects {len(lengths)} lengths; at most {MAX_LENGTHS} are allowed")
    if min(lengths) < 1:
        raise ConfigError(f"lengths {spec!r} includes {min(lengths)}; every test length must be >= 1")
    if max(lengths) > MAX_LENGTH:
        raise ConfigError(f"lengths {spec!r} includes {max(lengths)}; test lengths are capped at {MAX_LENGTH}")
    return list(lengths)


def longest_sequence(cfg: Config) -> int:
    """Tokens in the widest training sequence, measured on a fixed sample at task.train_max
    (widths differ between samples of multiplication, binary_sum and unique_set)."""
    import torch

    from .methods import pause_batch
    from .tasks import get_task

    samples = max(1, min(256, 1_000_000 // cfg.task.train_max))  # bounded memory at huge lengths
    batch = get_task(cfg.task.name, **cfg.task.options).sample(
        samples, cfg.task.train_max, torch.Generator().manual_seed(0))
    if cfg.method == "ntp-pause":  # T(n) pause tokens lengthen every sequence
        batch = pause_batch(batch)
    return batch.inputs.shape[1]


def validate(cfg: Config) -> Config:
    """Reject impossible values; each message names the key."""
    from .methods import METHODS
    from .positions import SCHEMES
    from .tasks import TASKS

    def check(ok: bool, message: str) -> None:
        if not ok:
            raise ConfigError(message)

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
    check(m.position != "rope" or (m.d_model // m.n_head) % 2 == 0, "model.position rope needs an even head width (d_model / n_head)")
    check(0.0 <= m.dropout < 1.0, f"model.dropout must be in [0, 1), got {m.dropout}")
    check(m.init in INITS, f"model.init {m.init!r} is unknown{_hint(m.init, INITS)}; choose from {', '.join(INITS)}")
    check(m.rope_theta > 0, f"model.rope_theta must be > 0, got {m.rope_theta}")
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
    check(tr.schedule != "constant" or tr.warmup_steps == 0,
          f"train.warmup_steps ({tr.warmup_steps}) has no effect with train.schedule constant; "
          "use cosine or curriculum_cosine, or set train.warmup_steps=0")
    check(0 <= tr.min_lr_ratio <= 1, f"train.min_lr_ratio must be in [0, 1], got {tr.min_lr_ratio}")
    check(tr.curriculum_start == 0 or t.train_min <= tr.curriculum_start <= t.train_max,
          f"train.curriculum_start ({tr.curriculum_start}) must be 0 (off) or between task.train_min and task.train_max")
    check(tr.length_sampling in LENGTH_SAMPLING, f"train.length_sampling {tr.length_sampling!r} is unknown; choose from {', '.join(LENGTH_SAMPLING)}")
    check(0 <= tr.ema < 1, f"train.ema must be in [0, 1), got {tr.ema}")
    check(tr.precision in PRECISIONS, f"train.precision {tr.precision!r} is unknown; choose from {', '.join(PRECISIONS)}")
    check(0 <= tr.threads <= MAX_THREADS, f"train.threads must be in 0..{MAX_THREADS}, got {tr.threads}")
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
    check(ev.batch_size >= 1, f"eval.batch_size must be >= 1, got {ev.batch_size}")
    from .tasks import get_task
    accepted = [p for p in inspect.signature(TASKS[t.name].__init__).parameters if p != "self"]
    for key in t.options:
        check(key in accepted, f"task.options.{key} is not an option of {t.name}{_hint(key, accepted)}; "
                               f"its options: {', '.join(accepted) or 'none'}")
    try:
        get_task(t.name, **t.options)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"task.options: {err}") from None
    if m.position in TABLE_POSITIONS:  # a sequence past the table fails at the first step, after the run folder is made
        longest = longest_sequence(cfg)
        check(longest <= m.max_positions,
              f"model.max_positions ({m.max_positions}) is shorter than the longest training sequence "
              f"({longest} tokens at task.train_max {t.train_max}); set it to at least {longest}")
    return cfg


def load(preset: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Defaults <- preset TOML <- --set overrides, then validated."""
    cfg = Config()
    if preset is not None:
        path = Path(preset)
        if path.is_dir():
            raise ConfigError(f"config file {path} is a directory, not a TOML file")
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist")
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise ConfigError(f"config file {path} is not UTF-8 text (TOML files must be UTF-8)") from None
        except OSError as err:
            raise ConfigError(f"config file {path} cannot be read: {err.strerror}") from None
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{path} is not valid TOML: {err}") from None
        _apply(cfg, data)
    for text in overrides:
        _apply(cfg, parse_override(text))
    return validate(cfg)


def from_dict(data: dict) -> Config:
    cfg = Config()
    _apply(cfg, data)
    return validate(cfg)


def to_dict(cfg: Config) -> dict:
    return asdict(cfg)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def to_toml(cfg: Config) -> str:
    """The resolved config as TOML, loadable again as a preset."""
    data = to_dict(cfg)
    lines = [f"method = {_toml_value(data.pop('method'))}"]
    for section, values in data.items():
        lines.append(f"\n[{section}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"
