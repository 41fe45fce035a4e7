"""The Python API (lengthgen.api, docs/api.md): the commands as functions, their errors as
exceptions, and the CLI as a thin layer over them."""
from __future__ import annotations

import argparse
import inspect
from pathlib import Path

import pytest

import lengthgen
from lengthgen import api, cli
from lengthgen.config.presets import EXPERIMENTS
from lengthgen.errors import ConfigError, UserError
from lengthgen.results.rows import read_rows
from tests.helpers.tiny_runs import TINY
from tests.helpers.toy_papers import positions_grid, toy_paper, toy_preset

OVERRIDES = dict(item.split("=", 1) for item in TINY)  # the tiny run, as a dict of the values' TOML text


def tiny_overrides(**more) -> dict:
    """TINY as Python values (what a notebook writes): numbers as numbers, text as text."""
    values = {k: int(v) if v.lstrip("-").isdigit() else v for k, v in OVERRIDES.items()}
    return {**values, **more}


def test_train_evaluate_load_and_report_from_python(tmp_path):
    run = lengthgen.train(None, tiny_overrides(**{"eval.lengths": "2,4"}), out=tmp_path / "run", defaults=True,
                          progress=False)
    assert isinstance(run, lengthgen.TrainedRun) and run.step == 6 and run.summary["step"] == 6
    rows = run.evaluate(lengths=range(1, 6), samples=8, progress=False)
    assert [r["length"] for r in rows] == [1, 2, 3, 4, 5] and all(0 <= r["accuracy"] <= 1 for r in rows)
    assert all(isinstance(r, dict) and r["task"] == "copy" for r in rows)
    again = lengthgen.load(tmp_path / "run")
    assert again.cfg == run.cfg and again.cfg.task.train_max == 4
    assert {r["length"] for r in again.rows()} == {1, 2, 3, 4, 5}  # merged into eval.csv
    assert [r["step"] for r in again.log()][-1] == 6
    report = again.report()
    assert report.path == tmp_path / "run" / "report.md" and "lengthgen report" in report.text
    assert {r["length"] for r in report.rows()} == {1, 2, 3, 4, 5} and isinstance(report.rows()[0]["accuracy"], float)


def test_overrides_as_a_dict_as_strings_and_a_config_agree():
    from_dict = lengthgen.load_config(None, {"task.options": {"symbols": 7}, "train.steps": 9, "task.name": "copy_symbols"})
    from_text = lengthgen.load_config(None, ["task.options={symbols = 7}", "train.steps=9", "task.name=copy_symbols"])
    from_config = lengthgen.load_config(from_text, {"train.steps": 9})
    assert from_dict == from_text == from_config and from_dict.task.options == {"symbols": 7}
    bundled = lengthgen.load_config("looped/cpu/parity")
    assert bundled == lengthgen.load_config(EXPERIMENTS / "looped" / "cpu" / "parity.toml")
    assert bundled == lengthgen.load_config("experiments/looped/cpu/parity.toml")  # as the docs spell it


@pytest.mark.parametrize("call, kind, said", [
    (lambda tmp: lengthgen.train("no/such/preset", out=tmp / "r"), ConfigError, "nor is it a bundled preset"),
    (lambda tmp: lengthgen.train(None, {"train.steps": 3}, out=tmp / "r"), UserError, "name a preset"),
    (lambda tmp: lengthgen.train("looped/cpu/parity", {"model.n_head": 5}, out=tmp / "r"), ConfigError, "model.n_head"),
    (lambda tmp: lengthgen.train("looped/cpu/parity", {"train.stpes": 5}, out=tmp / "r"), ConfigError,
     "did you mean train.steps"),
    (lambda tmp: lengthgen.load(tmp / "none"), UserError, "does not exist"),
    (lambda tmp: lengthgen.evaluate(tmp, samples=0), UserError, "--samples must be >= 1"),
    (lambda tmp: lengthgen.evaluate(tmp, lengths=[0.5]), UserError, "lengths must be"),
    (lambda tmp: lengthgen.reproduce("no_such_paper", out=tmp / "r"), UserError, "unknown paper"),
    (lambda tmp: lengthgen.reproduce("looped", tasks=[], out=tmp / "r"), UserError, "names no task"),
])
def test_errors_are_exceptions_of_one_line_and_nothing_is_written(tmp_path, call, kind, said):
    with pytest.raises(kind, match=said) as raised:
        call(tmp_path)
    assert "\n" not in str(raised.value) and not isinstance(raised.value, SystemExit)
    assert not (tmp_path / "r").exists()


