"""Files damaged on disk (replaced by garbage, truncated, bytes flipped, NUL bytes, pointers
leading elsewhere): each is named in one line and nothing finished is lost (docs/faults.md)."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from lengthgen.cli import main
from lengthgen.results.rows import read_rows
from lengthgen.runtime.checkpoint import latest
from tests.helpers.tiny_runs import one_line_error


# -- damaged files ------------------------------------------------------------------------------------

def garbage(path: Path) -> None:
    path.write_bytes(bytes(random.Random(path.name).randrange(256) for _ in range(300)))


def flip(path: Path, at: int) -> None:
    data = bytearray(path.read_bytes())
    data[at % len(data)] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["garbage", "truncated", "nul"])
def test_a_damaged_eval_csv_is_named_with_its_line(copy, capsys, damage):
    path = copy / "eval.csv"
    text = path.read_bytes()
    {"garbage": lambda: garbage(path), "truncated": lambda: path.write_bytes(text[:-7]),
     "nul": lambda: path.write_bytes(text.replace(b",", b"\0", 1))}[damage]()
    assert main(["report", str(copy)]) == 2
    line = one_line_error(capsys)
    assert str(path) in line and ("line" in line or "truncated" in line)


def test_a_damaged_metrics_log_is_skipped_with_a_note_by_curves_and_resume(copy, capsys):
    path = copy / "metrics.jsonl"
    lines = path.read_text().splitlines()
    path.write_bytes(b"\x8f\x00garbage\n" + "\n".join(lines).encode() + b"\n")
    assert main(["report", str(copy), "--curves"]) == 0
    err = capsys.readouterr().err
    assert f"skipped 1 damaged line(s) of {path} (first: line 1)" in err and (copy / "training_curves.png").is_file()
    assert err.count("skipped") == 1  # read once per report
    garbage(path)
    assert main(["train", "--resume", "--out", str(copy), "--no-progress"]) == 0  # the checkpoint is what resumes
    assert f"of {path}" in capsys.readouterr().err  # a note naming the file, no error


def test_a_damaged_results_csv_is_named_and_never_overwritten(run, tmp_path, capsys):
    out = tmp_path / "report"
    assert main(["report", str(run), "--out", str(out)]) == 0
    written = (out / "results.csv").read_bytes()
    garbage(out / "results.csv")
    damaged = (out / "results.csv").read_bytes()
    assert main(["report", str(run), "--out", str(out)]) == 2
    line = one_line_error(capsys)
    assert str(out / "results.csv") in line and "move it away" in line
    assert (out / "results.csv").read_bytes() == damaged
    (out / "results.csv").unlink()
    assert main(["report", str(run), "--out", str(out)]) == 0
    assert (out / "results.csv").read_bytes() == written


def test_a_damaged_config_is_named_by_the_report_and_the_checkpoint_still_serves(copy, capsys):
    garbage(copy / "config.toml")
    assert main(["report", str(copy)]) == 2
    assert str(copy / "config.toml") in one_line_error(capsys)
    assert main(["eval", str(copy), "--no-progress"]) == 0  # the checkpoint holds the config too
    assert [r["length"] for r in read_rows(copy / "eval.csv")] == [2, 4]


@pytest.mark.parametrize("file, damage", [("state.json", "garbage"), ("state.json", "flip"),
                                          ("model.safetensors", "flip"), ("optimizer.pt", "flip")])
def test_a_damaged_checkpoint_file_is_named(copy, capsys, file, damage):
    path = latest(copy) / file
    garbage(path) if damage == "garbage" else flip(path, 200)
    command = ["train", "--resume", "--out", str(copy)] if file == "optimizer.pt" else ["eval", str(copy)]
    assert main([*command, "--no-progress"]) == 2
    assert str(path) in one_line_error(capsys)


@pytest.mark.parametrize("pointer", ["../../../etc", "/etc", "step_0000006", "garbage"])
def test_a_latest_pointer_never_leads_outside_its_run(copy, capsys, pointer):
    path = copy / "checkpoints" / "latest"
    garbage(path) if pointer == "garbage" else path.write_text(pointer)
    assert latest(copy) == copy / "checkpoints" / "step_00000006"
    assert "is damaged; using the newest complete checkpoint, step_00000006" in capsys.readouterr().err


def test_a_latest_pointer_through_a_link_reads_only_a_step_name(copy, tmp_path, capsys):
    outside = tmp_path / "outside"
    (outside / "step_00000006").mkdir(parents=True)  # a look-alike checkpoint outside the run
    (copy / "checkpoints" / "latest").unlink()
    (copy / "checkpoints" / "latest").symlink_to(tmp_path / "elsewhere")
    (tmp_path / "elsewhere").write_text(str(outside / "step_00000006"))
    assert latest(copy) == copy / "checkpoints" / "step_00000006"


def test_a_pointer_to_a_missing_checkpoint_is_one_line(copy, capsys):
    (copy / "checkpoints" / "latest").write_text("step_00000099")
    assert main(["eval", str(copy), "--no-progress"]) == 2
    assert "step_00000099" in one_line_error(capsys)
