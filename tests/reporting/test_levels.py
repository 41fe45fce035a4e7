"""The main table of a suite in its published layout (report figure `levels`,
lengthgen.reporting.levels), checked against hand-computed cells."""
from __future__ import annotations

import math

import pytest

from lengthgen.errors import UserError
from lengthgen.reporting.levels import section

ROW = {"method": "encoder", "position": "nope", "stop": "", "n": 64, "stop_step": math.nan,
       "train_max": 4, "baseline": 0.5, "step": 20}


def rows_of(task: str, arm: str, beyond: dict[int, list[float]], **fields) -> list[dict]:
    """A run per seed, its score metric at lengths 4 (training) and 6, 8 (beyond) from `beyond`."""
    out = []
    for seed, values in beyond.items():
        for n, v in zip((4, 6, 8), [1.0, *values]):
            out.append({**ROW, "task": task, "arm": arm, "seed": seed, "length": n, "accuracy": v,
                        "run": f"{task}-{arm}-{seed}", "source": f"{task}-{arm}-{seed}", **fields})
    return out


SPEC = {"kind": "levels", "metric": "accuracy", "groups": {"R": ["parity", "even"], "CS": ["dup"]},
        "columns": ["a", "b"], "best": {"A or B": ["a", "b"]}, "names": {"parity": "Parity"},
        "published": {"source": "Someone (2023), Table 2", "columns": {"Theirs": {"parity": 52.0}}}}


def test_cells_are_the_best_run_then_the_mean_of_the_best_series():
    rows = (rows_of("parity", "a", {0: [0.5, 0.7], 1: [0.9, 0.9]})  # seed scores 0.6, 0.9
            + rows_of("parity", "b", {0: [0.2, 0.2]})
            + rows_of("dup", "a", {0: [1.0, 0.8], 1: [0.4, 0.4]}, **{"optim.lr": 0.001})  # 0.9, 0.4: mean 0.65
            + rows_of("dup", "a", {0: [0.7, 0.7], 1: [0.7, 0.7]}, **{"optim.lr": 0.0003}))  # 0.7, 0.7: mean 0.7
    text = "\n".join(section(SPEC, rows))
    assert "| R | Parity | 90.0 (75.0 ± 15.0, 2) | 20.0 (20.0, 1) | 90.0 (75.0 ± 15.0, 2) |" in text
    # the best run over every lr (0.9); the brackets: the lr with the best mean (0.7, no spread)
    assert "| CS | dup | 90.0 (70.0 ± 0.0, 2) | – | 90.0 (70.0 ± 0.0, 2) |" in text
    assert "|  | mean of the tasks' best | 90.0 (2) | 20.0 (1) | 90.0 (2) |" in text
    assert "even" not in text.split("### Published")[0]  # a task not run has no row
    assert "Someone (2023), Table 2" in text and "| R | Parity | 52.0 |" in text


def test_an_arm_the_columns_do_not_list_gets_a_column_after_them():
    """`reproduce --arms` may run arms the grid's table does not list (new schemes): each gets its
    own column after the listed ones, where it had none (the table was left empty)."""
    rows = rows_of("parity", "z", {0: [0.5, 0.5]}) + rows_of("parity", "c", {0: [0.8, 0.8]})
    text = "\n".join(section(SPEC, rows))
    assert "| level | task | c | z |" in text and "| R | Parity | 80.0 (80.0, 1) | 50.0 (50.0, 1) |" in text
    text = "\n".join(section(SPEC, rows + rows_of("parity", "b", {0: [0.2, 0.2]})))
    assert "| level | task | b | c | z | A or B (best) |" in text  # listed first, then the others


def test_no_task_of_the_table_run_and_a_bad_spec():
    assert "no main table" in section(SPEC, rows_of("other", "a", {0: [1.0, 1.0]}))[0]
    with pytest.raises(UserError, match="groups"):
        section({"kind": "levels"}, [])
