"""Typed configuration as plain data: dataclasses, TOML presets and `--set section.key=value`.

Every field is typed and commented. Reading checks every key and type and raises
ConfigError with a one-line message naming the key; the CLI turns that into exit
code 2 before anything is written. This module sits at the bottom of the import
graph: each section's own checks are lengthgen.config.checks; those that need the task, method,
scheme or transform registries live in lengthgen.assembly.checks, and lengthgen.assembly.runs assembles
(reads, checks and builds) a run.
"""
from __future__ import annotations

import difflib
import itertools
import re
import sys
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from lengthgen.config.upgrade import MOVED, upgrade
from lengthgen.config.presets import preset_path
from lengthgen.errors import ConfigError, path_problem
from lengthgen.plugins import resolved



@dataclass
class TaskConfig:
    name: str = "parity"  # registry name, see `lengthgen tasks`
    train_min: int = 1  # shortest problem length trained on
    train_max: int = 12  # longest problem length trained on (the real maximum)
    options: dict = field(default_factory=dict)  # task-specific options, e.g. {symbols = 50}
    trailing_pad: int = 0  # scored PAD targets after each answer (the released looped code's fixed-width rows)
    pad_to_row: bool = False  # first pad each answer with scored PADs to the batch's widest row (ditto, per sample)


@dataclass
class ModelConfig:
    d_model: int = 64  # embedding width
    n_layer: int = 2  # blocks in the stack (the looped block's depth for looped methods)
    n_head: int = 4  # attention heads; must divide d_model
    mlp_ratio: int = 4  # MLP hidden width = mlp_ratio * d_model (SwiGLU: of the linear and of the gate units)
    position: str = "nope"  # positional scheme: a name of lengthgen.model.positions.SCHEMES (docs/positions.md)
    position_options: dict = field(default_factory=dict)  # the scheme's own settings, e.g. {theta = 500000.0} for rope
    max_positions: int = 2048  # table size of learned / sinusoidal positions
    norm: str = "layernorm"  # layernorm or rmsnorm, in every block and before the read-out
    # gelu (exact erf form), gelu-tanh (GPT-2's gelu_new), relu, swiglu, or gated-gelu (T5's: gelu_new gate units
    # times linear units)
    mlp: str = "gelu"
    bias: bool = True  # biases in the blocks' linear layers (q/k/v, attention output, MLP)
    qkv_bias: bool = True  # with bias: in the q/k/v projections too (false: the TRA notebook's bias-free q, k, v)
    # pre-norm (x + f(norm(x))), norm-before-add (x = norm(x); x + f(x)), post-norm (x = norm(x + f(x)), the original
    # Transformer's and Delétang et al.'s) or pre-and-post-norm (x = norm'(x + f(norm(x))), Cho et al.'s T5 block)
    residual: str = "pre-norm"
    attn_scale: bool = True  # divide q . k by sqrt(head width); false: T5's unscaled logits (its init shrinks q)
    dropout: float = 0.0  # dropout on the embedding, attention output and MLP output (the residual stream)
    attn_dropout: float = 0.0  # attention dropout, on what attn_dropout_on says
    # weights (after the softmax, GPT-2's and the TRA paper's words) or logits (before the mask and the softmax:
    # a dropped logit becomes 0, the TRA authors' notebook)
    attn_dropout_on: str = "weights"
    embed_dropout: float = 0.0  # dropout on the embedding alone, for blocks without model.dropout (the TRA notebook)
    mlp_dropout: float = 0.0  # dropout on the MLP's hidden units (after the activation)
    # weight init: gpt2 (normal 0.02, scaled residual projections), torch (torch's module defaults), looped-tf
    # (the looped-tf release: gpt2 in the blocks, torch's defaults for the read-in and read-out), tra (the TRA
    # notebook: torch's defaults in the blocks, embedding uniform in +-0.01 with the PAD row 0, read-out normal 0.02)
    # or t5 (Mesh TensorFlow's, as Cho et al.'s T5: the token table N(0, 1), each linear N(0, fan_in^-1/2), q also
    # divided by sqrt(head width) for unscaled attention; a learned position table keeps its own `std` option)
    init: str = "gpt2"
    tie_embeddings: bool = True  # lm_head shares the token embedding matrix
    embed_bias: bool = False  # a learned vector added to every token's embedding (a linear read-in of one-hot tokens)
    head_bias: bool = False  # a bias in the read-out (lm_head)
    scaled_head: bool = False  # the final hidden state times d_model^-1/2 before the read-out (T5's tied read-out)
    # causal self-attention (a decoder); false: bidirectional, every column attends to every column of its row
    # (an encoder, as Delétang et al.'s; only methods and schemes that can be bidirectional accept it)
    causal: bool = True


