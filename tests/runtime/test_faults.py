"""Fault injection: the machine failing under lengthgen and its files damaged on disk, made to
happen for real. Memory runs out under an address-space limit on a subprocess, the disk fills up
in a small tmpfs (where mounting is permitted) and under a file-size limit, folders cannot be
written under permission bits (as root, with the two capabilities that bypass them dropped), files
are damaged (tests/runtime/test_damaged_files.py) and processes killed at random points
(tests/runtime/test_kills.py). Each test checks what the user sees (a non-zero exit, one line, no traceback) and what is
kept (the run resumes, or the command reruns, to the numbers of an undisturbed one).
docs/faults.md tabulates every fault tried here."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from lengthgen.cli import main
from lengthgen.runtime.checkpoint import latest
from lengthgen.runtime.run_folders import unstarted
from tests.helpers.limited_calls import calls, permission_bits_bind
from tests.helpers.tiny_runs import TINY, error_lines, one_line_error, train_cli, tree

GIB = 2 ** 30
def failed_in_one_line(result: tuple[object, str]) -> str:
    code, err = result
    lines = error_lines(err)
    assert code not in (0, "traceback") and "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def weights(run: Path, step: int) -> dict:
    return load_file(run / "checkpoints" / f"step_{step:08d}" / "model.safetensors")


def same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


# -- memory -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("setting, names", [
    ("train.batch_size=100000000", "train.batch_size"),
    ("model.d_model=1000000", "model.d_model"),
    ("task.options={symbols=100000000}", "symbols"),
], ids=["batch", "width", "vocabulary"])
def test_sizes_past_the_machine_are_refused_before_anything_is_written(tmp_path, capsys, setting, names):
    extra = ["--set=task.name=unique_set"] if "symbols" in setting else []
    assert train_cli(tmp_path / "run", *extra, f"--set={setting}") != 0
    assert names in one_line_error(capsys) and not (tmp_path / "run").exists()


def test_a_reproduction_past_the_machine_is_refused_before_its_first_run(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["reproduce", "looped", "--tasks", "parity", "--arms", "ntp", "--seeds", "1", "--out", str(out),
                 "--set", "train.batch_size=100000000", "--no-progress"]) == 1
    assert "train.batch_size" in one_line_error(capsys) and not out.exists()


@pytest.mark.slow
def test_out_of_memory_in_training_and_evaluation_is_one_line_and_nothing_is_lost(run, tmp_path):
    """Under a 1.5 GiB address space (torch needs about 0.65 of it), a batch of 4,096 copies of
    length 100 does not fit; its size passes the up-front check, so the allocator fails for real.
    An evaluation batch of 16,384 is lowered to what the memory bound allows (a note: batches of
    about 3,900); the bound is a lower bound, so the lowered batch may still fail for real: either
    way one line, and the earlier rows are kept. The test set is 4,096 samples: more than one
    lowered batch, and a quarter of the evaluation that 16,384 samples would cost."""
    big = [f"--set={s}" for s in TINY + ["task.train_min=100", "task.train_max=100", "train.batch_size=4096",
                                         "train.steps=1", "train.threads=1"]]
    shutil.copytree(run, tmp_path / "run")
    before = (tmp_path / "run" / "eval.csv").read_bytes()
    trained, evaluated = calls([["train", "--defaults", *big, "--out", "oom", "--no-progress"],
                                ["eval", "run", "--lengths", "100", "--samples", "4096", "--batch-size", "16384",
                                 "--no-progress"]], tmp_path, memory=3 * GIB // 2)
    line = failed_in_one_line(trained)
    assert "out of memory at step 1" in line and "train.batch_size" in line and "no checkpoint" in line
    code, err = evaluated
    assert "note: batches lowered to fit the cpu's 1.5 GiB (asked 16,384" in err and "Traceback" not in err, err
    if code == 0:  # the lowered batch fitted: the new row joins the earlier ones
        rows = (tmp_path / "run" / "eval.csv").read_text()
        assert all(line in rows for line in before.decode().splitlines()[1:]) and ",100," in rows
    else:
        line = failed_in_one_line(evaluated)
        assert "out of memory evaluating length 100" in line and "--batch-size" in line
        assert (tmp_path / "run" / "eval.csv").read_bytes() == before  # the earlier evaluation is kept
    # the stopped run is one `train --resume` continues from step 0 with its saved config (that
    # this trains a fresh run's weights: tests/runtime/test_run_folders.py)
    assert unstarted(tmp_path / "oom") and (tmp_path / "oom" / "config.toml").is_file()


# -- a full disk ------------------------------------------------------------------------------------------

@pytest.fixture
def small_disk(tmp_path):
    """A 300 KiB tmpfs: one checkpoint of the model below fits, two do not."""
    folder = tmp_path / "disk"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=300k", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip("mounting a tmpfs is not permitted here (the file-size-limit test covers a full disk)")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def test_a_full_disk_keeps_the_last_complete_checkpoint_and_the_run_resumes(small_disk, tmp_path, capsys):
    sets = ["--set=model.d_model=32", "--set=train.steps=40", "--set=train.checkpoint_interval=10"]
    run = small_disk / "run"
    assert train_cli(run, *sets) == 1
    line = one_line_error(capsys)
    assert "no space left" in line and "checkpoint step 20 needs about" in line and "free" in line
    assert "step_00000010, stays latest" in line
    assert latest(run).name == "step_00000010"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_00000010"]  # no half-written one
    # evaluation and a report need room too: one line each, and the files they would replace are kept
    assert main(["eval", str(run), "--no-progress"]) == 0
    evaluated = (run / "eval.csv").read_bytes()
    filler = small_disk / "filler"
    try:
        with open(filler, "wb", buffering=0) as f:
            while True:
                f.write(b"\0" * 4096)
    except OSError:  # the disk is full
        pass
    assert main(["eval", str(run), "--lengths", "2,3,4", "--no-progress"]) == 1
    assert "no space left" in one_line_error(capsys) and (run / "eval.csv").read_bytes() == evaluated
    assert main(["report", str(run)]) == 1
    assert "no space left" in one_line_error(capsys)
    # with room again, the run goes on from step 10 to the weights of an undisturbed run
    filler.unlink()
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)
    assert main(["train", "--resume", "--out", str(run), "--no-progress"]) == 0
    assert train_cli(tmp_path / "undisturbed", *sets) == 0
    assert same_weights(weights(run, 40), weights(tmp_path / "undisturbed", 40))


@pytest.mark.slow
def test_a_file_size_limit_stops_writes_in_one_line_and_the_run_resumes(run, tmp_path):
    """Under an 8 KiB file-size limit the first checkpoint (weights of about 40 KiB)
    cannot be written, nor can a figure of a report."""
    sets = [f"--set={s}" for s in TINY + ["model.d_model=32", "train.steps=10", "train.checkpoint_interval=5"]]
    shutil.copytree(run, tmp_path / "run")
    trained, reported = calls([["train", "--defaults", *sets, "--out", "stopped", "--no-progress"], ["report", "run"]],
                              tmp_path, file_size=8 * 1024)
    line = failed_in_one_line(trained)
    assert "(File too large)" in line and "no checkpoint had been written" in line
    assert "File too large" in failed_in_one_line(reported)
    assert not any(p.name.endswith(".tmp") for p in (tmp_path / "stopped").rglob("*"))
    assert main(["train", "--resume", "--out", str(tmp_path / "stopped"), "--no-progress"]) == 0
    assert main(["train", "--defaults", *sets, "--out", str(tmp_path / "undisturbed"), "--no-progress"]) == 0
    assert same_weights(weights(tmp_path / "stopped", 10), weights(tmp_path / "undisturbed", 10))


# -- folders it cannot write ----------------------------------------------------------------------------

@pytest.mark.slow
def test_folders_it_cannot_write_are_named_before_any_work(run, tmp_path):
    if not permission_bits_bind(tmp_path):
        pytest.skip("permission bits do not stop this user's writes")
    shutil.copytree(run, tmp_path / "run")
    (tmp_path / "locked").mkdir()
    for folder in (tmp_path / "run", tmp_path / "locked"):
        for path in (folder, *folder.rglob("*")):
            path.chmod(0o555 if path.is_dir() else 0o444)
    before = tree(tmp_path)
    try:
        results = calls([["train", "--defaults", *[f"--set={s}" for s in TINY], "--out", "locked/new", "--no-progress"],
                         ["eval", "run", "--no-progress"],
                         ["report", "run"],
                         ["report", "run", "--out", "locked/report"],
                         ["report", "run", "--curves", "--out", "locked/report"],
                         ["reproduce", "looped", "--tasks", "parity", "--arms", "ntp", "--seeds", "1",
                          "--out", "locked/reproduction", "--no-progress"]], tmp_path, unprivileged=True)
        for result, path in zip(results, ["locked/new", "run", "run", "locked/report", "locked/report",
                                          "locked/reproduction"]):
            line = failed_in_one_line(result)
            assert path in line and "Permission denied" in line and "--out" in line, line
        assert {code for code, _ in results} == {1}  # the same fault, the same exit code from every command
        assert tree(tmp_path) == before  # nothing written, nothing removed
    finally:
        for path in tmp_path.rglob("*"):
            path.chmod(0o755 if path.is_dir() else 0o644)