def test_the_options_of_evaluate_and_reproduce_are_one_object_each(tmp_path, monkeypatch):
    """Keywords or the object, the object's fields replaced by the keywords beside it; values put in
    one form as the object is made; an unknown keyword a TypeError of one line naming it."""
    from lengthgen.evaluation import evaluate as evaluator
    from lengthgen.reproduction import runner

    asked = []
    monkeypatch.setattr(runner, "reproduce", lambda paper, request: asked.append((paper, request)) or tmp_path / "r.md")
    monkeypatch.setattr(evaluator, "evaluate_run", lambda folder, settings: asked.append((folder, settings)) or [])
    lengthgen.reproduce("looped", scale="cpu", seeds=1, tasks="parity, copy", overrides={"train.steps": 3},
                        axes={"task.options.k": [2, True]})
    assert asked[-1] == ("looped", lengthgen.ReproduceRequest(scale="cpu", seeds=1, tasks=("parity", "copy"),
                                                              overrides=("train.steps=3",),
                                                              axes={"task.options.k": ["2", "true"]}))
    base = lengthgen.ReproduceRequest(scale="cpu", seeds=2, out=str(tmp_path))
    assert isinstance(lengthgen.reproduce("looped", base, seeds=1), api.Report)
    assert asked[-1][1] == lengthgen.ReproduceRequest(scale="cpu", seeds=1, out=tmp_path)
    lengthgen.evaluate(tmp_path, "2,4", 8, settings=lengthgen.EvalSettings(batch_size=4, samples=16), seed=7)
    assert asked[-1] == (tmp_path, lengthgen.EvalSettings(lengths=(2, 4), samples=8, batch_size=4, seed=7))
    for call, said in ((lambda: lengthgen.reproduce("looped", seed=1), r"'seed' \(did you mean seeds\?\)"),
                       (lambda: lengthgen.evaluate(tmp_path, stop="oracle"), r"'stop' \(did you mean stops\?\)"),
                       (lambda: lengthgen.reproduce("looped", {"scale": "cpu"}), "takes its options as a")):
        with pytest.raises(TypeError, match=said) as raised:
            call()
        assert "\n" not in str(raised.value)
    assert "ReproduceRequest: scale, seeds, tasks" in str(pytest.raises(TypeError, lengthgen.reproduce, "p", x=1).value)


def test_every_option_is_documented_in_its_docstring_and_in_the_api_page():
    from dataclasses import fields

    page = (Path(__file__).resolve().parents[1] / "docs" / "api.md").read_text()
    for kind in (lengthgen.EvalSettings, lengthgen.ReproduceRequest):
        for field in fields(kind):
            assert f"    {field.name}: " in kind.__doc__, (kind.__name__, field.name)
            assert f"`{field.name}`" in page, (kind.__name__, field.name)


def test_reproduce_returns_its_report(tmp_path):
    paper = toy_paper(tmp_path / "toy", positions_grid("A toy grid"), {"parity": toy_preset(steps=4, samples=8)})
    report = lengthgen.reproduce(paper, seeds=1, out=tmp_path / "out", workers=1, threads=1, progress=False)
    assert report.path == tmp_path / "out" / "report.md" and "A toy grid" in report.text
    assert {r["position"] for r in report.rows()} == {"nope", "rope"}
    assert lengthgen.papers() and "looped" in lengthgen.papers()
    names = {p.name for p in lengthgen.presets()}
    assert {"looped/cpu/parity", "core/parity-ntp", "chomsky/paper/parity_check"} <= names


