"""`lengthgen report` on hand-written eval.csv files: no mixing of configs, one-line errors
on unreadable files before anything is written, and honest figures."""
from __future__ import annotations

import math
import shlex
from pathlib import Path

import matplotlib.axes
import matplotlib.figure
import pytest

from lengthgen.cli import main
from lengthgen.assembly.runs import new_run_config
from lengthgen.config.schema import to_toml
from lengthgen.results.rows import COLUMNS, PER_STEP_COLUMNS, write_csv
from lengthgen.reporting.figures import plot
from lengthgen.reporting.series import aggregate
from tests.helpers.tiny_runs import one_line_error

ROW = {"task": "parity", "method": "ntp", "position": "nope", "stop": "", "seed": 0, "n": 64, "accuracy": 1.0,
       "token_accuracy": 1.0, "stop_step": math.nan, "train_max": 4, "baseline": 0.5, "step": 20}


def write_run(folder: Path, lengths=(2, 4, 6), **fields) -> Path:
    folder.mkdir(parents=True)
    write_csv(folder / "eval.csv", [{**ROW, "run": folder.name, "length": n, **fields} for n in lengths],
              COLUMNS + sorted(set(fields) - set(COLUMNS)))
    return folder


@pytest.mark.parametrize("field, value", [("train_max", 6), ("baseline", 0.25), ("n", 32)])
def test_runs_of_different_configs_are_not_averaged_as_seeds(tmp_path, capsys, field, value):
    write_run(tmp_path / "runs" / "a")
    write_run(tmp_path / "runs" / "b", seed=1, **{field: value})
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 2
    err = one_line_error(capsys)
    assert "runs/a" in err and "runs/b" in err and f"differ in {field}" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("damage", ["empty", "header only", "short row", "cut mid-value"])
def test_unreadable_eval_csv_is_one_line_error_before_anything_is_written(tmp_path, capsys, damage):
    path = write_run(tmp_path / "runs" / "a") / "eval.csv"
    text = path.read_text()
    path.write_text({"empty": "", "header only": text.splitlines(keepends=True)[0],
                     "short row": text + "a,parity,ntp\n", "cut mid-value": text[:-3]}[damage])
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 2
    assert str(path) in one_line_error(capsys)
    assert not (tmp_path / "out").exists()


def test_truncated_per_step_csv_is_one_line_error(tmp_path, capsys):
    folder = write_run(tmp_path / "a", method="looped", stop="oracle")
    steps = [{**ROW, "run": "a", "method": "looped", "length": 2, "iteration": t, "confidence": 0.1, "oracle_step": 2}
             for t in (1, 2, 3, 4)]
    write_csv(folder / "per_step.csv", steps, PER_STEP_COLUMNS)
    (folder / "per_step.csv").write_text((folder / "per_step.csv").read_text()[:-30])
    assert main(["report", str(folder), "--out", str(tmp_path / "out")]) == 2
    assert "per_step.csv" in one_line_error(capsys)


def test_report_of_one_csv_file_writes_beside_it_and_quotes_its_command(tmp_path, capsys):
    folder = write_run(tmp_path / "run one")
    assert main(["report", str(folder / "eval.csv")]) == 0
    report = (folder / "report.md").read_text()
    assert f"    {shlex.join(['lengthgen', 'report', str(folder / 'eval.csv')])}\n" in report
    capsys.readouterr()
    assert main(["report", str(folder), "--out", str(folder / "eval.csv")]) == 2
    assert "is a file" in one_line_error(capsys)


@pytest.fixture
def drawn(monkeypatch):
    """What plot() drew: the figure legend's labels and the shaded spans."""
    seen = {"legend": [], "spans": []}
    legend, axvspan = matplotlib.figure.Figure.legend, matplotlib.axes.Axes.axvspan

    def record_legend(fig, handles, labels, **kw):
        seen["legend"] += labels
        return legend(fig, handles, labels, **kw)

    def record_span(ax, lo, hi, **kw):
        seen["spans"].append((lo, hi))
        return axvspan(ax, lo, hi, **kw)

    monkeypatch.setattr(matplotlib.figure.Figure, "legend", record_legend)
    monkeypatch.setattr(matplotlib.axes.Axes, "axvspan", record_span)
    return seen


def test_legend_names_every_series_when_positions_differ_in_another_panel(tmp_path, drawn):
    rows = [{**ROW, "run": "p", "length": 4}, {**ROW, "run": "c", "task": "copy", "position": "alibi", "length": 4}]
    plot(aggregate(rows), tmp_path / "fig.png")
    series = [label for label in drawn["legend"] if label.startswith("ntp")]
    assert sorted(series) == ["ntp (position=alibi) (1 seed)", "ntp (position=nope) (1 seed)"]


