"""Config loading: presets, overrides, and one-line errors that name the key."""
from __future__ import annotations

from pathlib import Path

import pytest

from lengthgen import config
from lengthgen.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
PRESETS = sorted(p for p in ROOT.glob("experiments/**/*.toml") if p.name != "methods.toml")


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_preset_loads_with_every_method(preset):
    from lengthgen.reproduce import method_overrides

    cfg = config.load(preset)
    assert cfg.task.train_max >= cfg.task.train_min
    scale, paper = preset.parent.name, preset.parent.parent.name
    if (ROOT / "experiments" / paper / "methods.toml").exists():
        for method in ("looped", "looped-wo-injection", "ntp", "ntp-pause", "ntp-loop"):
            assert config.load(preset, method_overrides(paper, scale, method, cfg.model.n_layer)).method == method


def test_overrides_are_typed_and_win():
    cfg = config.load(None, ["model.n_layer=3", "model.position=rope", "train.lr=0.002", "task.name=copy",
                             "train.betas=[0.9, 0.95]", "task.options={}"])
    assert (cfg.model.n_layer, cfg.model.position, cfg.train.lr, cfg.task.name) == (3, "rope", 0.002, "copy")
    assert cfg.train.betas == [0.9, 0.95]
    assert isinstance(config.load(None, ["train.lr=1"]).train.lr, float)  # ints are accepted for floats


@pytest.mark.parametrize("override, names", [
    ("model.no_such_key=1", ["model.no_such_key"]),
    ("model.n_layers=2", ["model.n_layers", "did you mean model.n_layer"]),
    ("nosection.x=1", ["nosection"]),
    ("model.d_model=abc", ["model.d_model", "int"]),
    ("model.d_model=1.5", ["model.d_model", "int"]),
    ("train.ema=true", ["train.ema", "bool"]),
    ("model=3", ["model", "section"]),
    ("model.n_head=5", ["model.n_head", "divide"]),
    ("task.name=parityy", ["task.name", "did you mean parity"]),
    ("model.position=ropee", ["model.position", "did you mean rope"]),
    ("model.init=torc", ["model.init", "did you mean torch"]),
    ("method=ntpp", ["method", "did you mean ntp"]),
    ("task.train_max=0", ["task.train_max"]),
    ("eval.lengths=0:5", ["lengths", ">= 1"]),
    ("eval.lengths=a:b", ["lengths"]),
    ("train.schedule=linear", ["train.schedule"]),
    ("train.curriculum_start=99", ["train.curriculum_start"]),
    ("task.options={bogus=1}", ["task.options", "bogus"]),
])
def test_bad_values_name_the_key(override, names):
    with pytest.raises(ConfigError) as err:
        config.load(None, [override])
    message = str(err.value)
    assert "\n" not in message
    for name in names:
        assert name in message


def test_missing_and_invalid_preset(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        config.load(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\nd_model = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load(bad)


def test_resolved_config_round_trips_through_toml(tmp_path):
    cfg = config.load(None, ["model.position=alibi", "task.name=unique_set", "task.options={symbols = 7}",
                             "train.betas=[0.8, 0.9]", "eval.lengths=1:30:2"])
    path = tmp_path / "config.toml"
    path.write_text(config.to_toml(cfg))
    assert config.load(path) == cfg


def test_parse_lengths():
    assert config.parse_lengths("1:4") == [1, 2, 3, 4]
    assert config.parse_lengths("10:30:10") == [10, 20, 30]
    assert config.parse_lengths("3,1,7") == [3, 1, 7]
    with pytest.raises(ConfigError):
        config.parse_lengths("5:1")


def test_every_key_is_documented():
    from dataclasses import fields

    doc = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    cfg = config.Config()
    for section in ("task", "model", "train", "eval"):
        for f in fields(getattr(cfg, section)):
            assert f"`{section}.{f.name}`" in doc, f"{section}.{f.name} missing from docs/configuration.md"
