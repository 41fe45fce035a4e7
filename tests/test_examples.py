"""Every example of examples/ runs as its docstring says, at a tiny size; the plugin task is checked
against a brute-force count as the built-in tasks are (tests/helpers/task_checks.py)."""
from __future__ import annotations

import csv
import runpy
from pathlib import Path

import pytest
import torch

from lengthgen import register
from lengthgen.cli import main
from lengthgen.tasks.base import PAD
from tests.helpers.in_process import run_python_file

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.slow
def test_the_python_api_example_trains_evaluates_and_tables(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    done = run_python_file(EXAMPLES / "api.py", "--steps", "20", "--samples", "16", "--out", str(tmp_path / "api"))
    assert done.returncode == 0, done.stderr
    table = [line.split() for line in done.stdout.splitlines() if line.split() and line.split()[0].isdigit()]
    assert [int(row[0]) for row in table] == [6, 12, 18, 24]
    assert all(0 <= float(x) <= 1 for row in table for x in row[1:3])
    assert (tmp_path / "api" / "report.md").is_file() and (tmp_path / "api" / "looped" / "eval.csv").is_file()


@pytest.mark.slow
def test_the_plugin_scheme_runs_through_the_matrix_in_two_workers(registries, tmp_path, monkeypatch):
    """examples/plugins/half_rope.py beside RoPE on two tasks of the matrix, one seed, spawned workers
    (the command runs here; its runs in the two worker processes it spawns, which import the plugin)."""
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", "matrix", "--plugin", str(EXAMPLES / "plugins" / "half_rope.py"),
                 "--axis", "model.position=half_rope,rope", "--tasks", "parity,sparse_parity", "--seeds", "1",
                 "--workers", "2", "--set", "train.steps=4", "--samples", "4", "--out", "matrix",
                 "--no-progress"]) == 0
    with open(tmp_path / "matrix" / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    cells = {(r["task"], r["arm"], r["position"]) for r in rows}
    assert cells == {(t, a, p) for t in ("parity", "sparse_parity") for a in ("plain", "looped")
                     for p in ("half_rope", "rope")}
    runs = list((tmp_path / "matrix" / "runs").glob("*half_rope*"))
    assert len(runs) == 4 and all("half_rope.py" in (run / "config.toml").read_text() for run in runs)
    assert "--plugin" in (tmp_path / "matrix" / "report.md").read_text()  # its command reruns it


@pytest.fixture
def majority(registries):
    runpy.run_path(str(EXAMPLES / "plugins" / "majority.py"))
    return register.TASKS["majority"]()


def test_the_plugin_task_answers_as_a_brute_force_count(majority):
    lengths = torch.arange(1, 21).repeat(10)
    batch = majority.sample(len(lengths), lengths, torch.Generator().manual_seed(0))
    for i in range(len(lengths)):
        question, answer = majority.to_text(batch, i)
        bits = question.rstrip("=")
        assert len(bits) == int(lengths[i]) and set(bits) <= {"0", "1"}
        assert answer == ("1" if bits.count("1") > bits.count("0") else "0")
    assert int(batch.n_steps.sum()) == int(lengths.sum())  # T(n) = n
    assert (batch.inputs[:, : int(lengths.max())] != PAD).any()
    with pytest.raises(ValueError, match="ones must be a probability"):
        type(majority)(ones=1.5)


def test_the_plugin_task_trains_and_is_listed(registries, tmp_path, capsys):
    plugin = str(EXAMPLES / "plugins" / "majority.py")
    assert main(["tasks", "--plugin", plugin]) == 0 and "\nmajority " in capsys.readouterr().out
    assert main(["train", "looped/cpu/parity", "--plugin", plugin, "--set", "task.name=majority", "--set",
                 "train.steps=5", "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    assert main(["eval", str(tmp_path / "run"), "--lengths", "3,5", "--samples", "8", "--no-progress"]) == 0
    assert "majority" in (tmp_path / "run" / "eval.csv").read_text()
    assert main(["train", "looped/cpu/parity", "--plugin", plugin, "--set", "task.name=majority", "--set",
                 "task.options.onse=0.7", "--out", str(tmp_path / "bad"), "--no-progress"]) == 2
    assert "did you mean ones?" in capsys.readouterr().err and not (tmp_path / "bad").exists()
