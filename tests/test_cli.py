"""The command line: tasks, train, eval, report, and one-line errors on bad input."""
from __future__ import annotations

import csv
import math
import shutil
import subprocess
import sys

import pytest
import torch

from lengthgen.cli import main
from lengthgen.tasks import TASKS

TINY = ["--set=model.d_model=16", "--set=model.n_layer=1", "--set=model.n_head=2", "--set=task.name=parity",
        "--set=task.train_max=4", "--set=train.batch_size=8", "--set=train.steps=20", "--set=train.device=cpu"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lengthgen", *args], capture_output=True, text=True)


def test_tasks_lists_every_task(capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.strip()]
    assert [line.split()[0] for line in lines] == list(TASKS)  # one line per registered task, in order


@pytest.mark.slow
def test_unknown_key_exits_2_with_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    result = run_cli("train", "experiments/core/copy-ntp.toml", "--set", "model.no_such_key=1", "--out", str(out))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "model.no_such_key" in lines[0] and "Traceback" not in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("args, needle", [
    (["train", "missing.toml"], "does not exist"),
    (["train", "--defaults", "--set=model.n_head=3"], "model.n_head"),
    (["train", "--set=model.n_head=2"], "name a preset"),
    (["train", "--defaults", "--set=task.name=sorting"], "task.name"),
    (["eval", "no/such/run"], "does not exist"),
    (["eval", "no/such/run", "--batch-size", "-5"], "--batch-size must be >= 1"),  # not an accuracy of 0
    (["report", "no/such/dir"], "does not exist"),
    (["reproduce", "looped", "--threads", "-1", "--out", "no/such/out"], "--threads >= 0"),
])
def test_bad_input_is_one_line_exit_2(args, needle, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the relative paths above resolve here
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0]
    assert not list(tmp_path.iterdir())  # nothing written: not even the parent of a folder that is not there


def test_train_eval_report_round_trip(tmp_path, capsys):
    runs = tmp_path / "runs"
    for seed in (0, 1):
        folder = runs / f"s{seed}"
        assert main(["train", "--defaults", *TINY, f"--set=train.model_seed={seed}", "--out", str(folder), "--no-progress"]) == 0
        assert (folder / "config.toml").is_file()
        assert main(["eval", str(folder), "--lengths", "2:6:2", "--samples", "64", "--no-progress"]) == 0
    # an existing run folder is refused without --force
    assert main(["train", "--defaults", *TINY, "--out", str(runs / "s0"), "--no-progress"]) == 2
    # re-evaluating other lengths keeps the earlier rows
    assert main(["eval", str(runs / "s0"), "--lengths", "7", "--samples", "32", "--no-progress"]) == 0
    with open(runs / "s0" / "eval.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["length"]) for r in rows] == [2, 4, 6, 7]
    assert {"run", "task", "method", "seed", "length", "n", "accuracy", "token_accuracy"} <= set(rows[0])
    assert main(["report", str(runs), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert (tmp_path / "report" / "accuracy_vs_length.png").stat().st_size > 10_000
    # every number in the table is the mean ± standard error of the CSV rows
    with open(runs / "s1" / "eval.csv") as f:
        other = {int(r["length"]): float(r["accuracy"]) for r in csv.DictReader(f)}
    for r in rows[:3]:
        n, a, b = int(r["length"]), float(r["accuracy"]), other[int(r["length"])]
        mean, err = (a + b) / 2, abs(a - b) / 2  # two seeds: sd / sqrt(2) = |a - b| / 2
        name = f"**{n}**" if n > 4 else f"{n}"
        assert f"| {name} | {mean:.3f} ± {err:.3f} (2) | 0.5 |" in report
    assert "| **7** | " in report and "(1)" in report  # one seed at length 7: no error bar


def test_corrupt_checkpoint_is_a_clear_error(tmp_path, capsys):
    folder = tmp_path / "run"
    assert main(["train", "--defaults", *TINY, "--out", str(folder), "--no-progress"]) == 0
    latest = folder / "checkpoints" / (folder / "checkpoints" / "latest").read_text()
    weights = latest / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    assert main(["eval", str(folder), "--lengths", "3", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "corrupt" in err[0]
    shutil.rmtree(latest)
    assert main(["eval", str(folder), "--no-progress"]) == 2
    assert "missing" in capsys.readouterr().err


def test_report_statistics():
    from lengthgen.reporting.series import aggregate, mean_stderr

    mean, err = mean_stderr([0.2, 0.4, 0.9])
    assert mean == pytest.approx(0.5)
    assert err == pytest.approx(math.sqrt(((0.3**2 + 0.1**2 + 0.4**2) / 2) / 3))
    base = {"task": "copy", "method": "ntp", "position": "nope", "stop": "", "n": 10, "token_accuracy": 1.0,
            "train_max": 5, "baseline": 0.1, "step": 1}
    rows = [{**base, "seed": s, "length": n, "accuracy": a} for s, n, a in
            [(1, 9, 0.0), (0, 3, 1.0), (1, 3, 0.5), (0, 9, 0.2)]]
    agg = {a["length"]: a for a in aggregate(rows)}
    assert agg[3]["accuracy"] == pytest.approx(0.75) and agg[3]["seeds"] == 2
    assert agg[9]["accuracy"] == pytest.approx(0.1) and agg[9]["stderr"] == pytest.approx(0.1)
    from lengthgen.errors import UserError
    with pytest.raises(UserError, match="several rows for one seed"):
        aggregate(rows + rows[:1])


def test_report_summary_picks_lengths_at_multiples_of_train_max():
    from lengthgen.reporting.report import summary
    from lengthgen.reporting.series import aggregate, at_multiple

    assert at_multiple([4, 7, 8, 10, 12], 5, 1.5) == 8 and at_multiple([4, 7, 8, 10, 12], 5, 2) == 10
    assert at_multiple([4, 7], 5, 2) is None
    base = {"task": "copy", "method": "ntp", "position": "nope", "stop": "", "n": 10, "token_accuracy": 1.0,
            "train_max": 4, "baseline": 0.1, "step": 1}
    rows = [{**base, "seed": s, "length": n, "accuracy": a} for s, n, a in
            [(0, 4, 1.0), (0, 6, 0.6), (1, 6, 0.4), (0, 8, 0.3), (1, 8, 0.1), (0, 9, 0.0)]]
    text = summary(aggregate(rows))
    assert "| copy | ntp | 0.500 ± 0.100 (2) @6 | 0.200 ± 0.100 (2) @8 | 0.1 / 0.1 |" in text
    assert summary(aggregate([r for r in rows if r["length"] < 8])).endswith("@6 | – | 0.1 |\n")


def test_plot_gives_each_series_one_colour_in_every_panel():
    from lengthgen.reporting.series import aggregate, series_colors

    base = {"task": "copy", "arm": "", "position": "nope", "stop": "", "seed": 0, "length": 4, "n": 8,
            "accuracy": 1.0, "token_accuracy": 1.0, "stop_step": 1.0, "train_max": 4, "baseline": 0.5, "step": 1}
    rows = [{**base, "task": t, "method": m} for t in ("copy", "parity") for m in ("ntp", "looped")]
    rows += [{**base, "task": "parity", "method": "looped", "stop": "confidence"}]
    agg = aggregate(rows)
    colors = series_colors(agg)
    assert len(colors) == 3 and len(set(colors.values())) == 3  # one key per series, not per panel
    assert series_colors(agg[::-1]) == colors  # independent of the row order
    # split into panels by a swept option, one task's series lose that column and the other's keep
    # it empty: different keys, one legend name per arm, so one colour per arm
    from lengthgen.reporting.figures import split_panels

    arms, _ = split_panels(aggregate([{**base, "task": t, "method": "ntp", "arm": arm, "k": k}
                                      for t, k in (("copy", ""), ("parity", "3")) for arm in ("a", "b")]), "k", {})
    assert len({a["series"] for a in arms}) == 4
    by_arm = {"a": set(), "b": set()}
    for a in arms:
        by_arm[dict(a["series"])["arm"]].add(series_colors(arms)[a["series"]])
    assert all(len(c) == 1 for c in by_arm.values()) and by_arm["a"] != by_arm["b"]


def test_eval_stop_rules_and_per_step(tmp_path, capsys):
    looped = tmp_path / "looped"
    assert main(["train", "--defaults", *TINY, "--set=method=looped", "--out", str(looped), "--no-progress"]) == 0
    assert main(["eval", str(looped), "--lengths", "3,5", "--samples", "16", "--stop", "fixed:2", "--no-progress"]) == 0
    assert main(["eval", str(looped), "--lengths", "3,5", "--samples", "16", "--per-step", "--no-progress"]) == 0
    with open(looped / "eval.csv") as f:
        rows = {(r["stop"], int(r["length"])): r for r in csv.DictReader(f)}
    assert float(rows[("fixed:2", 5)]["stop_step"]) == 2.0
    assert float(rows[("oracle", 5)]["stop_step"]) == 5.0  # parity: T(n) = n
    with open(looped / "per_step.csv") as f:
        steps = [r for r in csv.DictReader(f) if r["length"] == "5"]
    assert [int(r["iteration"]) for r in steps] == list(range(1, 11))  # up to 2 T(n)
    # the per-step accuracy at T(n) is the oracle accuracy on the same test samples
    assert float(steps[4]["accuracy"]) == pytest.approx(float(rows[("oracle", 5)]["accuracy"]))
    # several rules share one pass and give what each gives alone
    assert main(["eval", str(looped), "--lengths", "3,5", "--samples", "16", "--stop", "confidence-per-sample",
                 "--no-progress"]) == 0
    with open(looped / "eval.csv") as f:
        alone = {(r["stop"], int(r["length"])): r for r in csv.DictReader(f)}
    assert main(["eval", str(looped), "--lengths", "3,5", "--samples", "16", "--stop",
                 "fixed:2,confidence-per-sample,oracle", "--no-progress"]) == 0
    with open(looped / "eval.csv") as f:
        shared = {(r["stop"], int(r["length"])): r for r in csv.DictReader(f)}
    for key in (("fixed:2", 5), ("oracle", 3), ("confidence-per-sample", 5)):
        before = rows.get(key) or alone[key]
        assert (shared[key]["accuracy"], shared[key]["stop_step"]) == (before["accuracy"], before["stop_step"])
    capsys.readouterr()
    assert main(["eval", str(looped), "--stop", "sometimes", "--no-progress"]) == 2
    assert "stop rule 'sometimes'" in capsys.readouterr().err
    ntp = tmp_path / "ntp"
    assert main(["train", "--defaults", *TINY, "--out", str(ntp), "--no-progress"]) == 0
    assert main(["eval", str(ntp), "--stop", "oracle", "--no-progress"]) == 2
    assert "methods with stop rules" in capsys.readouterr().err
    # the CLI checks its options against the run, before evaluating
    assert main(["eval", str(ntp), "--lengths", "2", "--per-step", "--no-progress"]) == 2
    assert f"--per-step applies to methods with stop rules (looped); {ntp} was trained with method 'ntp'" in \
        capsys.readouterr().err
    assert main(["eval", str(ntp), "--position-draws", "2", "--no-progress"]) == 2
    assert "--position-draws 2 applies to runs whose position transform draws IDs at evaluation" in \
        capsys.readouterr().err
    assert not (ntp / "eval.csv").exists()


def test_test_set_does_not_depend_on_the_eval_batch_size(tmp_path):
    from lengthgen.evaluation.evaluate import eval_batches
    from lengthgen.tasks import Batch, get_task

    task = get_task("multiplication")  # widths differ between samples, so batches pad differently
    sets = [Batch.concat(list(eval_batches(task, 5, 600, bs, 0, torch.device("cpu")))) for bs in (256, 7, 100, 1000)]
    for other in sets[1:]:
        assert all(torch.equal(getattr(sets[0], k), getattr(other, k)) for k in ("inputs", "targets", "n_steps"))
    run = tmp_path / "mult"
    assert main(["train", "--defaults", *TINY, "--set=task.name=multiplication", "--set=method=looped", "--out", str(run),
                 "--no-progress"]) == 0
    accuracies = []
    for bs in ("7", "256", "1000"):
        assert main(["eval", str(run), "--lengths", "5", "--samples", "300", "--batch-size", bs, "--no-progress"]) == 0
        with open(run / "eval.csv") as f:
            (row,) = list(csv.DictReader(f))
        accuracies.append((float(row["accuracy"]), float(row["token_accuracy"])))
    for other in accuracies[1:]:  # the same samples; float sums may only differ in their last bits
        assert other == pytest.approx(accuracies[0], rel=1e-6)


@pytest.fixture
def tiny_run(tmp_path):
    folder = tmp_path / "run"
    assert main(["train", "--defaults", *TINY, "--out", str(folder), "--no-progress"]) == 0
    return folder


def eval_rows(folder) -> list[dict]:
    with open(folder / "eval.csv") as f:
        return list(csv.DictReader(f))


def test_eval_gives_a_repeated_length_one_row(tiny_run):
    assert main(["eval", str(tiny_run), "--lengths", "4,4,2", "--samples", "16", "--no-progress"]) == 0
    assert [r["length"] for r in eval_rows(tiny_run)] == ["2", "4"]


def test_eval_csv_keeps_only_rows_of_the_evaluated_checkpoint(tiny_run, capsys):
    assert main(["eval", str(tiny_run), "--lengths", "2,4", "--samples", "16", "--no-progress"]) == 0
    rows = eval_rows(tiny_run)
    step = rows[0]["step"]
    rows[0]["step"] = "7"  # as if length 2 had been evaluated before training resumed
    with open(tiny_run / "eval.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    capsys.readouterr()
    assert main(["eval", str(tiny_run), "--lengths", "6", "--samples", "16", "--no-progress"]) == 0
    assert [(r["length"], r["step"]) for r in eval_rows(tiny_run)] == [("4", step), ("6", step)]
    assert "dropped 1 row(s)" in capsys.readouterr().err


def test_eval_refuses_an_unreadable_eval_csv_before_evaluating(tiny_run, capsys, monkeypatch):
    import lengthgen.evaluation.evaluate as evaluate

    (tiny_run / "eval.csv").write_text(",".join(evaluate.COLUMNS) + "\nrun,parity,ntp\n")
    monkeypatch.setattr(evaluate, "rules_at", lambda *a, **k: pytest.fail("evaluated before reading eval.csv"))
    assert main(["eval", str(tiny_run), "--lengths", "2", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(tiny_run / "eval.csv") in err[0]
    assert (tiny_run / "eval.csv").read_text().endswith("\nrun,parity,ntp\n")  # left as it was


def test_eval_seed_out_of_range_is_refused(tiny_run, capsys):
    assert main(["eval", str(tiny_run), "--lengths", "2", "--seed", str(2**62), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--seed" in err[0]
    assert not (tiny_run / "eval.csv").exists()


def test_eval_of_a_file_says_it_is_a_file(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a run")
    assert main(["eval", str(tmp_path / "notes.txt"), "--lengths", "2", "--no-progress"]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err


def test_a_reader_that_leaves_early_gets_silence_not_an_error():
    """`lengthgen tasks | head -0`: a broken pipe ends the command quietly (128 + SIGPIPE), as for ls."""
    proc = subprocess.Popen([sys.executable, "-m", "lengthgen", "tasks"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before the first line is written
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 141 and err == b"", err


def test_reproduce_with_failed_runs_prints_the_others_report_and_exits_1(tmp_path, monkeypatch, capsys):
    from lengthgen.errors import RunsFailed
    from lengthgen.reproduction import runner

    report = tmp_path / "report.md"
    report.write_text("# the report of the runs that finished\n")

    def two_of_four_fail(*args, **kwargs):
        raise RunsFailed(f"2 of 4 runs failed (see {tmp_path / 'failures.txt'}); {report} reports the other 2", report)

    monkeypatch.setattr(runner, "reproduce", two_of_four_fail)
    assert main(["reproduce", "looped", "--out", str(tmp_path), "--no-progress"]) == 1
    out, err = capsys.readouterr()
    assert "the report of the runs that finished" in out
    assert err.strip() == f"lengthgen: error: 2 of 4 runs failed (see {tmp_path / 'failures.txt'}); {report} reports the other 2"
