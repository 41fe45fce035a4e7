"""The coupling paper presets (experiments/sparsity/paper/addition.toml, multiplication.toml) with the
grid's coupled arm at paper scale, against the tables of docs/sparsity.md, "Paper presets and Cho
et al.'s code": every row's value held, every key the preset or the arm sets documented.

RELEASED repeats, independently of the docs, the per-task values of Cho et al.'s released scripts
(HanseulJo/position-coupling at b9cad94), and their learning-rate schedule (custom_cosine,
src/training/optimization.py) is replayed step by step against lengthgen's."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from lengthgen.config import schema as config

from lengthgen.reproduction import grid

from lengthgen.assembly.runs import new_run_config
from lengthgen.config.schedules import learning_rate
from tests.helpers.preset_tables import doc_section, doc_tables, drift, expected, undocumented

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "sparsity.md"
SECTION = "## Paper presets and Cho et al.'s code"
COMMON = "Both presets"
TASKS = ("addition", "multiplication")
REQUIRED = {  # every setting the released code fixes, whether the preset or the arm sets it or not
    "method", "task.name", "task.train_min", "task.train_max", "task.options.coupled", "task.options.bos",
    "task.options.eos", "model.d_model", "model.n_layer", "model.n_head", "model.mlp", "model.mlp_ratio",
    "model.norm", "model.residual", "model.attn_scale", "model.bias", "model.head_bias", "model.embed_bias",
    "model.init", "model.tie_embeddings", "model.scaled_head", "model.position", "model.position_options.std",
    "model.max_positions", "model.dropout", "model.attn_dropout", "model.mlp_dropout", "model.embed_dropout",
    "train.steps", "train.batch_size", "data.dataset_size", "optim.lr", "optim.betas", "optim.weight_decay",
    "optim.grad_clip", "optim.schedule", "optim.warmup_steps", "optim.min_lr_ratio", "data.curriculum_start",
    "data.length_sampling", "train.precision", "data.position_transform",
    "data.position_transform_options.max_position", "data.position_transform_options.keep_zero",
    "eval.lengths", "eval.samples"}

# task: (longest training operand, layers, heads, width, training samples, max position), from
# scripts/addition/run_coupling.sh (maxpos from eval_coupling.sh) and scripts/Nx2multiplication/run_coupling.sh
RELEASED = {"addition": (30, 1, 4, 1024, 100_000, 202), "multiplication": (40, 2, 8, 1024, 1_000_000, 203)}


def arm(task: str) -> list[str]:
    sparsity = grid.find("sparsity")
    return grid.arm_overrides(sparsity, "paper", task, "coupled", {})


def path(task: str) -> Path:
    return ROOT / "experiments" / "sparsity" / "paper" / f"{task}.toml"


def documented(task: str) -> dict:
    return expected(doc_tables(DOC, SECTION), COMMON, f"experiments/sparsity/paper/{task}.toml")


def test_every_coupling_preset_has_a_table_and_the_rest_is_listed():
    assert len(doc_tables(DOC, SECTION)) == len(TASKS) + 1
    assert "\n### Still different\n" in doc_section(DOC, SECTION)
    assert grid.find("sparsity").preset("paper", "addition").resolve() == path("addition").resolve()


@pytest.mark.parametrize("task", TASKS)
def test_the_preset_and_arm_hold_every_documented_value_and_document_every_key(task):
    table = documented(task)
    wrong = drift(path(task), table, arm(task))
    assert not wrong, f"{task}: " + "; ".join(wrong)
    armed = {key.split("=", 1)[0] for key in arm(task)}
    extra = (undocumented(path(task), table) | armed) - set(table)
    assert not extra, f"{task}: the preset or the coupled arm sets undocumented keys {sorted(extra)}"
    assert not REQUIRED - set(table), f"docs/sparsity.md lacks {sorted(REQUIRED - set(table))} for {task}"
    assert "docs/sparsity.md, \"Paper presets and Cho et al.'s code\"" in " ".join(
        line.lstrip("# ") for line in path(task).read_text(encoding="utf-8").splitlines() if line.startswith("#"))


@pytest.mark.parametrize("task", TASKS)
def test_the_released_values(task):
    cfg = new_run_config(path(task), arm(task))
    longest, layers, heads, width, samples, max_position = RELEASED[task]
    assert (cfg.task.train_max, cfg.model.n_layer, cfg.model.n_head, cfg.model.d_model) == (longest, layers, heads, width)
    assert cfg.data.dataset_size == samples and cfg.model.mlp_ratio * cfg.model.d_model == 2048
    assert cfg.data.position_transform_options["max_position"] == max_position < cfg.model.max_positions
    values = config.flat(config.to_dict(cfg))
    assert values["model.position_options.std"] == 1.0 and values["optim.betas"] == [0.9, 0.95]


def custom_cosine(step: int, steps: int = 50_000, warmup_ratio: float = 0.01, min_lr_ratio: float = 0.1) -> float:
    """Their LambdaLR factor at `step`, written from src/training/optimization.py."""
    warmup = int(warmup_ratio * steps)
    if step < warmup:
        return step / max(1, warmup)
    progress = (step - warmup) / max(1, steps - warmup)
    return max(min_lr_ratio, min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


@pytest.mark.parametrize("task", TASKS)
def test_the_schedule_is_theirs(task):
    """Equal from the end of the warm-up on; within one step's rise during it (theirs starts at 0)."""
    cfg = new_run_config(path(task), arm(task))
    for step in range(0, cfg.train.steps, 7):
        ours, theirs = learning_rate(cfg, step), cfg.optim.lr * custom_cosine(step)
        if step >= cfg.optim.warmup_steps:
            assert ours == pytest.approx(theirs, rel=1e-9, abs=1e-15), step
        else:
            assert 0 < ours - theirs <= cfg.optim.lr / cfg.optim.warmup_steps + 1e-15, step
