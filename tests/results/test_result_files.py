"""The result files read back as they were written, with no registry: a row names its own
metrics, files from before a column existed still read, damaged files are named."""
from __future__ import annotations

import csv

import numpy as np
import pytest

from lengthgen.errors import UserError
from lengthgen.results.metrics_log import read_metrics
from lengthgen.results.rows import COLUMNS, metric_names, own_metrics, read_rows, write_rows
from lengthgen.results.token_files import read_dependence, read_token_losses, write_dependence, write_token_losses


def a_row(length: int, **extra) -> dict:
    return {"run": "r", "task": "made_up", "method": "made_up_too", "arm": "", "position": "rope", "stop": "",
            "seed": 0, "length": length, "n": 8, "accuracy": 0.5, "token_accuracy": 0.75, "stop_step": float("nan"),
            "train_max": 4, "baseline": 0.25, "step": 10, **extra}


def test_a_row_names_its_own_metrics_and_they_read_back_as_numbers(tmp_path):
    path = tmp_path / "eval.csv"
    write_rows(path, [a_row(n, metrics="errors misses", errors=n / 2, misses=1.0, k="3") for n in (2, 4)])
    rows = read_rows(path)
    assert [r["errors"] for r in rows] == [1.0, 2.0] and rows[0]["misses"] == 1.0
    assert own_metrics(rows[0]) == ("errors", "misses")
    assert metric_names(rows[0])[-2:] == ("errors", "misses") and "k" not in metric_names(rows[0])
    assert rows[0]["k"] == "3"  # a swept option stays text: it tells series apart, it is not measured


def test_a_damaged_own_metric_is_named_with_its_line(tmp_path):
    path = tmp_path / "eval.csv"
    write_rows(path, [a_row(2, metrics="errors", errors="oops")])
    with pytest.raises(UserError, match="line 2: errors is 'oops'"):
        read_rows(path)


def test_an_eval_csv_from_before_rows_named_their_metrics_still_reads(tmp_path):
    path = tmp_path / "eval.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=[c for c in COLUMNS if c != "metrics"] + ["glitch_rate", "p_ignore"])
        writer.writeheader()
        writer.writerow({**a_row(2), "glitch_rate": "0.125", "p_ignore": "0.8"})
    row, = read_rows(path)
    assert own_metrics(row) == ("glitch_rate",) and row["glitch_rate"] == 0.125 and row["p_ignore"] == "0.8"


def test_the_training_log_drops_an_unfinished_last_line_and_names_a_damaged_one(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.0}\n{"step": 3, "lo')
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    assert "unfinished last line 3" in capsys.readouterr().err
    path.write_text('{"step": 1}\nnot json\n{"step": 3}\n')
    with pytest.raises(UserError, match="line 2 is not valid JSON"):
        read_metrics(path)
    assert [r["step"] for r in read_metrics(path, skip_damaged=True)] == [1, 3]
    assert read_metrics(tmp_path / "absent.jsonl") == []


def test_per_token_files_round_trip_and_name_a_damaged_line(tmp_path):
    losses = {"document": np.array([0, 0, 1]), "position": np.array([5, 6, 5]), "token": np.array([7, 8, 9]),
              "loss_16": np.array([1.5, 2.25, 0.5]), "loss_64": np.array([1.0, 2.0, 0.25])}
    write_token_losses(tmp_path / "token_loss.csv", losses)
    back = read_token_losses(tmp_path / "token_loss.csv")
    assert list(back) == list(losses) and all(np.array_equal(back[k], losses[k]) for k in losses)
    assert back["document"].dtype == np.int64
    rows = [{"document": 0, "position": 6, "token": 8, "delta": 0.25, "in_tau": True, "in_top": False, "k": 2,
             "recovery": 0.9, "far": [3, 1], "k_random": 5}]
    write_dependence(tmp_path / "dependence.csv", rows)
    assert read_dependence(tmp_path / "dependence.csv") == rows
    (tmp_path / "dependence.csv").write_text((tmp_path / "dependence.csv").read_text().replace(",2,", ",two,"))
    with pytest.raises(ValueError, match="line 2 is damaged"):
        read_dependence(tmp_path / "dependence.csv")


def test_a_metric_written_before_its_name_changed_meaning_is_read_as_what_it_holds(tmp_path):
    """Until 2026-11-29 `chomsky_accuracy` was the per-sequence mean; now it is the authors' pooled
    score. An older row is read as the per-sequence score, never as the pooled one, and its run
    counts as not yet evaluated, so a reproduction evaluates it again."""
    from lengthgen.results.rows import outdated

    old, new = tmp_path / "old.csv", tmp_path / "new.csv"
    write_rows(old, [a_row(4, metrics="chomsky_accuracy", chomsky_accuracy=0.73)])
    write_rows(new, [a_row(4, metrics="chomsky_accuracy chomsky_accuracy_per_sequence", chomsky_accuracy=0.677,
                           chomsky_accuracy_per_sequence=0.73)])
    [row] = read_rows(old)
    assert "chomsky_accuracy" not in row and row["chomsky_accuracy_per_sequence"] == 0.73
    assert own_metrics(row) == ("chomsky_accuracy_per_sequence",) and outdated(old)
    [row] = read_rows(new)
    assert (row["chomsky_accuracy"], row["chomsky_accuracy_per_sequence"]) == (0.677, 0.73) and not outdated(new)
    write_rows(old, [a_row(2, metrics="chomsky_accuracy chomsky_accuracy_per_sequence", chomsky_accuracy=0.5,
                           chomsky_accuracy_per_sequence=0.5)])  # evaluated again at another length
    assert [(r["length"], r["chomsky_accuracy"]) for r in read_rows(old)] == [(2, 0.5)] and not outdated(old)
