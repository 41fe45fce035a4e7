"""Results checked when read: an eval.csv value out of its range, a run whose config cannot be read,
an edited state.json, a deleted `latest` pointer and a CSV with a byte-order mark are each named in
one line or read correctly, never turned silently into numbers (docs/faults.md)."""
from __future__ import annotations

import csv
import json
import math
import shutil

import numpy as np
import pytest

from lengthgen.cli import main
from lengthgen.assembly.runs import new_run_config
from lengthgen.config.schema import to_toml
from lengthgen.errors import UserError
from lengthgen.results.rows import COLUMNS, read_per_step, read_rows, write_csv
from lengthgen.results.token_files import read_dependence, read_token_losses, write_token_losses
from lengthgen.runtime.checkpoint import latest
from tests.helpers.tiny_runs import one_line_error


def edit_eval_csv(path, **values) -> None:
    """Set `values` in the first row of an eval.csv (line 2), as a hand edit would."""
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        rows, header = list(reader), reader.fieldnames
    rows[0].update(values)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)


# -- eval.csv values ----------------------------------------------------------------------------------

@pytest.mark.parametrize("column, value, why", [
    ("accuracy", "7.5", "not between 0 and 1"), ("accuracy", "-0.5", "not between 0 and 1"),
    ("accuracy", "nan", "not a finite number"), ("n", "0", "not positive"),
    ("baseline", "1.5", "not between 0 and 1"), ("stop_step", "-1", "negative"), ("seed", "-1", "negative"),
    ("length", "0", "not positive"), ("length", "-4", "not positive"), ("train_max", "0", "not positive"),
    ("length", "1000000", "above 100,000")])
def test_an_eval_csv_value_out_of_range_is_named_with_file_and_line(copy, tmp_path, capsys, column, value, why):
    path = copy / "eval.csv"
    edit_eval_csv(path, **{column: value})
    assert main(["report", str(copy), "--out", str(tmp_path / "out")]) == 2
    assert one_line_error(capsys) == (f"lengthgen: error: {path} line 2: {column} is {value!r}, {why} "
                                      "(edited or damaged?); move it away and evaluate the run again")
    assert not (tmp_path / "out").exists()


def test_stop_step_is_nan_without_a_stop_rule_and_per_step_values_are_checked(copy, tmp_path):
    assert all(math.isnan(r["stop_step"]) for r in read_rows(copy / "eval.csv"))  # what evaluate.row writes
    path = tmp_path / "per_step.csv"
    path.write_text("run,task,method,arm,position,seed,length,n,iteration,accuracy,confidence,oracle_step,train_max\n"
                    "r,parity,looped,,nope,0,4,8,1,1.25,0.1,2,4\n")
    with pytest.raises(UserError, match=r"per_step.csv line 2: accuracy is '1.25', not between 0 and 1"):
        read_per_step(path)


# -- configs a report cannot read ----------------------------------------------------------------------

def second_seed(run, folder):
    """A copy of `run` as the run of another model seed (its eval.csv's seed column and its config)."""
    shutil.copytree(run, folder)
    rows = read_rows(folder / "eval.csv")
    write_csv(folder / "eval.csv", [{**r, "seed": 1} for r in rows], COLUMNS)
    text = (folder / "config.toml").read_text()
    (folder / "config.toml").write_text(text.replace("model_seed = 0", "model_seed = 1"))
    return folder


def test_a_run_without_config_toml_is_never_averaged_as_a_seed(run, tmp_path, capsys):
    a, b = shutil.copytree(run, tmp_path / "a"), second_seed(run, tmp_path / "b")
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "both")]) == 0
    assert "(2)" in (tmp_path / "both" / "report.md").read_text()  # two seeds of one config
    (b / "config.toml").unlink()
    capsys.readouterr()
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "out")]) == 2
    line = one_line_error(capsys)
    assert line.startswith(f"lengthgen: error: no config.toml in {b}: its rows would be averaged as seeds with "
                           f"those of {a}") and not (tmp_path / "out").exists()
    (a / "config.toml").unlink()  # neither can be checked: still refused
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "out")]) == 2
    assert f"no config.toml in {a}, {b}" in one_line_error(capsys)
    assert main(["report", str(b), "--out", str(tmp_path / "alone")]) == 0  # alone, nothing is averaged


def test_an_empty_config_toml_is_refused(copy, tmp_path, capsys):
    (copy / "config.toml").write_text("\n")
    assert main(["report", str(copy), "--out", str(tmp_path / "out")]) == 2
    line = one_line_error(capsys)
    assert f"{copy / 'config.toml'} is empty" in line and not (tmp_path / "out").exists()


