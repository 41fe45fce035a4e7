"""The Looped Transformers paper presets (experiments/looped/paper/*.toml) against the tables
of docs/looped.md, "Paper presets and the released code": every row's lengthgen key must hold
that value in the loaded preset, and every key a preset sets must have a row. A value changed
in a preset and not in the docs (or the other way round) fails here.

RELEASED below repeats, independently of the docs, the per-task values of the authors' released
configs (looped-tf at commit 33650c3: src/conf/<task>.yaml, src/conf/models/<task>.yaml), and
the released curriculum (src/curriculum.py, src/train.py) is replayed step by step.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from lengthgen.config import schema as config

from lengthgen.assembly.runs import new_run_config
from lengthgen.config.schedules import curriculum_end, curriculum_max, learning_rate
from tests.helpers.preset_tables import doc_section, doc_tables, drift, expected as documented, undocumented

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "looped.md"
PAPER = ROOT / "experiments" / "looped" / "paper"
SECTION = "## Paper presets and the released code"
COMMON = "All six presets"
TASKS = ("parity", "copy", "addition", "binary_sum", "multiplication", "unique_set")
REQUIRED = {  # the settings every paper preset must document, whether it sets them or not
    "method", "task.name", "task.train_min", "task.train_max",
    "model.d_model", "model.n_layer", "model.n_head", "model.position", "model.init", "model.tie_embeddings",
    "train.steps", "train.batch_size", "optim.lr", "optim.weight_decay", "optim.betas", "optim.grad_clip",
    "optim.schedule", "optim.warmup_steps", "optim.min_lr_ratio", "data.curriculum_start",
    "data.curriculum_interval", "data.length_sampling", "optim.ema",
    "eval.lengths", "eval.samples", "eval.batch_size",
}

# task: (block depth, heads, curriculum `end` (exclusive), curriculum `interval`, `test_len`)
RELEASED = {
    "parity": (1, 64, 21, 500, 40),
    "copy": (2, 8, 20, 1000, 30),
    "addition": (3, 8, 20, 1600, 30),
    "binary_sum": (2, 16, 20, 500, 24),  # sum_reverse
    "multiplication": (4, 8, 12, 500, 15),  # multi
    "unique_set": (3, 8, 20, 1000, 30),  # dict
}


def expected(task: str) -> dict:
    """The documented values of one preset: the common table and the task's own."""
    return documented(doc_tables(DOC, SECTION), COMMON, f"experiments/looped/paper/{task}.toml")


def load(task: str):
    return new_run_config(PAPER / f"{task}.toml")


def test_the_docs_have_a_table_for_every_paper_preset_and_a_list_of_the_rest():
    assert sorted(p.stem for p in PAPER.glob("*.toml")) == sorted(TASKS)
    tables = doc_tables(DOC, SECTION)
    assert COMMON in tables
    for task in TASKS:
        expected(task)
    assert len(tables) == len(TASKS) + 1, sorted(tables)
    assert "\n### Still different\n" in doc_section(DOC, SECTION)


@pytest.mark.parametrize("task", TASKS)
def test_the_preset_holds_every_documented_value(task):
    wrong = drift(PAPER / f"{task}.toml", expected(task))
    assert not wrong, f"{task}: " + "; ".join(wrong)


@pytest.mark.parametrize("task", TASKS)
def test_every_key_the_preset_sets_is_documented(task):
    path = PAPER / f"{task}.toml"
    extra = undocumented(path, expected(task))
    assert not extra, f"{path.name} sets undocumented keys {sorted(extra)}"
    assert not REQUIRED - set(expected(task)), f"docs/looped.md lacks {sorted(REQUIRED - set(expected(task)))} for {task}"
    assert 'docs/looped.md, "Paper presets and the released code"' in " ".join(
        line.lstrip("# ") for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#"))


@pytest.mark.parametrize("task", TASKS)
def test_the_preset_keeps_the_released_configuration(task):
    cfg = load(task)
    depth, heads, end, interval, test_len = RELEASED[task]
    assert (cfg.model.d_model, cfg.model.n_layer, cfg.model.n_head) == (256, depth, heads)
    assert (cfg.train.batch_size, cfg.optim.lr, cfg.train.steps, cfg.optim.ema) == (64, 1e-4, 100_001, 0.0)
    assert (cfg.task.train_min, cfg.task.train_max) == (1, end - 1)
    lengths = config.parse_lengths(cfg.eval.lengths)
    assert test_len in lengths and cfg.task.train_max in lengths
    assert (cfg.eval.samples, cfg.eval.batch_size) == (6400, 6400)
    # tests during training: every 1000 steps, 512 samples, at test_len besides the current maximum
    assert (cfg.tests.interval, cfg.tests.samples) == (1000, 512)
    assert config.parse_lengths(cfg.tests.lengths) == [test_len]
    assert cfg.tests.stops == ["oracle", f"confidence:+{30 if task in ('multiplication', 'unique_set') else 20}"]
    assert cfg.tests.offset == 1  # `if (i) % 1000 == 0` after update i + 1: updates 1, 1001, ...
    assert cfg.tests.options == ({"min_a_bits": 2} if task == "multiplication" else {})
    assert cfg.eval.confidence_precision == "float32"  # nn.CrossEntropyLoss on float32 logits
    assert cfg.optim.ema_start == end * interval + 2  # the EMA restart at i == end * interval + 1
    assert cfg.task.options.get("empty_zero", False) is (task == "binary_sum")  # decimal_to_binary(0) == []


@pytest.mark.parametrize("task", TASKS)
def test_the_curriculum_is_the_released_one_step_by_step(task):
    """Curriculum: n_points = min(start + step // interval, end) with start = 2, lengths drawn
    from [1, n_points): the longest is n_points - 1."""
    cfg = load(task)
    _, _, end, interval, _ = RELEASED[task]
    for step in range(0, (end + 2) * interval):
        released = min(2 + step // interval, end) - 1
        assert curriculum_max(cfg, step) == released, (task, step)


@pytest.mark.parametrize("task", TASKS)
def test_the_learning_rate_is_the_released_schedule(task):
    """src/train.py: 1e-4 up to step end * interval, then CosineAnnealingLR(T_max = train_steps -
    end * interval, eta_min = 0), stepped once per step."""
    import math
    cfg = load(task)
    _, _, end, interval, _ = RELEASED[task]
    hold, steps = end * interval, cfg.train.steps
    assert curriculum_end(cfg) < hold  # the curriculum alone would start the decay two intervals early
    for step in [0, hold - 1, hold, hold + 1, (hold + steps) // 2, steps - 1, *range(0, steps, 997)]:
        released = 1e-4 if step <= hold else 1e-4 * 0.5 * (1 + math.cos(math.pi * (step - hold) / (steps - hold)))
        assert math.isclose(learning_rate(cfg, step), released, rel_tol=1e-9, abs_tol=1e-15), (task, step)