def test_the_commands_are_thin_layers_over_the_api(monkeypatch, tmp_path):
    """Each command hands its flags to one function of lengthgen.api, which does the work: a flag the
    function does not take would fail here, not drift."""
    calls = {}

    class Stub:
        def __init__(self, name, result):
            self.name, self.result = name, result

        def __call__(self, *args, **kwargs):
            real = getattr(api, f"_real_{self.name}")
            inspect.signature(real).bind(*args, **kwargs)  # the call the real function would take
            calls[self.name] = (args, kwargs)
            return self.result

    report = api.Report(tmp_path / "report.md")
    report.path.write_text("the report")
    trained = api.TrainedRun(tmp_path, {"step": 1, "device": "cpu"})
    for name, result in (("train", trained), ("evaluate", [{"stop": "", "length": 2}]), ("report", report),
                         ("reproduce", report), ("export", [])):
        monkeypatch.setattr(api, f"_real_{name}", getattr(api, name), raising=False)
        monkeypatch.setattr(api, name, Stub(name, result))
    monkeypatch.setattr("lengthgen.results.rows.format_table", lambda rows: "")
    assert cli.main(["train", "looped/cpu/parity", "--set", "train.steps=3", "--out", str(tmp_path / "t"),
                     "--plugin", "my.mod", "--no-progress"]) == 2  # my.mod cannot be imported: refused first
    assert cli.main(["train", "looped/cpu/parity", "--set", "train.steps=3", "--out", str(tmp_path / "t")]) == 0
    assert calls["train"] == (("looped/cpu/parity", ["train.steps=3"]),
                              {"out": str(tmp_path / "t"), "resume": False, "force": False, "progress": True,
                               "plugins": [], "defaults": False})
    assert cli.main(["eval", str(tmp_path), "--lengths", "2", "--stop", "oracle,fixed:3", "--no-progress"]) == 0
    assert calls["evaluate"][0] == (str(tmp_path), "2", None) and calls["evaluate"][1]["stops"] == ["oracle", "fixed:3"]
    assert cli.main(["report", str(tmp_path), "--compare", "a,b", "--curves"]) == 0
    assert calls["report"][1]["compare"] == "a,b" and calls["report"][1]["curves"] is True
    assert cli.main(["reproduce", "looped", "--tasks", "parity", "--axis", "model.position=rope,half_rope"]) == 0
    assert calls["reproduce"][1]["axes"] == {"model.position": ["rope", "half_rope"]}
    assert cli.main(["export", str(tmp_path), "--out", str(tmp_path / "hf")]) == 0
    assert calls["export"] == ((str(tmp_path), str(tmp_path / "hf")), {"force": False})


def test_every_command_takes_plugin_and_the_version_is_read_from_one_place(capsys):
    parser = cli.parser()
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert all("--plugin" in c.format_help() for c in commands.values()) and {"presets", "train"} <= set(commands)
    with pytest.raises(SystemExit):
        parser.parse_args(["--version"])
    assert capsys.readouterr().out.strip() == f"lengthgen {lengthgen.__version__}"
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject and 'attr = "lengthgen.__version__"' in pyproject


def test_presets_lists_every_bundled_preset(capsys):
    assert cli.main(["presets"]) == 0
    out = capsys.readouterr().out
    files = sorted(p for p in EXPERIMENTS.rglob("*.toml") if p.name != "grid.toml")
    assert f"{len(files)} presets" in out
    assert all(p.relative_to(EXPERIMENTS).with_suffix("").as_posix() in out for p in files)
    assert cli.main(["presets", "looped"]) == 0 and "chomsky/" not in capsys.readouterr().out


def test_importing_lengthgen_loads_no_torch():
    import subprocess
    import sys

    code = "import sys, lengthgen; lengthgen.register; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
