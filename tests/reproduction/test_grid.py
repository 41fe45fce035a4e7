"""Reproductions as data: a toy paper declared in a temporary folder runs end to end with
no code change, its report keeps the axis values apart, and bad grids are one-line errors.
(The import graph and the code's names: tests/test_architecture.py.)"""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

from lengthgen.cli import main
from lengthgen.assembly.runs import GIVEN_IDS_TABLE_STD, new_run_config, reads_given_ids, saved_run_config
from lengthgen.config.schema import read, to_toml
from lengthgen.errors import UserError
from lengthgen.model.positions import SCHEMES
from lengthgen.reporting.series import aggregate, collect
from lengthgen.reproduction import grid as grids
from lengthgen.reproduction import planning
from lengthgen.reproduction.request import ReproduceRequest
from lengthgen.reproduction.runner import reproduce
from tests.helpers.toy_papers import toy_paper, toy_preset

PRESET = toy_preset("multiplication", train_max=3, evaluation="sweep = {max_a_bits = [1, 2]}")

GRID = """
title = "A toy paper"
seeds = 2
[tasks.multiplication]
axes = {"task.options.max_a_bits" = [1, 2]}
[arms.plain]
set = {method = "ntp"}
[arms.rope]
set = {model = {position = "rope"}}
[arms.wide]
default = false
set = {"model.d_model" = 32}
[report]
summary = [2.0]
figures = ["accuracy_vs_length", {kind = "heatmap", y = "max_a_bits"}]
[scales.cpu]
"""


def toy(folder: Path, grid: str = GRID) -> Path:
    return toy_paper(folder, grid, {"multiplication": PRESET})


@pytest.mark.slow
def test_a_toy_paper_runs_end_to_end_and_keeps_axis_values_apart(tmp_path):
    """One worker process: the pool's start is one interpreter and torch import, not two (the
    two-worker pool's end to end runs: tests/reporting/test_across_tasks.py, test_reproduce.py)."""
    paper, out = toy(tmp_path / "toy"), tmp_path / "out"
    report = reproduce(str(paper), ReproduceRequest(out=out, workers=1, progress=False)).read_text()
    runs = sorted(p.name for p in (out / "runs").iterdir())
    assert runs == [f"multiplication-{arm}-max_a_bits={k}-s{s}" for arm in ("plain", "rope") for k in (1, 2)
                    for s in (0, 1)]
    with open(out / "results.csv") as f:
        rows = list(csv.DictReader(f))
    # the arm, the config key telling runs apart (over every declared arm: wide's d_model too,
    # though it did not run), and the option swept in evaluation, each a column of its own
    assert {"arm", "task.options.max_a_bits", "model.d_model", "max_a_bits"} <= set(rows[0])
    assert len(rows) == 8 * 2 * 2  # runs x lengths x swept values
    agg = aggregate(collect([out]))
    assert len(agg) == 2 * 2 * 2 * 2 and {a["seeds"] for a in agg} == {2}  # 2 seeds each: nothing averaged across axes
    assert "plain (task.options.max_a_bits=2, max_a_bits=1)" in report
    assert "rope (task.options.max_a_bits=1, max_a_bits=2)" in report
    assert "2× train max" in report and "1.5×" not in report  # the grid's summary columns
    assert (out / "accuracy_by_length_and_max_a_bits.png").is_file() and (out / "accuracy_vs_length.png").is_file()
    assert f"lengthgen reproduce {paper} --scale cpu --seeds 2 --tasks multiplication --arms plain,rope" in report