@dataclass
class TrainConfig:
    steps: int = 2000  # optimizer steps
    batch_size: int = 64  # samples per step
    model_seed: int = 0  # seeds weight initialisation
    device: str = "auto"  # auto (cuda, then mps, then cpu), cpu, cuda, cuda:N or mps
    threads: int = 0  # torch CPU threads, 0..1024; 0 = torch's default
    precision: str = "fp32"  # fp32, or bf16 (autocast mixed precision on CPU and GPU; weights stay fp32)
    # torch.compile each block (inductor, dynamic shapes), not for TRA and CoPE, which run eagerly with a
    # note (lengthgen.accel.compiling); the same weights and losses as eager, to float rounding
    compile: bool = False
    capture: bool = True  # on CUDA, each step shape's whole step as one CUDA graph (lengthgen.accel.captured)
    log_interval: int = 50  # steps between metric lines in metrics.jsonl
    checkpoint_interval: int = 500  # steps between checkpoints (one is always written at the end)
    log_to: list = field(default_factory=lambda: ["jsonl"])  # metric sinks: jsonl (always written), tensorboard, wandb


@dataclass
class OptimConfig:
    lr: float = 3e-4  # peak learning rate
    weight_decay: float = 0.01  # AdamW weight decay
    decay_all: bool = False  # weight decay on every parameter (biases, norms); false: on matrices only
    betas: list = field(default_factory=lambda: [0.9, 0.999])  # AdamW betas
    grad_clip: float = 1.0  # max gradient norm; 0 = off
    # cosine (warm-up, then cosine), curriculum_cosine (warm-up, constant until the curriculum ends, then cosine),
    # linear (warm-up, then a straight line down), constant
    schedule: str = "cosine"
    warmup_steps: int = 0  # linear warm-up steps (all but constant, where it must be 0)
    min_lr_ratio: float = 0.0  # cosine and linear decay to lr * min_lr_ratio
    cosine_start: int = 0  # curriculum_cosine: the step the cosine decay starts; 0 = when the curriculum ends
    ema: float = 0.0  # decay of an EMA of the weights used for evaluation; 0 = off
    ema_start: int = 0  # the EMA starts as a copy of the weights after this step, then follows them


@dataclass
class DataConfig:
    seed: int = 0  # seeds the training data stream
    curriculum_start: int = 0  # first maximum length; 0 = no curriculum (task.train_max from the start)
    curriculum_interval: int = 500  # steps between +1 increments of the maximum length
    length_sampling: str = "per_sample"  # per_sample (lengths mixed in a batch) or per_batch (one length per batch)
    # 0: fresh samples every step; N: a fixed set of N samples drawn once from data.seed, each read once per
    # epoch in a fresh order (Cho et al.'s training sets; lengthgen.training.finite_set)
    dataset_size: int = 0
    position_transform: str = "none"  # position IDs in training: none, random_offset, pose, randomized
    position_transform_options: dict = field(default_factory=dict)  # the transform's settings, e.g. {max_position = 64}
    # streams the batch is drawn from: 1 = one stream from data.seed; N = N shards of batch_size/N samples, each
    # seeded by (data.seed, shard, step) and their losses averaged; N processes of a data-parallel run split them
    shards: int = 1


@dataclass
class TrainTestsConfig:
    """Exact match during training, into metrics.jsonl (test@max at the curriculum's current maximum,
    test@N at each of tests.lengths)."""
    interval: int = 0  # every this many steps; 0 = off
    lengths: str = ""  # lengths tested besides the current maximum, as eval.lengths ("" = none)
    samples: int = 512  # test samples per length (the evaluator's fixed test set, eval.seed)
    stops: list = field(default_factory=list)  # looped methods: stop rules tested; [] = oracle
    options: dict = field(default_factory=dict)  # task options of the tested samples, e.g. {min_a_bits = 2}
    offset: int = 0  # tests after steps offset + k * interval (the released code: 1, 1001, ...)


