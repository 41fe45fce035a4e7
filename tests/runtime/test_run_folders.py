"""Nothing deleted, nothing mixed: --force removes only lengthgen runs, report never averages two
configs as seeds, a damaged corpus cache is caught, a run stopped before its first checkpoint
can be continued, and shared folders (file modes, eval --out, a lock on reproduce) are safe."""
from __future__ import annotations

import math
import os
import stat

import pytest
import torch
from safetensors.torch import load_file

from lengthgen.evaluation import evaluate

from lengthgen.assembly.runs import new_run_config

from lengthgen.cli import main
from lengthgen.config.schema import to_toml
from lengthgen.results.rows import COLUMNS, LABELS, read_rows, write_csv
from lengthgen.reproduction import runner as rp
from lengthgen.runtime.run_folders import UNSTARTED, OutLock, foreign
from lengthgen.tasks import corpus as corpora
from lengthgen.tasks.corpus import Corpus, CorpusError
from lengthgen.training import trackers
from lengthgen.training.trainer import train
from tests.helpers.tiny_runs import one_line_error, tiny, train_cli, tree


# -- --force -----------------------------------------------------------------------------------

def test_force_refuses_a_folder_holding_other_files_and_deletes_nothing(tmp_path, capsys):
    folder = tmp_path / "thesis"
    (folder / "data").mkdir(parents=True)
    (folder / "thesis.tex").write_text("\\documentclass{article}\n")
    (folder / "data" / "table.csv").write_text("a,b\n1,2\n")
    before = tree(folder)
    assert train_cli(folder, "--force") == 2
    err = one_line_error(capsys)
    assert str(folder) in err and "data" in err and "only a lengthgen run" in err
    assert tree(folder) == before
    # a run folder someone added a file of their own to is refused too
    train(tiny(), tmp_path / "run", progress=False)
    (tmp_path / "run" / "notes.md").write_text("mine\n")
    assert train_cli(tmp_path / "run", "--force") == 2
    assert "notes.md" in one_line_error(capsys) and (tmp_path / "run" / "notes.md").is_file()
    # a folder that only looks like a run: config.toml of another tool
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.toml").write_text('[server]\nport = 80\n')
    assert train_cli(tmp_path / "other", "--force") == 2
    assert "is not a lengthgen config" in one_line_error(capsys) and (tmp_path / "other" / "config.toml").is_file()


def test_force_refuses_the_current_folder_and_its_parents(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    train(tiny(), run, progress=False)  # a real run: only the rule about the current folder refuses it
    before = tree(tmp_path)
    monkeypatch.chdir(run)
    assert train_cli(".", "--force") == 2
    assert "current folder" in one_line_error(capsys)
    monkeypatch.chdir(run / "checkpoints")
    assert train_cli("..", "--force") == 2
    assert "current folder or holds it" in one_line_error(capsys)
    assert tree(tmp_path) == before


def test_force_replaces_a_lengthgen_run(tmp_path):
    run = tmp_path / "run"
    train(tiny(), run, progress=False)
    (run / "eval.csv").write_text("old\n")
    (run / "accuracy_vs_length.png").write_bytes(b"png")
    assert foreign(run) is None
    assert train_cli(run, "--force") == 0
    assert not (run / "eval.csv").exists() and (run / "checkpoints" / "latest").is_file()


# -- report: configs are never seeds ------------------------------------------------------------

ROW = {"task": "parity", "method": "ntp", "position": "nope", "stop": "", "n": 64, "token_accuracy": 1.0,
       "stop_step": math.nan, "train_max": 4, "baseline": 0.5, "step": 20}


def write_run(folder, seed, accuracy, *sets: str):
    folder.mkdir(parents=True)
    cfg = new_run_config(None, ["task.name=parity", "task.train_max=4", f"train.model_seed={seed}",
                                f"data.seed={seed}", *sets])
    (folder / "config.toml").write_text(to_toml(cfg))
    write_csv(folder / "eval.csv", [{**ROW, "run": folder.name, "seed": seed, "length": n, "accuracy": accuracy}
                                    for n in (2, 4, 8)], COLUMNS)


@pytest.mark.parametrize("seeds", [(1, 0), (0, 0)])
def test_report_never_averages_two_learning_rates_as_seeds(tmp_path, seeds):
    write_run(tmp_path / "a", seeds[0], 0.0, "optim.lr=0.01", "train.steps=20")
    write_run(tmp_path / "b", seeds[1], 0.266, "optim.lr=0.001", "train.steps=600")
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "out")]) == 0
    rows = read_rows(tmp_path / "out" / "results.csv")
    assert {(r["optim.lr"], r["train.steps"]) for r in rows} == {("0.01", "20"), ("0.001", "600")}
    report = (tmp_path / "out" / "report.md").read_text()
    assert "(2)" not in report and "0.133" not in report  # never one series of both
    assert "lr=0.01" in report and "lr=0.001" in report