def test_runs_differing_only_in_data_seed_are_two_seeds(tmp_path):
    for data_seed in (0, 1):
        folder = tmp_path / f"d{data_seed}"
        folder.mkdir()
        cfg = new_run_config(None, ["task.name=parity", "task.train_max=4", f"data.seed={data_seed}"])
        (folder / "config.toml").write_text(to_toml(cfg))
        write_csv(folder / "eval.csv", [{"run": folder.name, "task": "parity", "method": "ntp", "position": "nope",
                                         "stop": "", "seed": 0, "length": n, "n": 64, "accuracy": 0.25 + data_seed / 2,
                                         "token_accuracy": 1.0, "stop_step": math.nan, "train_max": 4,
                                         "baseline": 0.5, "step": 20} for n in (2, 4)], COLUMNS)
    assert main(["report", str(tmp_path / "d0"), str(tmp_path / "d1"), "--out", str(tmp_path / "out")]) == 0
    assert "| 4 | 0.500 ± 0.250 (2) | 0.5 |" in (tmp_path / "out" / "report.md").read_text()
    assert {r["data_seed"] for r in read_rows(tmp_path / "out" / "results.csv")} == {"0", "1"}


# -- checkpoints -----------------------------------------------------------------------------------------

def test_an_edited_state_json_is_refused(copy, capsys):
    path = latest(copy) / "state.json"
    state = json.loads(path.read_text())
    assert state["config"]["task"]["train_max"] == 4
    state["config"]["task"]["train_max"] = 5  # a valid config, and every other file's digest still matches
    path.write_text(json.dumps(state, indent=1))
    assert main(["eval", str(copy), "--no-progress"]) == 2
    assert one_line_error(capsys) == (f"lengthgen: error: checkpoint {path} was changed after it was written (its "
                                      "content no longer matches its state_sha256); nothing is loaded from it: undo "
                                      "the edit or restore the file")


def test_a_state_json_written_before_its_own_digest_still_loads(copy, capsys):
    path = latest(copy) / "state.json"
    state = json.loads(path.read_text())
    assert "state_sha256" in state  # written now
    del state["state_sha256"]  # as before 2026-11-27
    path.write_text(json.dumps(state, indent=1))
    assert main(["eval", str(copy), "--no-progress"]) == 0


def test_a_deleted_latest_falls_back_to_the_newest_complete_checkpoint(copy, capsys):
    (copy / "checkpoints" / "latest").unlink()
    assert main(["eval", str(copy), "--no-progress"]) == 0
    note = f"lengthgen: note: {copy / 'checkpoints' / 'latest'} is missing; using the newest complete checkpoint, " \
           "step_00000006"
    assert note in capsys.readouterr().err
    assert main(["train", "--resume", "--out", str(copy), "--no-progress"]) == 0  # not "--force", which deletes it
    assert note in capsys.readouterr().err and (copy / "checkpoints" / "step_00000006" / "state.json").is_file()


# -- encodings -------------------------------------------------------------------------------------------

def test_a_csv_with_a_byte_order_mark_reads(copy, tmp_path):
    path = copy / "eval.csv"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())  # as a spreadsheet saves it
    assert [r["length"] for r in read_rows(path)] == [2, 4]
    assert main(["report", str(copy), "--out", str(tmp_path / "out")]) == 0
    losses = tmp_path / "token_loss.csv"
    write_token_losses(losses, {"document": np.array([0]), "position": np.array([1]), "token": np.array([7]),
                                "loss_8": np.array([0.5])})
    losses.write_bytes(b"\xef\xbb\xbf" + losses.read_bytes())
    assert read_token_losses(losses)["loss_8"].tolist() == [0.5]


@pytest.mark.parametrize("read, name", [(read_token_losses, "token_loss.csv"), (read_dependence, "dependence.csv")])
def test_bytes_that_are_not_utf8_name_their_file(tmp_path, read, name):
    path = tmp_path / name
    path.write_bytes(b"document,position\n\xff\xfe,1\n")
    with pytest.raises(UserError, match=f"{path} line 2 is not text"):
        read(path)


def test_an_input_it_cannot_read_is_not_called_unwritable(tmp_path, monkeypatch):
    """EACCES on a file that exists and cannot be read is an input's fault, not --out's."""
    from lengthgen.runtime import resources

    path = tmp_path / "eval.csv"
    path.write_text("run\n")
    monkeypatch.setattr(resources.os, "access", lambda p, mode: False)
    line = resources.os_error_line(PermissionError(13, "Permission denied", str(path)))
    assert line == f"cannot read {path} (Permission denied): make it readable, or leave it out"


def test_corpus_names_its_cache_folder_not_an_out_it_does_not_have(tmp_path, monkeypatch, capsys):
    from lengthgen.tasks.corpus import Corpus

    def unwritable(self):
        raise PermissionError(13, "Permission denied", str(tmp_path / "cache" / ".train.bin.tmp"))

    monkeypatch.setattr(Corpus, "meta", unwritable)
    assert main(["corpus", "--source", "files", "--path", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert "$LENGTHGEN_DATA" in err and "--out" not in err and len(err.splitlines()) == 1
