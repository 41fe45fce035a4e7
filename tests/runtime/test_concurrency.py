"""One writer per run folder: a second `train`, `--force` or `--resume` on a folder another
process trains stops with one line naming the holder, and evaluations side by side keep every
row. (Two reproductions on one --out: tests/runtime/test_run_folders.py.)"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lengthgen.cli import main
from lengthgen.evaluation import evaluate
from lengthgen.evaluation.settings import EvalSettings
from lengthgen.results.rows import read_rows
from lengthgen.runtime import run_folders
from lengthgen.runtime.run_folders import FolderLock, run_lock
from tests.helpers.tiny_runs import TINY, one_line_error, train_cli


def test_a_train_on_a_held_folder_refuses_before_making_or_deleting_anything(tmp_path, capsys):
    folder = tmp_path / "run"
    with run_lock(folder):  # another train holds it (a lock is per open file: this is a second one)
        assert train_cli(folder) == 2
        err = one_line_error(capsys)
        assert f"pid {os.getpid()}" in err and str(folder) in err
        assert not folder.exists()
    assert train_cli(folder) == 0  # released: the run trains, and its lock file is gone
    assert not (tmp_path / ".run.lock").exists()


@pytest.mark.parametrize("flag", ["--force", "--resume"])
def test_force_and_resume_on_a_held_run_refuse_and_keep_it(tmp_path, capsys, flag):
    folder = tmp_path / "run"
    assert train_cli(folder) == 0
    before = {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    with run_lock(folder):
        code = train_cli(folder, flag) if flag == "--force" else main(["train", flag, "--out", str(folder), "--no-progress"])
        assert code == 2
    assert f"pid {os.getpid()}" in one_line_error(capsys)
    assert {p: p.read_bytes() for p in folder.rglob("*") if p.is_file()} == before


def test_an_eval_waits_for_no_training_of_its_run(run, capsys):
    with run_lock(run):
        assert main(["eval", str(run), "--no-progress"]) == 2
    assert "is in use by" in one_line_error(capsys)


@pytest.mark.slow
def test_a_second_process_cannot_train_or_force_a_folder_a_training_process_holds(tmp_path, capsys):
    """Two real processes: the first trains (long enough to be caught), the second is refused."""
    folder = tmp_path / "run"
    sets = [f"--set={s}" for s in TINY if not s.startswith("train.steps")] + ["--set=train.steps=100000"]
    first = subprocess.Popen([sys.executable, "-m", "lengthgen", "train", "--defaults", *sets, "--out", str(folder), "--no-progress"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (folder / "config.toml").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (folder / "config.toml").exists(), "the first train did not start"
        for flag in ([], ["--force"]):
            assert train_cli(folder, *flag) == 2
            err = one_line_error(capsys)
            assert f"pid {first.pid}: lengthgen train" in err, err
        assert first.poll() is None  # the first still trains, in its own folder
    finally:
        first.kill()
        first.wait()


def test_two_evaluations_of_one_run_side_by_side_keep_every_row(copy, monkeypatch):
    """The second evaluation starts and finishes while the first is measuring: the first's rows are
    merged with the second's, not written over them."""
    measure, inner = evaluate.exact_match, []

    def measure_and_let_another_run(ctx, task, length):
        if not inner:
            inner.append(length)
            assert evaluate.evaluate_run(copy, EvalSettings(lengths=[3], samples=8, progress=False))  # the other, whole
        return measure(ctx, task, length)

    monkeypatch.setitem(evaluate.EVALUATORS, "exact_match", measure_and_let_another_run)
    evaluate.evaluate_run(copy, EvalSettings(lengths=[2, 4], samples=8, progress=False))
    assert {row["length"] for row in read_rows(copy / "eval.csv")} >= {2, 3, 4}
    assert not (copy / ".eval.lock").exists()


def test_an_eval_through_a_symbolic_link_writes_under_the_real_run(copy, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(copy)
    assert main(["eval", str(link), "--lengths", "3", "--samples", "8", "--no-progress"]) == 0
    assert {row["run"] for row in read_rows(copy / "eval.csv")} == {copy.name}
    assert not (tmp_path / ".link.lock").exists() and not (tmp_path / f".{copy.name}.lock").exists()


def test_a_lock_taken_on_a_file_its_holder_removed_is_taken_again(tmp_path, monkeypatch):
    """The holder releases and removes the file between another's open and its lock: that one must
    not hold the removed file (a third would then hold a new one beside it), but take the new one."""
    path = tmp_path / ".x.lock"
    first = FolderLock(path, "x").__enter__()
    real_flock, released = run_folders.fcntl.flock, []

    def release_before_locking(file, operation):
        if not released:
            released.append(True)
            first.__exit__(None, None, None)  # (its own flock calls go to the real one)
        return real_flock(file, operation)

    monkeypatch.setattr(run_folders.fcntl, "flock", release_before_locking)
    with FolderLock(path, "x") as second:
        assert released and os.fstat(second.file.fileno()).st_ino == os.stat(path).st_ino


def test_readers_share_a_run_and_a_writer_waits_for_none_of_them(tmp_path):
    path = tmp_path / ".run.lock"
    with FolderLock(path, "run", shared=True), FolderLock(path, "run", shared=True):
        with pytest.raises(Exception, match="is in use by"):
            FolderLock(path, "run").__enter__()
    with FolderLock(path, "run"):
        pass
    assert not Path(path).exists()