def test_labels_do_not_depend_on_which_arms_run(tmp_path):
    grid = grids.find(str(toy(tmp_path / "toy")))
    alone = planning.plan(grid, ReproduceRequest(scale="cpu", tasks=["multiplication"], arms=["plain"], seeds=1,
                                              out=tmp_path / "out", workers=1))
    assert alone[0].labels == {"arm": "plain", "model.d_model": 16, "task.options.max_a_bits": 1}
    wide = planning.plan(grid, ReproduceRequest(scale="cpu", tasks=["multiplication"], arms=["wide"], seeds=1,
                                             out=tmp_path / "out", workers=1))
    assert wide[0].labels["model.d_model"] == 32 and wide[0].folder.endswith("multiplication-wide-max_a_bits=1-s0")
    # a --set that suits only the arms run now (an option of rope) leaves the others out of the labels
    theta = ["model.position_options.theta=500000"]
    rope = planning.plan(grid, ReproduceRequest(scale="cpu", tasks=["multiplication"], arms=["rope"], seeds=1,
                                             out=tmp_path / "out", workers=1, overrides=theta))
    assert rope[0].labels == {"arm": "rope", "task.options.max_a_bits": 1}
    with pytest.raises(UserError, match="not an option of nope"):
        planning.plan(grid, ReproduceRequest(scale="cpu", tasks=["multiplication"], arms=["plain"], seeds=1,
                                          out=tmp_path / "out", workers=1, overrides=theta))