def test_report_still_averages_seeds_of_one_config(tmp_path):
    write_run(tmp_path / "a", 0, 0.2, "train.threads=1", "eval.samples=64")  # how it ran: not the config
    write_run(tmp_path / "b", 1, 0.4, "train.threads=2")
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "out")]) == 0
    assert "0.300 ± 0.100 (2)" in (tmp_path / "out" / "report.md").read_text()


@pytest.mark.slow
def test_report_and_reproduce_do_not_overwrite_files_they_did_not_write(tmp_path, capsys):
    write_run(tmp_path / "a", 0, 0.2)
    out = tmp_path / "project"
    out.mkdir()
    (out / "report.md").write_text("# my own report\n")
    assert main(["report", str(tmp_path / "a"), "--out", str(out)]) == 2
    assert "report.md is not one lengthgen wrote" in one_line_error(capsys)
    assert (out / "report.md").read_text() == "# my own report\n" and not (out / "results.csv").exists()
    assert main(["reproduce", "looped", "--out", str(out), "--no-progress"]) == 2
    assert "report.md is not one lengthgen wrote" in one_line_error(capsys)
    assert main(["report", str(tmp_path / "a")]) == 0  # its own report, written twice
    assert main(["report", str(tmp_path / "a")]) == 0


# -- damaged caches ---------------------------------------------------------------------------------

@pytest.fixture
def docs(tmp_path, monkeypatch):
    monkeypatch.setenv("LENGTHGEN_DATA", str(tmp_path / "cache"))
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(40):
        (folder / f"doc{i:02d}.txt").write_text(f"document {i} " * 50 + "\n")
    return folder


def test_a_truncated_token_file_is_detected_and_rebuilt(docs, capsys):
    corpus = Corpus("files", str(docs))
    whole = corpus.tokens("train").tolist()
    path = corpus.tokens_folder() / "train.bin"
    with open(path, "r+b") as f:
        f.truncate(1000)
    corpora.CHECKED.clear()  # as a new process finds it
    assert Corpus("files", str(docs)).tokens("train").tolist() == whole
    assert str(path) in capsys.readouterr().err
    # a flipped byte of the same length too
    data = bytearray(path.read_bytes())
    data[10] ^= 1
    path.write_bytes(bytes(data))
    corpora.CHECKED.clear()
    assert Corpus("files", str(docs)).tokens("train").tolist() == whole


def test_a_damaged_cache_whose_documents_are_gone_stops_naming_the_file(docs):
    corpus = Corpus("files", str(docs))
    corpus.tokens("train")
    path = corpus.tokens_folder() / "test.bin"
    with open(path, "r+b") as f:
        f.truncate(10)
    corpora.CHECKED.clear()
    key = corpus.key()
    for file in docs.iterdir():  # the documents are gone, but the folder (and so the cache's key) is the same
        file.unlink()
    corpus.key = lambda: key
    with pytest.raises(CorpusError, match=f"{path}.*truncated"):
        corpus.tokens("test")


# -- continuing a run stopped before its first checkpoint -------------------------------------------

