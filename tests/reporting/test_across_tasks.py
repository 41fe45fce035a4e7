"""The matrix section: cells read at a multiple of each series' own training length, ranks and
mean reciprocal rank against a brute-force count, the matrix grid spanning every scheme, and a
toy matrix reproduced and reported end to end."""
from __future__ import annotations

import math
import random

import pytest

from lengthgen.config.schema import parse_lengths
from lengthgen.errors import UserError
from lengthgen.model.positions import SCHEMES
from lengthgen.reporting.across_tasks import cells, mean_reciprocal_rank, ranks, section, separating
from lengthgen.reproduction import grid as grids
from lengthgen.reproduction import planning
from lengthgen.reproduction.request import ReproduceRequest
from lengthgen.reproduction.runner import reproduce
from tests.helpers.toy_papers import toy_paper, toy_preset


def agg_row(task: str, arm: str, position: str, length: int, train_max: int, accuracy: float) -> dict:
    return {"task": task, "arm": arm, "method": "ntp", "position": position, "stop": "", "length": length,
            "train_max": train_max, "accuracy": accuracy, "stderr": 0.01, "seeds": 3, "baseline": 0.5,
            "series": (("arm", arm), ("method", "ntp"), ("position", position), ("stop", ""))}


def brute_ranks(values: dict) -> dict:
    """Rank = 1 + how many rows are strictly better, counted one pair at a time."""
    out = {}
    for k, v in values.items():
        out[k] = 1
        for other in values.values():
            if other > v:
                out[k] += 1
    return out


def test_ranks_and_mean_reciprocal_rank_match_a_brute_force_count():
    rng = random.Random(0)
    for _ in range(50):
        rows = [(f"arm{i}",) for i in range(rng.randint(2, 6))]
        tasks = [f"t{j}" for j in range(rng.randint(1, 4))]
        table = {(r, t): {"accuracy": rng.choice([0.0, 0.25, 0.5, 1.0, rng.random()])}
                 for r in rows for t in tasks if rng.random() < 0.8}
        expected = {}
        for t in tasks:
            values = {r: table[(r, t)]["accuracy"] for r in rows if (r, t) in table}
            assert ranks(values) == brute_ranks(values)
            for r, rank in brute_ranks(values).items():
                expected.setdefault(r, []).append(1 / rank)
        got = mean_reciprocal_rank(table, "accuracy")
        assert got.keys() == expected.keys()
        for r in got:
            assert got[r] == pytest.approx(sum(expected[r]) / len(expected[r]))


def test_a_missing_value_ranks_last_and_ties_share_the_better_rank():
    assert ranks({"a": 1.0, "b": 1.0, "c": 0.5, "d": math.nan}) == {"a": 1, "b": 1, "c": 3, "d": 4}