def test_training_band_covers_only_evaluated_training_lengths(tmp_path, drawn):
    beyond = [{**ROW, "run": "r", "train_max": 12, "length": n} for n in (16, 20, 24)]
    plot(aggregate(beyond), tmp_path / "beyond.png")
    assert drawn["spans"] == [] and "training lengths" not in drawn["legend"]
    around = [{**ROW, "run": "r", "train_max": 12, "length": n} for n in (8, 16)]
    plot(aggregate(around), tmp_path / "around.png")
    assert drawn["spans"] == [(7.5, 12.5)]


def test_per_step_panels_keep_positional_schemes_apart(tmp_path, monkeypatch):
    """Two looped runs that differ only in position are two panels, not one averaged curve."""
    from lengthgen.reporting import figures

    steps = [{**ROW, "run": p, "method": "looped", "position": p, "length": 2, "iteration": t,
              "accuracy": float(t == 2) if p == "nope" else 0.0, "confidence": 0.1, "oracle_step": 2}
             for p in ("nope", "rope") for t in (1, 2, 3)]
    titles = []
    monkeypatch.setattr(matplotlib.axes.Axes, "set", lambda ax, **kw: titles.append(kw.get("title")))
    figures.plot_per_step(steps, [], tmp_path / "steps.png")
    assert titles == ["parity: looped (position=nope) (1 seed)", "parity: looped (position=rope) (1 seed)"]


def test_summary_reads_each_series_at_multiples_of_its_own_training_maximum():
    from lengthgen.reporting.report import markdown, summary

    rows = [{**ROW, "run": "short", "train_max": 4, "length": n} for n in (2, 4, 6, 8, 12, 16)]
    rows += [{**ROW, "run": "long", "method": "looped", "stop": "oracle", "train_max": 8, "length": n,
              "accuracy": 0.5} for n in (2, 4, 6, 8, 12, 16)]
    agg = aggregate(rows)
    table = summary(agg)
    assert "| parity | ntp | 1.000 (1) @6 | 1.000 (1) @8 |" in table
    assert "| parity | looped, oracle stop | 0.500 (1) @12 | 0.500 (1) @16 |" in table
    assert "trained on lengths ≤ 8 (looped, oracle stop), 4 (ntp)" in markdown(agg)


def test_the_read_out_iteration_has_its_own_summary_for_series_with_a_stop_rule(tmp_path):
    from lengthgen.reporting.report import write_report

    ntp = write_run(tmp_path / "ntp", lengths=(2, 4, 6, 8))
    runs = [write_run(tmp_path / f"halt-s{seed}", lengths=(2, 4, 6, 8), method="looped-halt", stop="halt", seed=seed,
                      stop_step=float(n)) for seed, n in ((0, 5), (1, 7))]
    for seed, folder in enumerate(runs):  # seeds of one config: a report averages only configs it can read
        cfg = new_run_config(None, ["task.name=parity", "method=looped-halt", f"train.model_seed={seed}"])
        (folder / "config.toml").write_text(to_toml(cfg))
    text = write_report([ntp, *runs], tmp_path / "out").read_text()
    steps = text[text.index("Mean read-out iteration"):text.index("## Per task")]
    assert "| parity | looped-halt, halt stop | 6.000 ± 1.000 (2) @6 | 6.000 ± 1.000 (2) @8 |" in steps
    assert "ntp" not in steps  # no stop rule, no read-out iteration


def test_swept_values_order_as_numbers():
    """k = 2 before k = 10 in every table, not as text ("10" < "2")."""
    from lengthgen.reporting.report import summary

    rows = [{**ROW, "run": "r", "length": 4, "k": k, "accuracy": 1 / int(k)} for k in ("10", "2", "4")]
    table = summary(aggregate(rows))
    order = [line.split("|")[2].strip() for line in table.splitlines()[2:]]
    assert order == ["ntp (k=2)", "ntp (k=4)", "ntp (k=10)"], order


def test_a_figure_over_an_option_no_run_swept_is_skipped_with_a_note(tmp_path):
    """A grid run for some of its tasks (reproduce sparsity --tasks addition) has no k to draw over:
    the report says so instead of failing after every run has trained."""
    from lengthgen.reporting.report import write_report

    folder = write_run(tmp_path / "run")
    layout = {"figures": ["accuracy_vs_length", {"kind": "heatmap", "y": "k"}, {"kind": "accuracy_vs_option", "x": "k"}]}
    report = write_report([folder], tmp_path / "out", layout=layout).read_text()
    assert "(no run swept k: no heatmap figure)" in report and "(no run swept k: no accuracy_vs_option figure)" in report
    assert (tmp_path / "out" / "accuracy_vs_length.png").exists()
    assert not list((tmp_path / "out").glob("*_by_length_and_*.png"))


