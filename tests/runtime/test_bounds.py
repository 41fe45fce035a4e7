"""Bounded work, refused up front: every count a user gives (stop-rule loops, test samples, seeds,
task sizes, threads, a Ray address) is checked before any work and refused in one line, fast; the
memory bound of training counts attention and names the term that dominates; evaluation lowers its
batch for a length whose batch would not fit (the same accuracy) and refuses one that never fits.
The machine's memory is fixed by monkeypatching `available_memory`, so the tests do not depend on it.
Each case hung, ran out of memory or printed a traceback before (docs/faults.md)."""
from __future__ import annotations

import csv
import signal
import time
from contextlib import contextmanager

import pytest
import torch

from lengthgen.cli import main
from lengthgen.evaluation.evaluate import load_run
from lengthgen.runtime import resources
from tests.helpers.tiny_runs import TINY, one_line_error, train_cli

GIB = 2 ** 30
FAST = 5.0  # seconds: a refusal comes before any work (0.1-0.3 s alone; a shared 2-core machine took 1.3 s)


class StillRunning(Exception):  # not an OSError, which the CLI would print as a file's error
    pass


@contextmanager
def deadline(seconds: int):
    """Fail (instead of hanging the suite) where the old code would run on for minutes."""
    def stop(signum, frame):
        raise StillRunning(f"still running after {seconds} s: not refused up front")
    previous = signal.signal(signal.SIGALRM, stop)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def refused(argv: list[str], capsys, code: int) -> str:
    """The one line `lengthgen argv` is refused with, checking its exit code and that it came fast."""
    capsys.readouterr()
    with deadline(30):
        start = time.perf_counter()
        got = main(argv)
        elapsed = time.perf_counter() - start
    line = one_line_error(capsys)
    assert got == code, line
    assert elapsed < FAST, f"{elapsed:.2f} s: {line}"
    return line


@pytest.fixture
def machine(monkeypatch):
    """A machine of 8 GiB, whatever this one has."""
    monkeypatch.setattr(resources, "available_memory", lambda device: 8 * GIB)


@pytest.mark.parametrize("stop", ["fixed:100000000", "confidence:100000000", "confidence:+100000000"])
def test_loop_counts_of_stop_rules_are_capped(run, capsys, stop):
    line = refused(["eval", str(run), "--stop", stop, "--no-progress"], capsys, 2)
    assert "100,000,000 iterations" in line and "at most" in line


def test_test_samples_past_memory_are_refused(run, capsys, machine):
    line = refused(["eval", str(run), "--samples", "1000000000", "--no-progress"], capsys, 1)
    assert "--samples" in line and "test set of 1,000,000,000 samples" in line


def test_a_length_whose_one_sequence_cannot_fit_is_refused_before_any_length_runs(run, capsys, machine):
    before = (run / "eval.csv").read_bytes()
    line = refused(["eval", str(run), "--lengths", "4,50000", "--samples", "512", "--no-progress"], capsys, 1)
    assert "evaluating length 50,000" in line and "attention" in line and "--lengths" in line
    assert (run / "eval.csv").read_bytes() == before


@pytest.mark.parametrize("where", [["train"], ["eval-sweep"]])
def test_task_size_options_are_capped(tmp_path, capsys, where):
    mult = ["--set=task.name=multiplication", "--set=task.options={max_a_bits=1}"]
    if where == ["train"]:
        argv = ["train", "--defaults", *[f"--set={s}" for s in TINY], mult[0], "--set=task.options.max_a_bits=100000",
                "--out", str(tmp_path / "run"), "--no-progress"]
    else:
        assert train_cli(tmp_path / "run", *mult) == 0
        argv = ["eval", str(tmp_path / "run"), "--sweep", "max_a_bits=[1, 100000]", "--no-progress"]
    line = refused(argv, capsys, 2)
    assert "max_a_bits must be an integer in [1, 64]" in line