def test_a_task_runs_only_its_own_arms(tmp_path, capsys):
    """`only` limits a task to some arms: the others are neither planned nor labelled against."""
    grid = grids.find(str(toy(tmp_path / "toy", GRID.replace(
        "[tasks.multiplication]\n", "[tasks.multiplication]\nonly = [\"plain\", \"wide\"]\n"))))
    jobs = planning.plan(grid, ReproduceRequest(scale="cpu", tasks=["multiplication"], arms=["plain", "rope"], seeds=1,
                                             out=tmp_path / "out", workers=1))
    assert {job.arm for job in jobs} == {"plain"}
    assert set(jobs[0].labels) == {"arm", "model.d_model", "task.options.max_a_bits"}  # rope's position: no label
    assert "multiplication runs only: plain, wide" in grids.describe(tmp_path)
    bad = toy(tmp_path / "bad", GRID.replace("[tasks.multiplication]\n", "[tasks.multiplication]\nonly = [\"ropes\"]\n"))
    assert main(["reproduce", str(bad), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    assert "tasks.multiplication.only names 'ropes', no arm of [arms]" in capsys.readouterr().err


def test_two_entries_of_one_task_are_told_apart_in_their_labels(tmp_path):
    """Grid entries whose presets name the same registry task share the report's tables: their
    labels must name what differs between the entries, or the report would average them together."""
    folder = toy(tmp_path / "toy", GRID.replace("[arms.plain]", '[tasks.longer]\naxes = {"task.options.max_a_bits" = [1, 2]}\n[arms.plain]'))
    (folder / "cpu" / "longer.toml").write_text(PRESET.replace("steps = 20", "steps = 30"))
    jobs = planning.plan(grids.find(str(folder)), ReproduceRequest(scale="cpu", tasks=["multiplication", "longer"],
                                                                arms=["plain"], seeds=1, out=tmp_path / "out",
                                                                workers=1))
    steps = {job.folder.rsplit("/", 1)[-1]: job.labels.get("train.steps") for job in jobs}
    assert steps == {"multiplication-plain-max_a_bits=1-s0": 20, "multiplication-plain-max_a_bits=2-s0": 20,
                     "longer-plain-max_a_bits=1-s0": 30, "longer-plain-max_a_bits=2-s0": 30}
    alone = planning.plan(grids.find(str(toy(tmp_path / "one"))),
                       ReproduceRequest(scale="cpu", tasks=["multiplication"], arms=["plain"], seeds=1,
                                        out=tmp_path / "o", workers=1))
    assert "train.steps" not in alone[0].labels  # one entry: its steps tell nothing apart


def test_an_empty_options_table_is_no_label():
    """Arms that set scheme options (rope's theta) and arms that leave the table empty differ in
    that option alone; `{}` against a missing key is no difference."""
    grid = grids.find("tra")
    jobs = planning.plan(grid, ReproduceRequest(scale="cpu", tasks=["flipflop"], arms=["nope", "rope"], seeds=1,
                                             out=Path("unused"), workers=1))
    assert jobs[0].labels["model.position_options.theta"] == "" and jobs[1].labels["model.position_options.theta"] == 5e5
    assert not any(key.endswith("_options") for job in jobs for key in job.labels)


def test_list_names_every_paper_with_its_tasks_and_arms(tmp_path, monkeypatch, capsys):
    toy(tmp_path / "experiments" / "toy")
    monkeypatch.setattr(grids, "ROOT", tmp_path / "experiments")
    assert main(["reproduce", "--list"]) == 0
    out = capsys.readouterr().out
    assert "toy: A toy paper" in out and "tasks:  multiplication*" in out
    assert "arms:   plain*, rope*, wide" in out and "axes:   task.options.max_a_bits" in out
    assert main(["reproduce"]) == 2 and "--list" in capsys.readouterr().err


def test_the_papers_are_listed():
    assert {"looped", "tra", "sparsity"} <= set(grids.papers())
    text = grids.describe()
    assert "looped: Looped Transformers" in text and "ntp-pause" in text
    assert "tra: TRA: Threshold Relative Attention" in text and "arms:   nope*, rope*, alibi*, cope*, tra*, randomized*" in text
    assert "sparsity: Sparsity and position coupling" in text and "unique_set runs only: ppc, coupled, rope_pose, nope" in text


def test_the_sparsity_grid_couples_through_a_learned_table_but_multiplication_through_rope_on_cpu():
    """Coupled addition reads its IDs from a learned N(0, 1) table at every scale (Cho et al.'s);
    on CPU, multiplication, whose preset keeps the earlier block, reads them through RoPE; PPC,
    whose ID head names absolute IDs, and the oracle coupling it is measured against keep the
    learned table at every scale."""
    grid = grids.find("sparsity")

    def arms(scale, task):
        jobs = planning.plan(grid, ReproduceRequest(scale=scale, tasks=[task], arms=["ppc", "coupled", "nope"], seeds=1,
                                                 out=Path("unused"), workers=1))
        return {job.arm: dict(s.split("=", 1) for s in job.overrides) for job in jobs}

    for scale in ("cpu", "paper"):
        coupled = arms(scale, "addition")["coupled"]
        assert coupled["model.position"] == '"learned"'
    assert arms("cpu", "multiplication")["coupled"]["model.position"] == '"rope"'
    for scale in ("cpu", "paper"):
        sets = arms(scale, "addition_mixed")
        assert sets["ppc"]["method"] == '"ppc"' and sets["coupled"]["task.options.coupled"] == "true"
        assert sets["ppc"]["model.position"] == sets["coupled"]["model.position"] == '"learned"'
        assert "task.options.coupled" not in sets["nope"]  # the baselines read no coupled IDs
    request = ReproduceRequest(scale="paper", tasks=["sparse_parity"], arms=["rope_pose"], seeds=1, out=Path("unused"),
                               workers=1)
    k_max = {job.labels["task.options.k_max"] for job in planning.plan(grid, request)}
    assert k_max == {4, 6, 8, 10, 12}  # the paper's K_train


def test_every_learned_table_that_reads_given_ids_starts_at_an_init_that_trains():
    """Every arm of every grid at every scale: a learned table that reads coupled or predicted IDs
    starts at N(0, 1) (GIVEN_IDS_TABLE_STD) or wider, never at GPT-2's N(0, 0.02), at which the
    oracle coupling of addition_mixed did not fit 5-digit sums (docs/notes/sparsity.md). Language
    modelling grids read 0..L-1 (no task IDs; their paper-scale corpora are on the hub): not planned."""
    given = set()
    for paper in grids.papers():
        grid = grids.find(paper)
        for scale in grid.scales:
            tasks = list(grid.resolved(scale)["tasks"])
            if any(read(grid.preset(scale, task)).task.name == "text" for task in tasks):
                continue
            for job in planning.plan(grid, ReproduceRequest(scale=scale, tasks=tasks,
                                                         arms=list(grid.resolved(scale)["arms"]), seeds=1,
                                                         out=Path("unused"), workers=1)):
                if not SCHEMES[job.loaded().model.position].trains_table:
                    continue  # the scheme Run.from_checked would build trains no table: no init to check
                run = job.assembled()  # built (a sample drawn per run) only where the answer needs it
                cfg = run.cfg
                if run.scheme.trains_table and reads_given_ids(run):
                    given.add((paper, scale, job.task, job.arm))
                    assert cfg.model.position_options.get("std", 0.02) >= GIVEN_IDS_TABLE_STD, (paper, scale, job.task, job.arm)
    for scale in ("cpu", "paper"):  # the walk reached the arms it guards
        assert {("sparsity", scale, task, arm) for task in ("addition_mixed", "unique_set") for arm in ("ppc", "coupled")} <= given


def test_a_learned_table_reading_given_ids_defaults_to_n01_unless_set_and_a_saved_run_keeps_its_init(tmp_path):
    preset = grids.find("sparsity").preset("cpu", "addition_mixed")  # its table, 0..L-1 unless coupled
    assert new_run_config(preset).model.position_options == {}  # positions 0..L-1: GPT-2's init stays
    coupled = ["task.options.coupled=true", "data.position_transform=random_offset",
               "data.position_transform_options.max_position=40", "data.position_transform_options.keep_zero=true"]
    assert new_run_config(preset, coupled).model.position_options == {"std": GIVEN_IDS_TABLE_STD}
    assert new_run_config(preset, ["method=ppc"] + coupled).model.position_options == {"std": GIVEN_IDS_TABLE_STD}
    assert new_run_config(preset, coupled + ["model.position_options.std=0.02"]).model.position_options == {"std": 0.02}
    saved = tmp_path / "config.toml"  # a run saved before the default: trained at 0.02, and says so
    saved.write_text(to_toml(read(preset, coupled)))
    assert saved_run_config(saved).model.position_options == {}


@pytest.mark.parametrize("change, needle", [
    (("[arms.plain]\nset", "[arms.plain]\nsett"), "unknown key arms.plain.sett (did you mean set?)"),
    (("set = {method = \"ntp\"}", "set = {method = \"ntp\"}\nstops = [\"oracle\"]"), "has no stop rules"),
    (("set = {method = \"ntp\"}", "set = {method = \"ntp\"}\nstops = [\"sometimes\"]"), "arms.plain.stops"),
    (("set = {method = \"ntp\"}", "set = {method = \"looped\"}\nstops = [\"halt\"]"), "reads a halting head"),
    (("[1, 2]}", "[1, \"a/b\"]}"), "cannot name a folder"),
    (("[arms.plain]", "[tasks.multiplication.arms.other]\n[arms.plain]"), "names no arm"),
    (("[tasks.multiplication]", "[tasks.multiplication]\npreset = \"cpu/nothing.toml\""), "does not exist"),
    (("{kind = \"heatmap\", y = \"max_a_bits\"}", "\"pie\""), "unknown report figure 'pie'"),
    (("[scales.cpu]", ""), "declares no scale"),
    (("seeds = 2", "seeds = \"two\""), "seeds must be a int"),
    (("set = {method = \"ntp\"}", "set = {\"model.n_layerz\" = 2}"), "model.n_layerz"),
], ids=["unknown-key", "stops-without-rules", "bad-stop", "halt-without-head", "axis-value", "undeclared-arm", "no-preset", "figure",
        "no-scale", "type", "bad-set"])
def test_bad_grids_are_one_line_errors_before_any_run(tmp_path, change, needle, capsys):
    paper = toy(tmp_path / "toy", GRID.replace(*change))
    assert main(["reproduce", str(paper), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "out").exists()


def test_unknown_paper_scale_task_and_arm(tmp_path, capsys):
    paper = toy(tmp_path / "toy")
    for args, needle in ((["nowhere"], "unknown paper 'nowhere'"), ([str(paper), "--scale", "gpu"], "unknown scale"),
                         ([str(paper), "--tasks", "parity"], "unknown task 'parity'"),
                         ([str(paper), "--arms", "tra"], "unknown arm 'tra'"),
                         ([str(paper), "--arms", "plain", "--methods", "rope"], "another name for --arms")):
        assert main(["reproduce", *args, "--out", str(tmp_path / "out")]) == 2
        assert needle in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_grid_error_names_its_file(tmp_path):
    paper = toy(tmp_path / "toy", GRID.replace("title", "titel"))
    with pytest.raises(UserError, match=r"grid.toml has an unknown key titel \(did you mean title\?\)"):
        grids.find(str(paper))


def test_a_plan_validates_each_config_once_and_its_jobs_carry_them(tmp_path, monkeypatch):
    """One validation per task, arm and axis values (not per seed, nor again in the workers); each
    job's config is what loading its preset with its overrides gives."""
    from lengthgen.assembly import runs
    from lengthgen.config.schema import to_dict

    paper = toy(tmp_path / "toy")
    grid = grids.find(str(paper))
    calls = []
    checked = runs._checked
    monkeypatch.setattr(runs, "_checked", lambda cfg: calls.append(1) or checked(cfg))
    jobs = planning.plan(grid, ReproduceRequest(scale="cpu", tasks=["multiplication"], arms=["plain", "rope"], seeds=2,
                                             out=tmp_path / "out", workers=1))
    declared = len(grid.arms_of("cpu", "multiplication")) * 2  # every declared arm (wide too) x 2 axis values
    assert len(jobs) == 2 * 2 * 2 and len(calls) == declared
    monkeypatch.setattr(runs, "_checked", checked)
    for job in jobs:
        assert job.config == to_dict(new_run_config(job.preset, job.overrides))


def test_a_reproduction_is_planned_once(tmp_path, monkeypatch):
    """Planning the looped paper's default runs at cpu scale (18 configs x 3 seeds) merges and checks each
    scale of the grid once, when the grid is read (276 times when every question re-merged it), and works
    out each declared run's overrides once (a run planned now had them worked out twice: for its labels,
    then for its job)."""
    from collections import Counter

    from lengthgen.reproduction.runner import planned

    merged, overrides = Counter(), Counter()
    merge, override = grids.Grid.merged, grids.AtScale.overrides
    monkeypatch.setattr(grids.Grid, "merged", lambda grid, scale: merged.update([scale]) or merge(grid, scale))
    monkeypatch.setattr(grids.AtScale, "overrides", lambda at, task, arm, values: overrides.update(
        [(task, arm, tuple(values.items()))]) or override(at, task, arm, values))
    plan = planned("looped", ReproduceRequest(scale="cpu", out=tmp_path / "out", workers=1, threads=1))
    assert len(plan.jobs) == 54 and len({(job.task, job.arm) for job in plan.jobs}) == 18
    assert merged == Counter(plan.at.grid.scales)  # cpu and paper, each once
    assert {(job.task, job.arm, ()) for job in plan.jobs} <= set(overrides) and set(overrides.values()) == {1}
    for job in plan.jobs:  # the overrides a job carries are the ones its config was loaded with
        assert job.overrides[:-3] == override(plan.at, job.task, job.arm, {})


def test_an_axis_cut_to_some_values_runs_only_those(tmp_path):
    """--axis model.position=rope,xpos: the matrix's scheme axis at two of its values, every task and arm."""
    grid = grids.find("matrix")
    jobs = planning.plan(grid, ReproduceRequest(scale="cpu", tasks=["parity"], arms=["plain"], seeds=1, out=tmp_path,
                                             workers=1, axes={"model.position": ["rope", "xpos"]}))
    assert sorted(Path(j.folder).name for j in jobs) == ["parity-plain-position=rope-s0", "parity-plain-position=xpos-s0"]
    assert len(planning.plan(grid, ReproduceRequest(scale="cpu", tasks=["parity"], arms=["plain"], seeds=1, out=tmp_path,
                                                 workers=1))) == len(grid.axes("cpu", "parity")["model.position"])
    # a value the grid does not declare joins the axis (a plugin's scheme), checked as any config value
    for axes, said in (({"model.positon": ["rope"]}, "no axis of the tasks chosen"),
                       ({"model.position": ["rope", "yarn"]}, "model.position 'yarn' is unknown"),
                       ({"model.position": ["rope", "a/b"]}, "it names run folders")):
        with pytest.raises(UserError, match=said):
            planning.plan(grid, ReproduceRequest(scale="cpu", tasks=["parity"], arms=["plain"], seeds=1, out=tmp_path,
                                              workers=1, axes=axes))