def test_report_across_tasks_ranks_each_scheme_on_every_task(tmp_path, capsys):
    """`--across-tasks position`: a cell per scheme and task at 2x the training length, ranked."""
    values = {("parity", "rope"): 0.5, ("parity", "nope"): 0.9, ("copy", "rope"): 0.8, ("copy", "nope"): 0.8}
    for (task, position), accuracy in values.items():
        write_run(tmp_path / "runs" / f"{task}-{position}", lengths=(4, 8), task=task, position=position,
                  accuracy=accuracy)
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--across-tasks", "position"]) == 0
    text = (tmp_path / "out" / "report.md").read_text()
    assert "--across-tasks position" in text and (tmp_path / "out" / "across_tasks_accuracy_at_2x.png").is_file()
    ranked = [line for line in text.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    # nope: rank 1 on both (MRR 1); rope: rank 2 on parity, tied first on copy (MRR 0.75); both tasks
    # separate the rows (0.9 on parity, 0.8 on copy are far above chance), so both MRRs agree
    assert ranked == ["| 1 | nope | 1.000 | 1.000 | 0.800 (1) | 0.900 (1) |",
                      "| 2 | rope | 0.750 | 0.750 | 0.800 (1) | 0.500 (1) |"]


def test_a_series_whose_mean_is_zero_has_no_ratio_and_no_division_by_zero(tmp_path):
    """Issue 1: the summary's last/first ratio of a metric whose mean is exactly 0 raised
    ZeroDivisionError, and no report was written."""
    from lengthgen.reporting.report import write_report

    write_run(tmp_path / "run", lengths=(2, 4, 6, 8), metrics="errors", errors=0.0)
    text = write_report([tmp_path / "run"], tmp_path / "out", layout={"summary_metric": "errors"}).read_text()
    row = next(line for line in text.splitlines() if line.startswith("| parity | ntp |"))
    assert row.endswith("| – |") and "0.000 (1) @6" in row


def test_the_statistics_say_which_metric_they_score_by(tmp_path):
    """Issue 10: a grid's runs reported outside their grid are scored by exact match, and say so."""
    from lengthgen.reporting.report import write_report

    write_run(tmp_path / "run", metrics="chomsky_accuracy chomsky_accuracy_per_sequence", chomsky_accuracy=0.5,
              chomsky_accuracy_per_sequence=0.6)
    text = write_report([tmp_path / "run"], tmp_path / "out").read_text()
    assert ("These sections score by `accuracy` (exact match of the whole answer); the rows also carry "
            "`chomsky_accuracy`, `chomsky_accuracy_per_sequence`") in text
    text = write_report([tmp_path / "run"], tmp_path / "out", layout={"score": "chomsky_accuracy"}).read_text()
    assert "score by `chomsky_accuracy`; the rows also carry `chomsky_accuracy_per_sequence`" in text


@pytest.mark.slow
def test_the_chomsky_grid_reports_however_small_it_is(tmp_path, capsys):
    """Issue 1's command: 5 steps of one LSTM on parity_check, 4 samples, scored 0 beyond training."""
    out = tmp_path / "hc"
    assert main(["reproduce", "chomsky", "--scale", "cpu", "--tasks", " parity_check,parity_check", "--arms", "lstm",
                 "--seeds", "1", "--set", "train.steps=5", "--samples", "4", "--out", str(out), "--no-progress"]) == 0
    report = (out / "report.md").read_text()
    assert "## Main table" in report and "Parity Check" in report and (out / "results.csv").is_file()
    assert "`chomsky_accuracy` averaged over the lengths beyond training" in report


def test_a_report_that_fails_midway_keeps_the_earlier_pair(tmp_path):
    """A full disk (a file-size limit) while the figures are drawn: report.md and results.csv stay
    the earlier report's, both, rather than a new results.csv beside an old report.md."""
    from tests.helpers.limited_calls import calls

    write_run(tmp_path / "a")
    write_run(tmp_path / "b", method="looped", accuracy=0.5)
    assert main(["report", str(tmp_path / "a"), "--out", str(tmp_path / "out")]) == 0
    before = {name: (tmp_path / "out" / name).read_bytes() for name in ("report.md", "results.csv")}
    [(code, err)] = calls([["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(tmp_path / "out")]],
                          tmp_path, file_size=4096)
    assert code == 1 and "no space left" in err and "Traceback" not in err
    assert {name: (tmp_path / "out" / name).read_bytes() for name in before} == before
    assert not list((tmp_path / "out").glob(".*.tmp"))
