"""A grid's [[evaluate]] entries: the runs whose config matches `when` are also evaluated with a
sweep (RoPE stretched at test time as evaluation arms), checked as eval.sweep when the grid is
planned, recorded in eval.done, and reported as series of their own."""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest

from lengthgen.errors import UserError
from lengthgen.reproduction import grid as grids
from lengthgen.reproduction import planning
from lengthgen.reproduction.jobs import eval_settings
from lengthgen.reproduction.request import ReproduceRequest
from lengthgen.reproduction.runner import reproduce
from tests.helpers.toy_papers import toy_paper, toy_preset

STRETCH = '''
[[evaluate]]
when = {"model.position" = "rope"}
sweep = {"position.scaling" = ["none", "pi", "ntk", "yarn"]}
'''


def grid_text(evaluate: str = STRETCH, seeds: int = 1) -> str:
    return f"""
title = "A toy paper"
seeds = {seeds}
[tasks.copy]
[arms.nope]
set = {{"model.position" = "nope"}}
[arms.rope]
set = {{"model.position" = "rope"}}
{evaluate}
[report]
summary = [2.0]
figures = ["accuracy_vs_length"]
[scales.cpu]
"""


def toy(folder: Path, evaluate: str = STRETCH) -> Path:
    return toy_paper(folder, grid_text(evaluate), {"copy": toy_preset("copy", lengths="2,8", samples=8)})


def planned(folder: Path, evaluate: str = STRETCH) -> dict:
    grid = grids.find(str(toy(folder, evaluate)))
    jobs = planning.plan(grid, ReproduceRequest(scale="cpu", tasks=["copy"], arms=["nope", "rope"], seeds=1,
                                             out=folder / "out", workers=1))
    return {job.arm: job for job in jobs}


def test_the_matching_runs_get_the_sweep_and_eval_done_records_it(tmp_path):
    jobs = planned(tmp_path)
    assert jobs["rope"].sweep == {"position.scaling": ["none", "pi", "ntk", "yarn"]}
    assert jobs["nope"].sweep == {}
    assert eval_settings(jobs["rope"], jobs["rope"].loaded().eval)["sweep"] == jobs["rope"].sweep
    assert "sweep" not in eval_settings(jobs["nope"], jobs["nope"].loaded().eval)  # eval.done of other runs unchanged


def test_an_entry_without_when_evaluates_every_run_and_later_entries_replace_a_key(tmp_path):
    evaluate = STRETCH + '[[evaluate]]\nsweep = {"position.scaling" = ["none"]}\n'
    jobs = planned(tmp_path, evaluate)
    assert jobs["rope"].sweep == jobs["nope"].sweep == {"position.scaling": ["none"]}


@pytest.mark.parametrize("evaluate, needle", [
    ('[[evaluate]]\nwhen = {"model.position" = "rope"}\n', "evaluate[0] needs a sweep"),
    ('[[evaluate]]\nsweep = {"position.scaling" = []}\n', "evaluate[0].sweep.position.scaling must be a non-empty list"),
    ('[[evaluate]]\nsweep = {"position.scaling" = ["pi"]}\nif = 1\n', "unknown key evaluate[0].if"),
    ('[[evaluate]]\nwhen = "rope"\nsweep = {"position.scaling" = ["pi"]}\n', "evaluate[0].when must be a dict"),
    ('[evaluate]\nsweep = {"position.scaling" = ["pi"]}\n', "evaluate must be a list"),
], ids=["no-sweep", "empty-values", "unknown-key", "when-not-a-table", "not-an-array"])
def test_a_bad_entry_is_one_line_when_the_grid_is_read(tmp_path, evaluate, needle):
    with pytest.raises(UserError, match=re.escape(needle)):
        grids.find(str(toy(tmp_path, evaluate)))


@pytest.mark.parametrize("evaluate, needle", [
    ('[[evaluate]]\nwhen = {"model.positon" = "rope"}\nsweep = {"position.scaling" = ["pi"]}\n',
     "evaluate[0].when names 'model.positon', no config key"),
    ('[[evaluate]]\nsweep = {"position.scaling" = ["pi"]}\n', "model.position nope"),  # nope has no RoPE
    ('[[evaluate]]\nwhen = {"model.position" = "rope"}\nsweep = {"position.scaling" = ["rescale"]}\n',
     "'rescale' is unknown; choose from none, pi, ntk, yarn"),
], ids=["unknown-when-key", "not-rotary", "unknown-scaling"])
def test_a_sweep_that_does_not_suit_its_runs_is_refused_when_planned(tmp_path, evaluate, needle):
    with pytest.raises(UserError, match=re.escape(needle)):
        planned(tmp_path, evaluate)


def test_the_lm_and_matrix_grids_evaluate_their_rope_runs_stretched():
    for name in ("lm", "matrix"):
        entries = grids.find(name).pick("cpu").data["evaluate"]
        assert [e["when"] for e in entries] == [{"model.position": "rope"}]
        assert entries[0]["sweep"] == {"position.scaling": ["none", "pi", "ntk", "yarn"]}
    figure, = grids.find("matrix").pick("cpu").data["report"]["figures"]
    assert "position.scaling" in figure["rows"]  # the across-tasks table tells the stretches apart


@pytest.mark.slow
def test_a_reproduction_reports_each_stretch_as_a_series(tmp_path):
    paper, out = toy(tmp_path / "toy"), tmp_path / "out"
    report = reproduce(str(paper), ReproduceRequest(out=out, workers=1, progress=False)).read_text()
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    series = {(r["arm"], r["position.scaling"]) for r in rows}
    assert series == {("nope", "")} | {("rope", s) for s in ("none", "pi", "ntk", "yarn")}
    for s in ("none", "pi", "ntk", "yarn"):
        assert f"rope (scaling={s})" in report
    done = json.loads((out / "runs" / "copy-rope-s0" / "eval.done").read_text())
    assert done["sweep"] == {"position.scaling": ["none", "pi", "ntk", "yarn"]}