@pytest.mark.parametrize("task, option, needle", [
    ("decimal_multiplication", "b_digits=100000", "b_digits must be an integer in [1, 1,000]"),
    ("selective_copy", "blank_ratio=1e9", "blank_ratio (blanks per symbol) must be a number in [0, 100]"),
])
def test_other_size_options_are_capped(tmp_path, capsys, task, option, needle):
    """Past their caps, sampling one batch takes minutes (validation seemed to hang) or every sample
    is blanks by the gigabyte."""
    argv = ["train", "--defaults", *[f"--set={s}" for s in TINY], f"--set=task.name={task}", f"--set=task.options.{option}",
            "--out", str(tmp_path / "run"), "--no-progress"]
    assert needle in refused(argv, capsys, 2)


@pytest.mark.parametrize("flag, value, needle", [
    ("--seeds", "100000000", "--seeds must be in [1, 1,000]"),
    ("--threads", "5000", "--threads must be in [0, 1024]"),
])
def test_reproduce_counts_are_capped(tmp_path, capsys, flag, value, needle):
    out = tmp_path / "out"
    line = refused(["reproduce", "looped", "--tasks", "parity", "--arms", "ntp", flag, value, "--out", str(out),
                    "--no-progress"], capsys, 2)
    assert needle in line and not out.exists()


def test_reproduce_test_samples_past_memory_are_refused_before_any_run(tmp_path, capsys, machine):
    out = tmp_path / "out"
    line = refused(["reproduce", "looped", "--tasks", "parity", "--arms", "ntp", "--seeds", "1", "--samples",
                    "1000000000", "--out", str(out), "--no-progress"], capsys, 1)
    assert "1,000,000,000 test samples" in line and "lower --samples" in line and not out.exists()


@pytest.mark.parametrize("gpus", ["inf", "nan"])
def test_gpus_per_job_must_be_finite(tmp_path, capsys, gpus):
    pytest.importorskip("ray")
    line = refused(["reproduce", "looped", "--tasks", "parity", "--arms", "ntp", "--seeds", "1", "--backend", "ray",
                    "--gpus-per-job", gpus, "--out", str(tmp_path / "out"), "--no-progress"], capsys, 2)
    assert "--gpus-per-job must be a finite number" in line


@pytest.mark.parametrize("address, code, needle", [
    ("127.0.0.1:1", 1, "Cannot reach the Ray cluster at 127.0.0.1:1 (Connection refused)"),
    ("not a url", 2, "--address 'not a url' is not a Ray address"),
    ("", 2, "--address '' is not a Ray address"),
])
def test_a_ray_address_is_checked_and_reached_with_a_timeout(tmp_path, capsys, address, code, needle):
    pytest.importorskip("ray")
    out = tmp_path / "out"
    line = refused(["reproduce", "looped", "--tasks", "parity", "--arms", "ntp", "--seeds", "1", "--backend", "ray",
                    "--address", address, "--out", str(out), "--no-progress"], capsys, code)
    assert needle in line and "a file" not in line and not out.exists()


@pytest.mark.parametrize("setting, needle", [
    ("task.train_max=20000", "lower task.train_max, train.batch_size or model.n_head"),  # attention dominates
    ("model.n_layer=1000000", "lower model.n_layer or model.d_model"),
    ("model.max_positions=1000000000", "lower model.max_positions"),
    ("tests.samples=1000000000", "lower tests.samples"),
    ("eval.samples=1000000000", "lower eval.samples"),
])
def test_the_train_bound_counts_attention_and_names_what_dominates(tmp_path, capsys, machine, setting, needle):
    extra = ["--set=model.position=learned"] if "max_positions" in setting else []
    extra += ["--set=tests.interval=5"] if "tests.samples" in setting else []
    line = refused(["train", "--defaults", *[f"--set={s}" for s in TINY], *extra, f"--set={setting}",
                    "--out", str(tmp_path / "run"), "--no-progress"], capsys, 1)
    assert needle in line and "this run needs at least" in line and not (tmp_path / "run").exists()
    if "train_max" in setting:
        assert "attention" in line


def test_a_finite_training_set_past_memory_names_dataset_size(tmp_path, capsys, machine):
    line = refused(["train", "--defaults", *[f"--set={s}" for s in TINY], "--set=task.train_min=100", "--set=task.train_max=100",
                    "--set=data.dataset_size=100000000", "--out", str(tmp_path / "run"), "--no-progress"], capsys, 1)
    assert "lower data.dataset_size" in line