@dataclass
class EvalConfig:
    lengths: str = "1:24"  # problem lengths: "a:b" (inclusive), "a:b:step", "1,5,10" or one number
    samples: int = 512  # test samples per length
    batch_size: int = 256  # samples per forward pass
    seed: int = 1234  # evaluation data seed, fixed and separate from training
    sweep: dict = field(default_factory=dict)  # task options varied in evaluation, e.g. {k = [2, 4]}: rows per value
    confidence_precision: str = "float64"  # looped confidence losses: float64, or float32 as the released code
    # a position transform that draws IDs at evaluation too (randomized): each test sample is read under
    # this many independent draws (from the evaluation seed) and every metric averaged over them
    position_draws: int = 1
    compile: bool = False  # torch.compile each block for evaluation, as train.compile (lengthgen.accel.compiling)
    # per-token evaluation of a language-model task (lengthgen.evaluation.language_model.token_losses -> RUN/token_loss.csv): each
    # scored test token is predicted from exactly c tokens of its own document, for every c here; [] = off
    token_contexts: list = field(default_factory=list)
    token_stride: int = 1  # score every token_stride-th token of each document, from position max(c) on
    token_limit: int = 0  # at most this many scored tokens, evenly spaced over them; 0 = every one
    # dependence sparsity k(t) of the tokens the largest context helps (lengthgen.evaluation.dependence -> RUN/dependence.csv),
    # near = the smallest of token_contexts, full = the largest
    dependence: bool = False
    dependence_options: dict = field(default_factory=dict)  # its settings: tau, top_p, epsilon, rank, max_tokens


@dataclass
class Config:
    method: str = "ntp"  # training and prediction recipe, see lengthgen.methods.registry
    # modules or .py files that register parts (lengthgen.plugins), imported before the config is checked;
    # a file relative to the preset that names it, recorded in a run folder as an absolute path
    plugins: list = field(default_factory=list)
    # the method's own settings, keywords of its constructor (ppc: id_loss_weight; looped-halt: halt_loss_weight)
    method_options: dict = field(default_factory=dict)
    task: TaskConfig = field(default_factory=TaskConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)  # the run: steps, batch, seed of the weights, device, logs
    optim: OptimConfig = field(default_factory=OptimConfig)  # AdamW, its learning-rate schedule, the weights' EMA
    data: DataConfig = field(default_factory=DataConfig)  # the training stream: its seed, curriculum, lengths, IDs
    tests: TrainTestsConfig = field(default_factory=TrainTestsConfig)  # exact match during training
    eval: EvalConfig = field(default_factory=EvalConfig)


LENGTH_SAMPLING = ("per_sample", "per_batch")
PRECISIONS = ("fp32", "bf16")
CONFIDENCE_PRECISIONS = ("float64", "float32")  # eval.confidence_precision (lengthgen.methods.looped.stop_passes)
LOG_SINKS = ("jsonl", "tensorboard", "wandb")  # train.log_to choices (lengthgen.training.trackers)
DEVICE_PATTERN = re.compile(r"auto|cpu(:0)?|cuda(:[0-9]+)?|mps(:0)?")  # what pick_device can serve
ATTENTION_DROPOUT_ON = ("weights", "logits")
MAX_THREADS = 1024  # far above any machine's cores; a huge value crashes torch
MAX_SEED = 2**63  # seeds are 0 <= seed < MAX_SEED (torch takes 64-bit seeds)
# eval seeds one generator per length with seed * 1_000_003 + length, which must stay below 2**64
MAX_EVAL_SEED = 2**40
MAX_LENGTH = 100_000  # longest problem length, trained or tested
MAX_LENGTHS = 10_000  # most test lengths in one eval.lengths
MAX_DATASET = 100_000_000  # data.dataset_size: far above the 10^5-10^6 samples of Cho et al.'s sets
# a config is a few levels deep (eval.sweep.k = [values]); tomllib recurses per level and stops at
# Python's recursion limit, so a file nested thousands deep is refused in one line, not a traceback
TOO_DEEP = "a lengthgen config is a few levels deep (section.key.option = [values])"
# reproduce --seeds: every run of a grid is planned and checked before the first one starts (measured:
# about 3.5 ms a run on a 2-core machine), so 1,000 seeds of one task and arm take about 4 s before any
# training, 10^8 took hours of silence; the papers reproduced average 3 to 5 seeds
MAX_SEEDS = 1000


