"""experiments/chomsky: Delétang et al.'s protocol as data (their encoder, optimiser, lengths and
learning-rate grid at paper scale), Ruoss et al.'s randomized arms, the recurrent baselines, the
published numbers the report sets beside the results, and one end-to-end reproduction."""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

from lengthgen.cli import main
from lengthgen.config.schema import from_data, parse_lengths
from lengthgen.methods.registry import METHODS
from lengthgen.reproduction import grid as grids
from lengthgen.reproduction import planning
from lengthgen.reproduction.request import ReproduceRequest
from lengthgen.tasks import TASKS

GRID = grids.find("chomsky")
TRANSFORMER = ["nope", "sin", "relative", "rope", "alibi", "rand-sin", "rand-relative", "rand-rope", "rand-alibi"]
RECURRENT = ["rnn", "lstm", "stack-rnn", "tape-rnn"]
LEVELS = {"R": 4, "DCF": 4, "CS": 7}


@functools.lru_cache(maxsize=None)
def planned(scale: str, arms: tuple[str, ...]) -> list:
    at = GRID.at(scale)
    return planning.plan(GRID, ReproduceRequest(scale=scale, tasks=list(at.data["tasks"]), arms=list(arms), seeds=1,
                                             out=Path("unused"), workers=1))


def jobs(scale: str, arms: list[str]) -> list:
    """The planned runs of these arms (the grid planned once per scale: every config is validated)."""
    every = tuple(a for a in TRANSFORMER + RECURRENT if a in METHODS or a in TRANSFORMER)
    return [job for job in planned(scale, every) if job.arm in arms]


def test_the_suite_is_listed_with_its_fifteen_tasks_and_every_arm():
    assert "chomsky" in grids.papers()
    for scale in ("cpu", "paper"):
        at = GRID.at(scale)
        assert len(at.data["tasks"]) == 15 and set(at.data["tasks"]) <= set(TASKS)
        assert set(at.defaults("arms")) == set(TRANSFORMER + RECURRENT)


@pytest.mark.parametrize("scale", ["cpu", "paper"])
def test_every_transformer_arm_is_their_encoder_under_their_protocol(scale):
    for job in jobs(scale, TRANSFORMER):
        cfg = from_data(job.config)
        m, op, d = cfg.model, cfg.optim, cfg.data
        assert (cfg.method, m.causal, m.d_model, m.n_layer, m.n_head, m.mlp_ratio) == ("encoder", False, 64, 5, 8, 4)
        assert (m.mlp, m.residual, m.dropout, m.qkv_bias) == ("relu", "post-norm", 0.1, False)
        assert (cfg.task.train_min, cfg.task.train_max, d.length_sampling) == (1, 40, "per_batch")
        assert (op.weight_decay, op.grad_clip, op.schedule, op.betas) == (0.0, 1.0, "constant", [0.9, 0.999])
        assert min(parse_lengths(cfg.eval.lengths)) == 41
        randomized = job.arm.startswith("rand-")
        assert (d.position_transform == "randomized") == randomized
        if randomized:  # Ruoss et al.: IDs from 0..2047, drawn at evaluation too
            assert d.position_transform_options == {"max_position": 2048}


def test_the_paper_scale_is_their_budget_and_learning_rate_grid():
    planned = jobs("paper", ["sin"])
    assert GRID.at("paper").data["seeds"] == 10
    assert sorted({from_data(j.config).optim.lr for j in planned}) == [1e-4, 3e-4, 5e-4]
    for job in planned:
        cfg = from_data(job.config)
        assert (cfg.train.steps, cfg.train.batch_size, cfg.eval.samples) == (1_000_000, 128, 512)
        assert parse_lengths(cfg.eval.lengths) == list(range(41, 501))


def test_the_recurrent_arms_read_the_tape_left_to_right():
    registered = [arm for arm in RECURRENT if arm in METHODS]
    if not registered:
        pytest.skip("the recurrent methods are not registered yet")
    for job in jobs("cpu", registered):
        cfg = from_data(job.config)
        assert cfg.method == job.arm and cfg.model.causal and cfg.model.d_model == 256


def test_the_published_table_holds_only_verified_cells_grouped_by_level():
    spec = next(f for f in GRID.at("cpu").data["report"]["figures"] if isinstance(f, dict) and f["kind"] == "levels")
    assert {level: len(tasks) for level, tasks in spec["groups"].items()} == LEVELS
    published = spec["published"]["columns"]
    assert published["Transformer"]["parity_check"] == 52.0 and published["Transformer"]["cycle_navigation"] == 61.9
    assert published["LSTM"]["stack_manipulation"] == 59.1 and published["Tape-RNN"]["binary_addition"] == 100.0
    unverified = ["even_pairs", "modular_arithmetic_brackets", "solve_equation", "binary_multiplication",
                  "compute_sqrt", "bucket_sort"]  # every cell of these rows is a recollection in the reference
    assert not any(task in column for column in published.values() for task in unverified)
    assert set(spec["columns"]) == set(TRANSFORMER + RECURRENT)


@pytest.mark.slow
def test_a_reproduction_runs_end_to_end_and_reports_the_main_table(tmp_path):
    out = tmp_path / "out"
    args = ["reproduce", "chomsky", "--scale", "cpu", "--tasks", "parity_check,reverse_string", "--arms",
            "nope,rand-alibi", "--seeds", "1", "--samples", "8", "--set", "train.steps=6",
            "--set", "eval.lengths=41,45", "--out", str(out), "--no-progress", "--workers", "1"]
    assert main(args) == 0
    report = (out / "report.md").read_text()
    assert "## Main table: tasks by level" in report and "| R | Parity Check |" in report
    assert "| DCF | Reverse String |" in report and "### Published" in report
    assert "Delétang et al. (ICLR 2023), Table 2" in report


def test_the_randomized_comparisons_are_kept_where_both_arms_run_with_two_seeds(tmp_path):
    from lengthgen.reproduction.runner import planned as plan_of

    def compared(arms: str, seeds: int) -> list:
        plan = plan_of("chomsky", ReproduceRequest(scale="cpu", seeds=seeds, tasks=["parity_check"],
                                                   arms=arms.split(","), out=tmp_path / "o", workers=1, threads=1))
        return plan.layout["compare"]

    assert compared("rand-sin,sin,rope", 3) == [["rand-sin", "sin"]]
    assert compared("rand-sin,sin,rope", 1) == []  # a test needs 2 seeds of each
    assert compared("nope,lstm", 3) == []
    report = GRID.at("cpu").data["report"]
    assert (report["score"], report["threshold"]) == ("chomsky_accuracy", 0.9) and len(report["compare"]) == 4