def accuracy(folder) -> dict:
    with open(folder / "eval.csv") as f:
        return {row["length"]: row["accuracy"] for row in csv.DictReader(f)}


def test_evaluation_lowers_a_batch_that_would_not_fit_to_the_same_accuracy(run, tmp_path, capsys, monkeypatch):
    """An evaluation in batches of 64 under a memory that holds five sequences at length 4: it runs in
    batches of 5, says so in one note, and scores what an evaluation in batches of 5 scores."""
    cfg, task = load_run(run)[:2]
    one = task.sample(1, 4, torch.Generator().manual_seed(0))
    fixed = resources.parameters_at_least(cfg.model, task.vocab_size) * resources.FP32 + 64 * resources.sample_bytes(one)
    per = sum(size for size, _, _ in resources.evaluation_terms(cfg.model, task.vocab_size, one.inputs.shape[1], 1).values())
    args = ["--lengths", "4", "--samples", "64", "--no-progress"]
    assert main(["eval", str(run), *args, "--batch-size", "5", "--out", str(tmp_path / "small")]) == 0
    capsys.readouterr()
    monkeypatch.setattr(resources, "available_memory", lambda device: fixed + 5 * per + per // 2)
    assert main(["eval", str(run), *args, "--batch-size", "64", "--out", str(tmp_path / "lowered")]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: batches lowered")]
    assert len(notes) == 1 and "length 4 in batches of 5" in notes[0], notes
    assert accuracy(tmp_path / "lowered") == accuracy(tmp_path / "small")


# -- tracebacks that are one-line errors now -----------------------------------------------------------------

def test_tasks_with_a_length_or_seed_out_of_range(capsys):
    assert "--length must be in [1, 100,000], got 0" in refused(["tasks", "--length", "0"], capsys, 2)
    line = refused(["tasks", "--seed", "99999999999999999999999"], capsys, 2)
    assert "--seed must be in [0, 2**63)" in line


def test_a_toml_file_nested_100000_deep(tmp_path, capsys):
    for name, text in (("arrays.toml", "a = " + "[" * 100_000 + "]" * 100_000),
                       ("tables.toml", "x = " + "{a = " * 100_000 + "1" + "}" * 100_000)):
        (tmp_path / name).write_text(text + "\n")
        line = refused(["train", str(tmp_path / name), "--out", str(tmp_path / "run"), "--no-progress"], capsys, 2)
        assert "is nested too deeply to read" in line


def test_a_text_corpus_too_small_for_one_window(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("LENGTHGEN_DATA", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(12):
        (corpus / f"d{i}.txt").write_text(f"hi {i}\n")
    capsys.readouterr()
    with deadline(60):  # the corpus is tokenized once, then the refusal is fast
        code = main(["train", "--defaults", "--set=task.name=text", f"--set=task.options={{source = \"files\", path = \"{corpus}\"}}",
                     "--set=task.train_max=64", "--set=train.device=cpu", "--out", str(tmp_path / "run"),
                     "--no-progress"])
    line = one_line_error(capsys)
    assert code == 2 and "asks for windows of 65 tokens" in line and "training split holds" in line


def test_attention_is_counted_where_it_is_held():
    """Bias and content schemes hold batch x heads x tokens^2 weights on every device; plain SDPA's
    fused CUDA kernels do not, so a long CUDA run of RoPE is not refused for weights it never holds."""
    from lengthgen.runtime.resources import attention_held, training_terms

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    from lengthgen.assembly.runs import new_run_config

    rope, alibi = new_run_config(None, ["model.position=rope"]), new_run_config(None, ["model.position=alibi"])
    assert attention_held(rope.model, cpu) and attention_held(alibi.model, cuda) and not attention_held(rope.model, cuda)
    assert training_terms(rope, 10, 1000, cuda)["attention"][0] == 0 < training_terms(rope, 10, 1000, cpu)["attention"][0]