def test_resume_without_a_checkpoint_trains_the_same_weights_as_a_fresh_run(tmp_path, capsys):
    fresh, stopped = tmp_path / "fresh", tmp_path / "stopped"
    assert train_cli(fresh) == 0
    stopped.mkdir()  # what a run killed before its first checkpoint leaves
    (stopped / "config.toml").write_text((fresh / "config.toml").read_text())
    (stopped / "metrics.jsonl").write_text('{"step": 5, "loss": 1.0}\n{"step"')
    (stopped / "checkpoints" / ".step_00000006.tmp").mkdir(parents=True)
    assert train_cli(stopped) == 2  # without --resume: the message says what --resume does
    assert "use --resume to train it from step 0" in one_line_error(capsys)
    assert main(["train", "--resume", "--out", str(stopped), "--no-progress"]) == 0
    assert "from step 0 with its saved config" in capsys.readouterr().err
    a = load_file(fresh / "checkpoints" / "step_00000006" / "model.safetensors")
    b = load_file(stopped / "checkpoints" / "step_00000006" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [line.split(",")[0] for line in (stopped / "metrics.jsonl").read_text().splitlines()] == \
        [line.split(",")[0] for line in (fresh / "metrics.jsonl").read_text().splitlines()]


def test_resume_refuses_a_folder_without_a_run_or_with_results(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["train", "--resume", "--out", str(tmp_path / "empty"), "--no-progress"]) == 2
    assert "holds no run" in one_line_error(capsys)
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "config.toml").write_text(to_toml(tiny()))
    (kept / "eval.csv").write_text("results\n")  # checkpoints pruned, results kept
    assert main(["train", "--resume", "--out", str(kept), "--no-progress"]) == 2
    assert "eval.csv" in one_line_error(capsys) and (kept / "eval.csv").read_text() == "results\n"


def test_unstarted_names_what_a_stopped_training_writes():
    assert {"config.toml", "metrics.jsonl", "checkpoints", LABELS, *trackers.FOLDERS} == UNSTARTED


# -- shared filesystems ---------------------------------------------------------------------------------

def test_weights_have_the_mode_of_every_other_file(tmp_path):
    train(tiny(), tmp_path / "run", progress=False)
    files = [p for p in (tmp_path / "run").rglob("*") if p.is_file()]
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in files}
    assert "model.safetensors" in modes and len(set(modes.values())) == 1, modes


def test_eval_writes_into_out_and_refuses_an_unwritable_folder_before_evaluating(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    train(tiny(), run, progress=False)
    out = tmp_path / "mine"
    assert main(["eval", str(run), "--out", str(out), "--no-progress"]) == 0
    assert not (run / "eval.csv").exists() and [r["length"] for r in read_rows(out / "eval.csv")] == [2, 4]
    assert (out / "config.toml").read_bytes() == (run / "config.toml").read_bytes()  # the report reads it
    assert main(["report", str(out)]) == 0
    assert main(["eval", str(run), "--out", str(tmp_path), "--no-progress"]) == 2  # a folder of other files
    assert "give a new or empty folder" in one_line_error(capsys)

    def unwritable(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    def evaluated(*args, **kwargs):
        raise AssertionError("evaluated before checking that the results can be written")

    monkeypatch.setattr("lengthgen.runtime.run_folders.tempfile.TemporaryFile", unwritable)
    monkeypatch.setattr(evaluate, "rules_at", evaluated)
    assert main(["eval", str(run), "--no-progress"]) == 1  # the machine's fault: exit 1, as every command's
    err = one_line_error(capsys)
    assert str(run) in err and "Permission denied" in err and "--out" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_eval_of_a_read_only_run_is_refused_before_evaluating(tmp_path, capsys):
    run = tmp_path / "run"
    train(tiny(), run, progress=False)
    run.chmod(0o555)
    try:
        assert main(["eval", str(run), "--no-progress"]) == 1
        assert "--out" in one_line_error(capsys)
    finally:
        run.chmod(0o755)


def test_a_second_reproduce_on_a_locked_out_stops_with_one_line(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setattr(rp, "run_all", lambda *a, **k: pytest.fail("trained under another's lock"))
    with OutLock(out):  # another reproduction holds it (a lock is per open file: this is a second one)
        assert main(["reproduce", "looped", "--tasks", "parity", "--out", str(out), "--no-progress"]) == 2
    err = one_line_error(capsys)
    assert f"pid {os.getpid()}" in err and str(out) in err and "another --out" in err
    assert not (out / "runs").exists()