RUNTIME_KEYS = {"train.threads", "train.device", "train.log_to", "train.capture"}  # how a run executes, not what it computes
# set per run by a grid (--seeds, --threads): a --set of these would be overridden
PER_RUN_KEYS = {"train.model_seed": "--seeds", "data.seed": "--seeds", "train.threads": "--threads"}
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
            if path in MOVED:
                raise ConfigError(f"config key {path} is now {MOVED[path]}")
            full = [f"{prefix}{k}" for k in known]
            raise ConfigError(f"unknown config key {path}{_hint(path, full)}")
        if path in ("eval.lengths", "tests.lengths") and isinstance(value, int) and not isinstance(value, bool):
            value = str(value)  # `--set eval.lengths=24` is a TOML integer: one test length
        current = getattr(cfg, key)
        if is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{path} is a section; set its keys, e.g. {path}.{next(iter(fields(current))).name}=...")
            _apply(current, value, prefix=f"{path}.")
        elif isinstance(current, dict) and isinstance(value, dict):
            # an options table merges key by key: `--set task.options.k=4` keeps the preset's other options
            setattr(cfg, key, {**current, **value})
        else:
            setattr(cfg, key, _coerce(path, value, known[key].type))


def read(preset: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Defaults <- preset TOML <- --set overrides, parsed and typed but not validated
    against the registries (lengthgen.assembly.runs.new_run does both)."""
    cfg = Config()
    if preset is not None:
        path = preset_path(preset)  # a path, or the name of a bundled preset (looped/cpu/parity)
        if not path.is_file():  # missing, a folder, a FIFO, /dev/zero: said as what it is
            bundled = "" if path.exists() else " (nor is it a bundled preset: `lengthgen presets` lists them)"
            raise ConfigError(f"config file {path} {path_problem(path, 'TOML file')}{bundled}")
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise ConfigError(f"config file {path} is not UTF-8 text (TOML files must be UTF-8)") from None
        except OSError as err:
            raise ConfigError(f"config file {path} cannot be read: {err.strerror}") from None
        except tomllib.TOMLDecodeError as err:
            raise ConfigError(f"{path} is not valid TOML: {err}") from None
        except RecursionError:  # tomllib recurses per level of nesting
            raise ConfigError(f"{path} is nested too deeply to read; {TOO_DEEP}") from None
        _apply(cfg, upgrade(data))
        cfg.plugins = [resolved(spec, path.parent) for spec in cfg.plugins]  # a file relative to its preset
    return with_overrides(cfg, overrides)


def with_overrides(cfg: Config, overrides: list[str] = ()) -> Config:
    """`cfg` with --set overrides applied (in place), a plugin file they name relative to the current folder."""
    for text in overrides:
        _apply(cfg, parse_override(text))
    cfg.plugins = [resolved(spec) for spec in cfg.plugins]
    return cfg


def from_data(data: dict) -> Config:
    """A Config from a dict such as to_dict's (e.g. a checkpoint's), not validated."""
    cfg = Config()
    _apply(cfg, upgrade(data))
    return cfg


def flat(data: dict, prefix: str = "") -> dict:
    """{'model': {'position_options': {'theta': 1}}} -> {'model.position_options.theta': 1}:
    every leaf under its dotted key (an empty table is a leaf)."""
    out = {}
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.update(flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def option_combinations(table: dict) -> list[dict]:
    """{key: [values]} -> one {key: value} per combination of the values ([{}] for an empty table):
    a grid's axes, an evaluation's sweep."""
    return [dict(zip(table, combo)) for combo in itertools.product(*table.values())]


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
    except RecursionError:
        raise ConfigError(f"--set {key}: the value is nested too deeply to read; {TOO_DEEP}") from None
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


def to_dict(cfg: Config) -> dict:
    return asdict(cfg)


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else toml_value(key)


def toml_value(value) -> str:
    """A TOML literal of a value of a config (`--set` takes these)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    return repr(value)


def to_toml(cfg: Config) -> str:
    """The resolved config as TOML, loadable again as a preset."""
    data = to_dict(cfg)
    plugins = data.pop("plugins")  # written only where a run has plugins: other runs' files stay as they were
    lines = [f"method = {toml_value(data.pop('method'))}"] + ([f"plugins = {toml_value(plugins)}"] if plugins else [])
    for section, values in data.items():
        lines.append(f"\n[{section}]")
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def parse_sweep(text: str) -> tuple[str, list]:
    """'symbols=[5, 10]' -> ('symbols', [5, 10]); the key stays whole (position.scaling), and a list of
    bare words ([none,pi]) is a list of strings, as --set reads a bare word."""
    key, raw = (part.strip() for part in text.split("=", 1))
    value = parse_override(f"v={raw}")["v"]
    if isinstance(value, str) and raw.startswith("[") and raw.endswith("]"):  # not TOML: [none, pi]
        value = [parse_override(f"v={item.strip()}")["v"] for item in raw[1:-1].split(",") if item.strip()]
    return key, value if isinstance(value, list) else [value]
