"""Plugins (docs/api.md#plugins): parts registered from the user's own code go through the same
checks, runs, evaluation, resumption, reports, exports and worker processes as the built-in ones;
every failure is one line with nothing written."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import lengthgen
from lengthgen import plugins, register
from lengthgen.cli import main
from lengthgen.errors import PluginError
from lengthgen.model.positions import SCHEMES
from tests.helpers.tiny_runs import TINY, killed_after, one_line_error

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "plugins"
HALF_ROPE = EXAMPLES / "half_rope.py"
SETS = [f"--set={s}" for s in TINY]


def write(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source))
    return path


def logits(position: str, extra=()):
    run = lengthgen.api.assembled_config(None, TINY + [f"model.position={position}", *extra], ())
    torch.manual_seed(0)
    model = run.method.build_model(run.cfg, run.task).eval()
    batch = run.task.sample(4, 4, torch.Generator().manual_seed(1))
    return model(batch.inputs)


def test_a_scheme_that_overrides_no_hook_is_nope(registries):
    @register.scheme("bare")
    class Bare(lengthgen.PositionalScheme):
        pass

    assert SCHEMES["bare"] is Bare
    assert torch.equal(logits("bare"), logits("nope"))
    assert not torch.equal(logits("rope"), logits("nope"))  # the comparison can tell schemes apart


def test_a_plugin_scheme_is_used_by_the_model(registries):
    calls = []

    @register.scheme("counted")
    class Counted(lengthgen.PositionalScheme):
        def rotate(self, q, k, position_ids):
            calls.append(tuple(q.shape))
            return -q, k  # a visible change of the logits

    assert not torch.equal(logits("counted"), logits("nope")) and calls


def test_names_are_held_once(registries):
    with pytest.raises(PluginError, match=r"'rope' is already held by the built-in lengthgen.model.rotary.RoPE"):
        register.scheme("rope")(type("Mine", (lengthgen.PositionalScheme,), {}))

    @register.task("twice")
    class First(lengthgen.Task):
        pass

    with pytest.raises(PluginError,  # tests/ is a package: this module is tests.test_plugins
                       match=r"'twice' is already held by .*First of plugin tests\.test_plugins; register Second"):
        register.task("twice")(type("Second", (lengthgen.Task,), {}))
    again = type("First", (lengthgen.Task,), {"__module__": First.__module__, "__qualname__": First.__qualname__})
    register.task("twice")(again)  # the same definition run again (a notebook cell): it replaces the first
    assert register.TASKS["twice"] is again and again.name == "twice"
    with pytest.raises(PluginError, match="must subclass lengthgen.PositionalScheme"):
        register.scheme("not_a_scheme")(type("Plain", (), {}))
    with pytest.raises(PluginError, match="letters, digits"):
        register.method("a/b")(type("M", (lengthgen.Method,), {}))


def test_every_kind_registers_and_runs(registries, tmp_path):
    """A stop rule, a position transform and a method from one plugin file, in one tiny run."""
    plugin = write(tmp_path / "kinds.py", '''
        from lengthgen import PositionTransform, StopRule, register
        from lengthgen.methods.looped.stop_passes import fixed
        from lengthgen.methods.looped.methods import Looped
        from lengthgen.model.position_transforms import base_ids, real_columns
        from dataclasses import replace
        import torch

        @register.stop_rule("twice")
        class Twice(StopRule):
            """Read out after 2 T(n) iterations."""
            def run(self, model, batch):
                return fixed(model, batch, self.steps_needed(batch))
            def steps_needed(self, batch):
                return 2 * int(batch.n_steps.clamp(min=1).max())
            def trace_steps(self, tr, batch):
                return None

        @register.transform("shift")
        class Shift(PositionTransform):
            changes_ids = True
            def __init__(self, by: int = 3):
                self.by = by
            def largest_id(self, base):
                return base + self.by
            def __call__(self, batch, generator):
                ids = base_ids(batch)
                return replace(batch, position_ids=torch.where(real_columns(batch), ids + self.by, 0))

        @register.method("looped-twin")
        class LoopedTwin(Looped):
            pass
        ''')
    folder = tmp_path / "run"
    sets = SETS + ["--set=method=looped-twin", "--set=data.position_transform=shift", "--set=model.position=learned",
                   "--set=data.position_transform_options={by = 5}", "--set=model.max_positions=32"]
    assert main(["train", "--defaults", *sets, "--plugin", str(plugin), "--out", str(folder), "--no-progress"]) == 0
    assert main(["eval", str(folder), "--stop", "twice,oracle", "--lengths", "3", "--samples", "8",
                 "--no-progress"]) == 0
    rows = lengthgen.load(folder).rows()
    assert {r["stop"] for r in rows} == {"twice", "oracle"} and {r["method"] for r in rows} == {"looped-twin"}
    twice = next(r for r in rows if r["stop"] == "twice")
    assert twice["stop_step"] == 6.0  # 2 T(3) for every sample


def test_a_plugin_transform_too_large_for_the_table_is_refused(registries, tmp_path, capsys):
    plugin = write(tmp_path / "shift.py", '''
        from lengthgen import PositionTransform, register

        @register.transform("shift_big")
        class Shift(PositionTransform):
            changes_ids = True
            def largest_id(self, base):
                return base + 100
        ''')
    sets = SETS + ["--set=data.position_transform=shift_big", "--set=model.position=learned",
                   "--set=model.max_positions=32"]
    assert main(["train", "--defaults", *sets, "--plugin", str(plugin), "--out", str(tmp_path / "r"),
                 "--no-progress"]) == 2
    assert "model.max_positions (32) is too small for data.position_transform shift_big" in one_line_error(capsys)
    assert not (tmp_path / "r").exists()


def test_options_are_checked_as_a_builtins(registries, tmp_path, capsys):
    base = ["train", "looped/cpu/parity", "--plugin", str(HALF_ROPE), "--set=model.position=half_rope",
            "--out", str(tmp_path / "r"), "--no-progress"]
    assert main(base + ["--set=model.position_options.fractoin=0.5"]) == 2
    line = one_line_error(capsys)
    assert "fractoin is not an option of half_rope (did you mean fraction?)" in line
    assert main(base + ["--set=model.position_options.fraction=2.0"]) == 2
    assert "fraction must be in (0, 1]" in one_line_error(capsys)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("source, said", [
    ("import no_such_package_here\n", "cannot be imported: ModuleNotFoundError: No module named 'no_such_package_here'"),
    ("raise RuntimeError('broken on purpose')\n", "cannot be imported: RuntimeError: broken on purpose"),
    ("from lengthgen import PositionalScheme, register\n\n@register.scheme('alibi')\nclass A(PositionalScheme):\n    pass\n",
     "'alibi' is already held by the built-in"),
])
def test_a_bad_plugin_is_one_line_and_nothing_is_written(registries, tmp_path, capsys, source, said):
    plugin = write(tmp_path / "bad.py", source)
    folder = tmp_path / "run"
    for argv in (["train", "--defaults", *SETS, "--plugin", str(plugin), "--out", str(folder), "--no-progress"],
                 ["tasks", "--plugin", str(plugin)]):
        assert main(argv) == 2
        line = one_line_error(capsys)
        assert line.startswith(f"lengthgen: error: plugin {plugin}") and said in line
    assert not folder.exists()


def test_a_missing_plugin_is_one_line(registries, tmp_path, capsys):
    assert main(["tasks", "--plugin", "no_such_module_of_plugins"]) == 2
    assert "plugin no_such_module_of_plugins cannot be imported: ModuleNotFoundError" in one_line_error(capsys)
    assert main(["tasks", "--plugin", str(tmp_path / "gone.py")]) == 2
    assert f"plugin {tmp_path / 'gone.py'} does not exist" in one_line_error(capsys)


def test_a_preset_names_its_plugins_relative_to_itself_and_the_run_records_them(registries, tmp_path, capsys,
                                                                                  monkeypatch):
    project = tmp_path / "project"
    (project / "plugins").mkdir(parents=True)
    shutil.copy(HALF_ROPE, project / "plugins" / "half.py")
    preset = project / "half.toml"
    preset.write_text('plugins = ["plugins/half.py"]\n\n[model]\nposition = "half_rope"\n' +
                      "".join(f"# {s}\n" for s in TINY))
    monkeypatch.chdir(tmp_path)  # elsewhere: the path is the preset's, not the current folder's
    folder = tmp_path / "run"
    assert main(["train", str(preset), *SETS, "--out", str(folder), "--no-progress"]) == 0
    recorded = str((project / "plugins" / "half.py").resolve())
    assert f'plugins = ["{recorded}"]' in (folder / "config.toml").read_text()
    assert lengthgen.load(folder).cfg.plugins == [recorded]
    (project / "plugins" / "half.py").rename(project / "plugins" / "moved.py")
    forget_half_rope(recorded)  # as in a new process where nothing is loaded yet: the eval must import it again
    capsys.readouterr()
    assert main(["eval", str(folder), "--lengths", "2", "--samples", "4", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    assert f"plugin {recorded}" in err and "does not exist" in err and "recorded in" in err
    assert not (folder / "eval.csv").exists()


def test_an_installed_packages_entry_point_is_loaded(tmp_path):
    """`lengthgen.plugins` entry points of installed packages: loaded in every process, no flag needed."""
    site = tmp_path / "site"
    (site / "majority_pkg").mkdir(parents=True)
    shutil.copy(EXAMPLES / "majority.py", site / "majority_pkg" / "__init__.py")
    info = site / "majority_pkg-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: majority-pkg\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[lengthgen.plugins]\nmajority = majority_pkg\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "lengthgen", "tasks", "--length", "5"], capture_output=True,
                         text=True, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert any(line.startswith("majority ") and "T(n)=5" in line for line in out.stdout.splitlines())


def forget_half_rope(spec: str) -> None:
    """This process as a new one would be: the plugin module `spec` not loaded, its half_rope scheme
    not registered (the registries fixture puts back what was before the test)."""
    module = plugins._loaded.pop(spec, None)
    sys.modules.pop(getattr(module, "__name__", ""), None)
    SCHEMES.pop("half_rope", None)


def trained_half_rope(folder: Path, *extra: str) -> list[str]:
    """The `lengthgen train` arguments of a tiny half_rope run (after `python -m lengthgen`, or to main)."""
    return ["train", "--defaults", *SETS, "--plugin", str(HALF_ROPE), "--set=model.position=half_rope", *extra,
            "--out", str(folder), "--no-progress"]


@pytest.mark.slow
def test_a_plugin_scheme_resumes_after_a_kill_to_the_same_weights(registries, tmp_path, monkeypatch):
    sets = ["--set=train.steps=200", "--set=train.checkpoint_interval=25", "--set=train.threads=1"]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    assert 50 <= killed_after([sys.executable, "-m", "lengthgen", *trained_half_rope(killed, *sets)], killed) < 200, \
        "the run finished before it could be killed"
    # resumed here, with nothing of the plugin loaded, as in a new process: the recorded one is imported,
    # no --plugin needed
    forget_half_rope(str(HALF_ROPE.resolve()))
    monkeypatch.chdir(tmp_path)  # elsewhere than the plugin's folder
    assert main(["train", "--resume", "--out", str(killed), "--no-progress"]) == 0
    assert "half_rope" in SCHEMES
    assert main(trained_half_rope(whole, *sets)) == 0  # the uninterrupted run
    a = load_file(whole / "checkpoints" / "step_00000200" / "model.safetensors")
    b = load_file(killed / "checkpoints" / "step_00000200" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_a_plugin_scheme_evaluates_reports_and_exports_as_a_builtin(registries, tmp_path):
    """Its export loads in transformers without lengthgen and gives lengthgen's logits."""
    folder = tmp_path / "run"
    assert main(trained_half_rope(folder)) == 0
    run = lengthgen.load(folder)
    rows = run.evaluate(lengths=[2, 4], samples=8, progress=False)
    assert [r["position"] for r in rows] == ["half_rope", "half_rope"]
    assert {row["position"] for row in run.report().rows()} == {"half_rope"}
    out = tmp_path / "hf"
    run.export(out)
    assert {"plugin_half_rope.py", "lengthgen_api.py"} <= {p.name for p in out.iterdir()}
    batch = run.task.sample(3, 4, torch.Generator().manual_seed(3))
    want = run.model(batch.inputs)
    code = ("import sys, torch; sys.modules['lengthgen'] = None\n"
            "from transformers import AutoModelForCausalLM\n"
            f"m = AutoModelForCausalLM.from_pretrained({str(out)!r}, trust_remote_code=True).eval()\n"
            f"ids = torch.tensor({batch.inputs.tolist()})\n"
            "torch.save(m(ids).logits.detach(), sys.argv[1])\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "logits.pt")], capture_output=True, text=True,
                          env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert torch.allclose(torch.load(tmp_path / "logits.pt"), want, atol=1e-5)
    assert main(["eval", str(out), "--lengths", "2", "--samples", "4", "--no-progress"]) == 0  # lengthgen reads it back


def test_an_export_that_cannot_carry_a_plugin_is_refused_in_one_line(registries, tmp_path, capsys):
    package = tmp_path / "schemepkg"
    package.mkdir()
    write(package / "helpers.py", "SIGN = -1\n")
    write(package / "scheme.py", '''
        from lengthgen import PositionalScheme, register
        from .helpers import SIGN

        @register.scheme("signed")
        class Signed(PositionalScheme):
            def rotate(self, q, k, position_ids):
                return SIGN * q, k
        ''')
    (package / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    try:
        folder = tmp_path / "run"
        assert main(["train", "--defaults", *SETS, "--plugin", "schemepkg.scheme", "--set=model.position=signed",
                     "--out", str(folder), "--no-progress"]) == 0
        assert main(["export", str(folder), "--out", str(tmp_path / "hf")]) == 2
        line = one_line_error(capsys)
        assert "export cannot bundle model.position's plugin scheme Signed" in line and "imports relatively" in line
        assert not (tmp_path / "hf").exists() and not list(tmp_path.glob(".hf*"))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("schemepkg.scheme", None)