def test_only_tasks_some_row_learns_order_the_rows(tmp_path):
    """Parity (chance 0.5): rope reaches 0.9, (0.9 - 0.5) / 0.5 = 0.8 of the gap; copy (chance 0.001):
    nothing above 0.05, every rank there is noise, yet it would put nope first by the MRR of
    every task."""
    agg = [agg_row("parity", "plain", "rope", 16, 8, 0.9), agg_row("parity", "plain", "nope", 16, 8, 0.5)]
    for position, accuracy in (("rope", 0.0), ("nope", 0.05)):
        agg.append({**agg_row("copy", "plain", position, 16, 8, accuracy), "baseline": 0.001})
    table = cells(agg, ["arm", "position"], 2.0)
    assert separating(table, "accuracy", 0.1) == ["parity"]
    assert separating(table, "accuracy", 0.04) == ["copy", "parity"]  # 0.05 closes 0.049 of copy's gap
    assert separating(table, "accuracy", 0.81) == []
    lines = section({"rows": ["arm", "position"]}, agg, tmp_path, lambda a, m: f"{a[m]:.2f}" if a else "-")
    rows = [line for line in lines if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert rows[0].startswith("| 1 | plain · rope | 1.000 | 0.750 |")  # first by parity, though both MRRs are 0.75
    assert rows[1].startswith("| 2 | plain · nope | 0.500 | 0.750 |")
    assert any("Left out of it here: copy." in line for line in lines)


def test_cells_read_each_series_at_twice_its_own_training_length():
    agg = [agg_row("parity", "plain", "rope", n, 8, n / 100) for n in (8, 12, 16, 20)]
    agg += [agg_row("parity", "looped", "rope", n, 6, n / 100) for n in (6, 11, 13)]  # 2 x 6 = 12: next is 13
    table = cells(agg, ["arm", "position"], 2.0)
    assert table[(("plain", "rope"), "parity")]["length"] == 16
    assert table[(("looped", "rope"), "parity")]["length"] == 13
    with pytest.raises(UserError, match="do not tell apart"):
        cells(agg, ["position"], 2.0)  # plain and looped fall in one row


def test_the_matrix_grid_spans_every_scheme_both_architectures_and_the_three_papers_tasks(tmp_path):
    grid = grids.find("matrix")
    tasks = {"parity", "copy", "addition", "decimal_addition", "flipflop", "induct", "sparse_parity"}
    assert set(grid.defaults("cpu", "tasks")) == tasks
    for task in tasks:
        assert grid.axes("cpu", task) == {"model.position": list(SCHEMES)}  # a new scheme joins the matrix
    jobs = planning.plan(grid, ReproduceRequest(scale="cpu", tasks=sorted(tasks), arms=["plain", "looped"], seeds=1,
                                             out=tmp_path, workers=2))  # every config validates
    assert len(jobs) == (len(tasks) * 2 - 1) * len(SCHEMES)  # flip-flop: plain only
    methods = {(j.task, j.arm): j.config["method"] for j in jobs}
    assert methods[("parity", "looped")] == "looped" and ("flipflop", "looped") not in methods
    assert {m for (t, a), m in methods.items() if a == "plain"} == {"ntp"}
    for task in tasks:  # every column is read at 2x its training length
        cfg = next(j.config for j in jobs if j.task == task)
        assert max(parse_lengths(cfg["eval"]["lengths"])) >= 2 * cfg["task"]["train_max"]


MATRIX = """
title = "Toy matrix"
seeds = 2
[tasks.parity]
axes = {"model.position" = ["nope", "rope"]}
[tasks.copy]
axes = {"model.position" = ["nope", "rope"]}
[arms.plain]
set = {method = "ntp"}
[arms.looped]
set = {method = "looped"}
stops = ["oracle"]
[report]
summary = [2.0]
figures = [{kind = "across_tasks", at = 2.0, rows = ["arm", "position"]}]
[scales.cpu]
"""


@pytest.mark.slow
def test_a_toy_matrix_is_reproduced_and_ranked(tmp_path):
    preset = toy_preset(train_max=3, steps=10, lengths="1:6", samples=16)
    paper = toy_paper(tmp_path / "toy", MATRIX, {"parity": preset, "copy": preset.replace('"parity"', '"copy"')})
    out = tmp_path / "out"
    reproduce(str(paper), ReproduceRequest(scale="cpu", out=out, workers=2, progress=False))
    text = (out / "report.md").read_text()
    assert "## accuracy at 2× the training length: every arm × position on every task" in text
    assert (out / "across_tasks_accuracy_at_2x.png").is_file()
    table = [line for line in text.splitlines() if line.startswith("| ") and " · " in line and line[2].isdigit()]
    assert len(table) == 4  # plain/looped x nope/rope
    for line in table:
        cells_ = [c.strip() for c in line.strip("|").split("|")]
        assert 0 < float(cells_[3]) <= 1 and all("(2)" in c for c in cells_[4:6])  # MRR, then two seeds per cell


@pytest.mark.parametrize("spec, needle", [({"rows": "arm"}, "rows must be a list"), ({"at": 0}, "at must be a positive"),
                                         ({"separating": 2}, "separating must be a fraction")])
def test_bad_across_tasks_settings_are_one_line_errors(tmp_path, spec, needle):
    from lengthgen.reporting.across_tasks import section
    with pytest.raises(UserError, match=needle):
        section(spec, [agg_row("parity", "plain", "rope", 16, 8, 0.5)], tmp_path, str)
