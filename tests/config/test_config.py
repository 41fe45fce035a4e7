"""Config loading: presets, overrides, and one-line errors that name the key."""
from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from lengthgen.config.schedules import SCHEDULES
from lengthgen.config import schema as config

from lengthgen.reproduction import grid

from lengthgen.assembly.runs import new_run_config
from lengthgen.errors import ConfigError
from lengthgen.tasks.corpus import HUB_SOURCES, Corpus

ROOT = Path(__file__).resolve().parents[2]
PRESETS = sorted(p for p in ROOT.glob("experiments/**/*.toml") if p.name != "grid.toml")


def hub_corpus(preset: Path) -> bool:
    return tomllib.loads(preset.read_text()).get("task", {}).get("options", {}).get("source") in HUB_SOURCES


@pytest.mark.parametrize("preset", [p for p in PRESETS if not hub_corpus(p)], ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_preset_loads(preset):
    cfg = new_run_config(preset)
    assert cfg.task.train_max >= cfg.task.train_min


@pytest.mark.parametrize("preset", [p for p in PRESETS if hub_corpus(p)], ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_preset_on_a_hub_corpus_without_network_is_one_line(preset, tmp_path, monkeypatch):
    """The corpus is built at validation, before any folder: with the hub unreachable (here: made so)
    that is one line naming the corpus and the way out. The presets themselves load on local copies
    in tests/evaluation/test_sparsity_lm.py."""
    monkeypatch.setenv("LENGTHGEN_DATA", str(tmp_path))

    def unreachable(self, split):
        raise ConnectionError(f"Couldn't reach '{self.source}' on the Hub (LocalEntryNotFoundError)\nmore")

    monkeypatch.setattr(Corpus, "hub_documents", unreachable)
    with pytest.raises(ConfigError) as err:
        new_run_config(preset)
    line = str(err.value)
    assert "\n" not in line and "Couldn't reach" in line and "task.options.path" in line


@pytest.mark.slow
@pytest.mark.parametrize("paper", grid.papers(), ids=str)
def test_every_run_of_every_grid_loads(paper):
    """Every (scale, task, arm, axis values) a grid declares, default or not, is a valid config,
    and every arm a task runs changes what its name says: the arms of a grid differ."""
    g = grid.find(paper)
    for scale in g.scales:
        spec = g.resolved(scale)
        for task in spec["tasks"]:
            if hub_corpus(g.preset(scale, task)):  # needs the network; loaded on local copies in test_sparsity_lm.py
                continue
            configs, name = {}, new_run_config(g.preset(scale, task)).task.name
            for arm in g.arms_of(scale, task):
                for values in config.option_combinations(g.axes(scale, task)):
                    cfg = new_run_config(g.preset(scale, task), grid.arm_overrides(g, scale, task, arm, values))
                    assert cfg.task.name == name
                    configs[(arm, tuple(values.items()))] = config.to_dict(cfg)
            assert len({repr(c) for c in configs.values()}) == len(configs), (scale, task)


def test_overrides_are_typed_and_win():
    cfg = new_run_config(None, ["model.n_layer=3", "model.position=rope", "optim.lr=0.002", "task.name=copy",
                             "optim.betas=[0.9, 0.95]", "task.options={}"])
    assert (cfg.model.n_layer, cfg.model.position, cfg.optim.lr, cfg.task.name) == (3, "rope", 0.002, "copy")
    assert cfg.optim.betas == [0.9, 0.95]
    assert isinstance(new_run_config(None, ["optim.lr=1"]).optim.lr, float)  # ints are accepted for floats


@pytest.mark.parametrize("override, names", [
    ("model.no_such_key=1", ["model.no_such_key"]),
    ("model.n_layers=2", ["model.n_layers", "did you mean model.n_layer"]),
    ("nosection.x=1", ["nosection"]),
    ("model.d_model=abc", ["model.d_model", "int"]),
    ("model.d_model=1.5", ["model.d_model", "int"]),
    ("optim.ema=true", ["optim.ema", "bool"]),
    ("model=3", ["model", "section"]),
    ("model.n_head=5", ["model.n_head", "divide"]),
    ("task.name=parityy", ["task.name", "did you mean parity"]),
    ("model.position=ropee", ["model.position", "did you mean rope"]),
    ("model.init=torc", ["model.init", "did you mean torch"]),
    ("method=ntpp", ["method", "did you mean ntp"]),
    ("task.train_max=0", ["task.train_max"]),
    ("eval.lengths=0:5", ["lengths", ">= 1"]),
    ("eval.lengths=a:b", ["lengths"]),
    ("optim.schedule=linearr", ["optim.schedule", "did you mean linear"]),
    ("data.curriculum_start=99", ["data.curriculum_start"]),
    ("task.options={bogus=1}", ["task.options", "bogus"]),
    ("model.position_options.no_such=1", ["model.position_options.no_such", "not an option of nope"]),
    ("model.rope_theta=5", ["model.rope_theta", "model.position_options.theta"]),
    ("model.norm=batchnorm", ["model.norm", "layernorm, rmsnorm"]),
    ("model.mlp=swiglue", ["model.mlp", "did you mean swiglu"]),
    ("model.residual=sandwich-norm", ["model.residual"]),
    ("model.attn_dropout=1.0", ["model.attn_dropout", "[0, 1)"]),
    ("model.attn_dropout_on=logit", ["model.attn_dropout_on", "did you mean logits"]),
    ("model.embed_dropout=1.5", ["model.embed_dropout", "[0, 1)"]),
    ("model.qkv_bias=0", ["model.qkv_bias", "bool"]),
    ("model.init=tra2", ["model.init", "did you mean tra"]),
    ("model.bias=1", ["model.bias", "bool"]),
    ("data.position_transform=pose2", ["data.position_transform", "did you mean pose"]),
    ("eval.sweep={bogus=[1]}", ["eval.sweep.bogus"]),
    ('train.log_to=["jsonl", "tensorbord"]', ["train.log_to", "did you mean tensorboard"]),
    ("data.shards=3", ["data.shards", "divide train.batch_size"]),
    ("optim.cosine_start=100", ["optim.cosine_start", "curriculum_cosine"]),
    ("optim.cosine_start=-1", ["optim.cosine_start", ">= 0"]),
    ("train.halt_loss_weight=2", ["train.halt_loss_weight", "method_options.halt_loss_weight"]),
    ("method_options.halt_loss_weight=1", ["method_options.halt_loss_weight", "not an option of ntp"]),
    ("model.embed_bias=1", ["model.embed_bias", "bool"]),
    ("task.pad_to_row=yes", ["task.pad_to_row", "bool"]),
    ("eval.confidence_precision=float16", ["eval.confidence_precision", "float64, float32"]),
    ("optim.ema_start=-1", ["optim.ema_start", "0..train.steps - 1"]),
    ("task.options={empty_zero=true}", ["task.options", "empty_zero"]),
])
def test_bad_values_name_the_key(override, names):
    with pytest.raises(ConfigError) as err:
        new_run_config(None, [override])
    message = str(err.value)
    assert "\n" not in message
    for name in names:
        assert name in message


@pytest.mark.parametrize("overrides, names", [
    (["method=looped-halt", "method_options.halt_loss_weight=-1"], ["method_options", "halt_loss_weight", ">= 0"]),
    (["method=ppc", "method_options.id_loss_weight=true"], ["method_options", "id_loss_weight", "got True"]),
    (["method=ppc", "method_options.id_weight=2"], ["method_options.id_weight", "did you mean id_loss_weight"]),
    (["model.position=rope", "model.position_options.thetaa=5"], ["model.position_options.thetaa", "did you mean theta"]),
    (["model.position=rope", "model.position_options.theta=-1"], ["model.position_options", "theta"]),
    (["model.position=rope", "model.position_options.style=diagonal"], ["model.position_options", "style"]),
    (["data.position_transform=pose"], ["data.position_transform_options", "target_length"]),
    (["data.position_transform=pose", "data.position_transform_options.target_length=8"],
     ["data.position_transform_options", "target_length 8 allows position IDs up to 7"]),
    (["data.position_transform=random_offset", "data.position_transform_options={max_position=3}"],
     ["max_position 3 allows position IDs up to 3"]),
    (["data.position_transform=randomized", "data.position_transform_options={max_position=64, chunks=2}"],
     ["data.position_transform_options.chunks", "not an option of randomized"]),
    (["data.position_transform_options={max_position=64}"],
     ["data.position_transform_options.max_position", "not an option of none; its options: none"]),
    (["model.position=learned", "model.max_positions=40", "data.position_transform=random_offset",
      "data.position_transform_options={max_position=64}"], ["model.max_positions (40)", "up to 64", "at least 65"]),
    (["method=ntp-pause", "data.position_transform=random_offset", "data.position_transform_options={max_position=64}"],
     ["data.position_transform", "ntp-pause"]),
    (["task.name=multiplication", "eval.sweep={max_a_bits=[2, 0]}"], ["eval.sweep", "max_a_bits=0"]),
    (["model.dropout=0.1", "model.embed_dropout=0.1"], ["model.dropout", "model.embed_dropout"]),
    (["task.name=text", "data.position_transform=randomized", "data.position_transform_options={max_position=512}",
      "model.position=sinusoidal"], ["randomized", "perplexity"]),
    (["eval.sweep={symbols=[]}"], ["eval.sweep"]),
], ids=["halt-weight", "id-weight-type", "method-option-hint", "scheme-option-hint", "theta", "style", "pose-needs-target", "pose-short", "offset-short", "transform-option", "none-has-no-options",
        "table-under-transform", "pause-no-ids", "sweep-value", "two-embedding-dropouts", "randomized-text", "sweep-empty"])
def test_method_scheme_transform_and_sweep_options_are_checked(overrides, names):
    with pytest.raises(ConfigError) as err:
        new_run_config(None, overrides)
    message = str(err.value)
    assert "\n" not in message
    for name in names:
        assert name in message, message


def test_options_tables_merge_key_by_key():
    cfg = new_run_config(None, ["task.name=unique_set", "task.options={symbols=7}", "model.position=rope",
                                "model.position_options.theta=500000", "model.position_options.style=interleaved"])
    assert cfg.model.position_options == {"theta": 500000, "style": "interleaved"}
    assert new_run_config(None, ["task.name=unique_set", "task.options.symbols=9"]).task.options == {"symbols": 9}


def test_config_of_an_earlier_version_loads(tmp_path):
    """A run folder saved before model.rope_theta moved into RoPE's options still loads, to the same config."""
    old = tmp_path / "config.toml"
    old.write_text('[model]\nposition = "rope"\nrope_theta = 500000.0\n')
    assert new_run_config(old).model.position_options == {"theta": 500000.0}
    old.write_text('[model]\nposition = "nope"\nrope_theta = 10000.0\n')
    assert new_run_config(old) == new_run_config(None)


def test_missing_and_invalid_preset(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        new_run_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\nd_model = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        new_run_config(bad)


def test_resolved_config_round_trips_through_toml(tmp_path):
    cfg = new_run_config(None, ["model.position=rope", "task.name=unique_set", "task.options={symbols = 7}",
                                "optim.betas=[0.8, 0.9]", "eval.lengths=1:30:2", "model.position_options.theta=5e5",
                                "data.position_transform=pose", "data.position_transform_options={target_length=64}",
                                "eval.sweep={symbols=[7]}", "model.norm=rmsnorm", "model.mlp=swiglu"])
    path = tmp_path / "config.toml"
    path.write_text(config.to_toml(cfg))
    assert new_run_config(path) == cfg


def test_parse_lengths():
    assert config.parse_lengths("1:4") == [1, 2, 3, 4]
    assert config.parse_lengths("10:30:10") == [10, 20, 30]
    assert config.parse_lengths("3,1,7") == [3, 1, 7]
    with pytest.raises(ConfigError):
        config.parse_lengths("5:1")


def test_every_key_is_documented():
    from dataclasses import fields

    doc = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    cfg = config.Config()
    for section in ("task", "model", "train", "eval"):
        for f in fields(getattr(cfg, section)):
            assert f"`{section}.{f.name}`" in doc, f"{section}.{f.name} missing from docs/configuration.md"


def test_the_configuration_page_lists_every_key_choice_and_option():
    """docs/configuration.md against the schema and the registries: a key, a method, a scheme, a
    transform, a choice or an option added without a line there fails here."""
    import dataclasses
    import inspect

    from lengthgen.config import schema
    from lengthgen.methods.registry import METHODS
    from lengthgen.model import transformer
    from lengthgen.model.position_transforms import TRANSFORMS
    from lengthgen.model.positions import SCHEMES

    page = (ROOT / "docs" / "configuration.md").read_text()
    rows = {line.split("|")[1].strip().strip("`"): line for line in page.splitlines() if line.startswith("| `")}
    for section in dataclasses.fields(schema.Config):
        kind = getattr(schema, section.type, None) if isinstance(section.type, str) else section.type
        if not dataclasses.is_dataclass(kind):
            assert section.name in rows, f"{section.name} has no row"
            continue
        for f in dataclasses.fields(kind):
            assert f"{section.name}.{f.name}" in rows, f"{section.name}.{f.name} has no row"

    def options(cls, skip=("self", "cfg")):
        return [p.name for p in inspect.signature(cls.__init__).parameters.values()
                if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name not in skip]

    choices = {"method": METHODS, "model.position": SCHEMES, "data.position_transform": TRANSFORMS,
               "model.init": transformer.INITS, "model.norm": transformer.NORMS, "model.mlp": transformer.MLPS,
               "model.residual": transformer.RESIDUALS, "optim.schedule": SCHEDULES,
               "train.log_to": schema.LOG_SINKS, "model.attn_dropout_on": schema.ATTENTION_DROPOUT_ON}
    for key, names in choices.items():
        for name in names:
            assert any(f"{q}{name}{q}" in rows[key] for q in ("`", '"')) or f" {name} (" in rows[key] \
                or f" {name}," in rows[key], (key, name)
    for name, cls in SCHEMES.items():
        for option in options(cls):
            assert f"`{name}` takes" in rows["model.position_options"] and f"`{option}`" in rows["model.position_options"], (name, option)
    for name, cls in TRANSFORMS.items():
        for option in options(cls):
            assert f"`{option}`" in rows["data.position_transform_options"], (name, option)
    for name, cls in METHODS.items():
        for option in options(cls):
            assert f"`{name}`" in rows["method_options"] and f"`{option}`" in rows["method_options"], (name, option)


def test_the_methods_loss_weights_of_an_earlier_version_move_to_method_options():
    """A config saved before 2026-11-27 lists train.id_loss_weight and train.halt_loss_weight for every
    method: moved to method_options where set, dropped at the old default."""
    from lengthgen.config.schema import from_data
    old = {"method": "ppc", "train": {"steps": 5, "id_loss_weight": 0.5, "halt_loss_weight": 1.0}}
    cfg = from_data(old)
    assert cfg.method_options == {"id_loss_weight": 0.5} and cfg.train.steps == 5
    assert from_data({"method": "ntp", "train": {"id_loss_weight": 1.0, "halt_loss_weight": 1.0}}).method_options == {}


OLD_TRAIN = {"steps": 7, "batch_size": 16, "lr": 0.002, "betas": [0.9, 0.95], "schedule": "linear", "ema": 0.5,
             "curriculum_start": 3, "length_sampling": "per_batch", "data_seed": 4, "data_shards": 2,
             "position_transform": "random_offset", "position_transform_options": {"max_position": 30},
             "test_interval": 5, "test_lengths": "8", "test_stops": ["oracle"], "test_offset": 1}


def test_a_train_table_of_an_earlier_version_splits_into_its_sections(tmp_path):
    """Until 2026-11-27 [train] held the optimiser, the data stream and the tests: a preset or saved
    config of that layout loads with each key in its table, renamed where the table names it."""
    from lengthgen.config.schema import from_data
    from lengthgen.config.upgrade import TRAIN_SPLIT
    preset = tmp_path / "old.toml"
    preset.write_text("[train]\n" + "".join(f"{k} = {config.toml_value(v)}\n" for k, v in OLD_TRAIN.items()))
    for cfg in (config.read(preset), from_data({"train": OLD_TRAIN})):
        assert (cfg.train.steps, cfg.train.batch_size) == (7, 16)
        assert (cfg.optim.lr, cfg.optim.betas, cfg.optim.schedule, cfg.optim.ema) == (0.002, [0.9, 0.95], "linear", 0.5)
        assert (cfg.data.seed, cfg.data.shards, cfg.data.curriculum_start, cfg.data.length_sampling) == (4, 2, 3, "per_batch")
        assert (cfg.data.position_transform, cfg.data.position_transform_options) == ("random_offset", {"max_position": 30})
        assert (cfg.tests.interval, cfg.tests.lengths, cfg.tests.stops, cfg.tests.offset) == (5, "8", ["oracle"], 1)
    # every old key has a new home that exists, and a table set in the new layout wins over the old key
    for new in TRAIN_SPLIT.values():
        section, key = new.split(".")
        assert hasattr(getattr(config.Config(), section), key), new
    assert from_data({"train": {"lr": 0.1}, "optim": {"lr": 0.2}}).optim.lr == 0.2


@pytest.mark.parametrize("old, new", [("train.lr", "optim.lr"), ("train.data_seed", "data.seed"),
                                      ("train.test_interval", "tests.interval"), ("train.data_shards", "data.shards")])
def test_setting_a_key_of_the_old_train_table_names_its_new_key(old, new):
    with pytest.raises(ConfigError, match=f"config key {old} is now {new}"):
        config.read(None, [f"{old}=1"])
