"""Rows say which series they are: a task's own metrics, task options swept in evaluation,
the labels a reproduction gives a run, and the heatmap drawn from them."""
from __future__ import annotations

import json
import subprocess
import sys

import matplotlib.axes
import pytest
import torch

from lengthgen.cli import main
from lengthgen.assembly.runs import new_run_config
from lengthgen.evaluation.evaluate import evaluate_run
from lengthgen.evaluation.settings import EvalSettings
from lengthgen.results.rows import read_per_step, read_rows, relabel
from lengthgen.reporting.figures import plot, plot_heatmap, plot_vs_option, split_panels
from lengthgen.reporting.report import markdown
from lengthgen.reporting.series import aggregate
from lengthgen.tasks import TASKS, Copy
from lengthgen.training.trainer import train

TINY = ["model.d_model=16", "model.n_layer=1", "model.n_head=2", "task.train_max=4", "train.batch_size=8",
        "train.steps=20", "train.device=cpu", "train.log_interval=10"]


class CopyErrors(Copy):
    """Copy that also counts the wrong answer tokens of each sample (a test double for a
    task's own metric, as flip-flop's per-read error rate will be)."""

    name = "copy_errors"
    metric_names = ("errors",)

    def metrics(self, pred, batch):
        return {"errors": ((pred != batch.targets) & batch.scored).sum(1).float()}


@pytest.fixture
def copy_errors(monkeypatch):
    monkeypatch.setitem(TASKS, CopyErrors.name, CopyErrors)


@pytest.mark.parametrize("method, stops", [("ntp", None), ("looped", ["oracle", "confidence"])],
                         ids=["one-pass", "looped-trace"])
def test_a_tasks_own_metric_reaches_its_rows_and_the_report(tmp_path, copy_errors, method, stops):
    folder = tmp_path / "run"
    train(new_run_config(None, TINY + ["task.name=copy_errors", f"method={method}"]), folder, progress=False)
    rows = evaluate_run(folder, EvalSettings(lengths=[2, 5], samples=24, stops=stops, progress=False))
    written = read_rows(folder / "eval.csv")
    order = lambda r: (r["stop"], r["length"])  # noqa: E731
    assert [r["errors"] for r in sorted(written, key=order)] == pytest.approx([r["errors"] for r in sorted(rows, key=order)])
    for r in written:  # copy scores n answer tokens: mean wrong tokens = n * (1 - token accuracy)
        assert r["errors"] == pytest.approx(r["length"] * (1 - r["token_accuracy"]), abs=1e-5)
    assert {r["stop"] for r in written} == set(stops or [""])
    text = markdown(aggregate([{**r, "source": str(folder)} for r in written]))
    assert "`errors`, mean ± standard error over seeds" in text


def test_a_swept_task_option_gives_rows_per_value(tmp_path, capsys):
    folder = tmp_path / "run"
    train(new_run_config(None, TINY + ["task.name=multiplication", "task.options={max_a_bits=1}"]), folder,
          progress=False)
    assert main(["eval", str(folder), "--lengths", "2,3", "--samples", "16", "--sweep", "max_a_bits=[1, 3]",
                 "--no-progress"]) == 0
    assert "max_a_bits = 3" in capsys.readouterr().out
    rows = read_rows(folder / "eval.csv")
    assert sorted((r["max_a_bits"], r["length"]) for r in rows) == [("1", 2), ("1", 3), ("3", 2), ("3", 3)]
    # the question of a 3-bit a is longer: the swept task really drew other samples
    assert len({r["baseline"] for r in rows}) > 2
    # a value that changes the vocabulary, or an option the task does not have, is refused
    for sweep, needle in (("max_a_bits=[0]", "max_a_bits"), ("symbols=[3]", "eval.sweep.symbols")):
        assert main(["eval", str(folder), "--lengths", "2", "--sweep", sweep, "--no-progress"]) == 2
        assert needle in capsys.readouterr().err


def test_a_swept_option_that_changes_the_vocabulary_is_a_config_error():
    with pytest.raises(Exception, match="changes the task's vocabulary"):
        new_run_config(None, ["task.name=unique_set", "task.options={symbols=4}", "eval.sweep={symbols=[4, 6]}"])


def test_relabel_gives_old_rows_the_runs_current_labels(tmp_path):
    folder = tmp_path / "run"
    train(new_run_config(None, TINY + ["method=looped"]), folder, progress=False)
    evaluate_run(folder, EvalSettings(lengths=[2, 3], samples=8, per_step=True, progress=False))
    assert {r["arm"] for r in read_rows(folder / "eval.csv")} == {""}
    (folder / "series.json").write_text(json.dumps({"arm": "looped", "model.n_layer": 1}))
    relabel(folder)
    for rows in (read_rows(folder / "eval.csv"), read_per_step(folder / "per_step.csv")):
        assert {(r["arm"], r["model.n_layer"]) for r in rows} == {("looped", "1")}
    (folder / "series.json").write_text(json.dumps({"arm": "other"}))  # a label the grid no longer needs goes
    relabel(folder)
    assert all("model.n_layer" not in r and r["arm"] == "other" for r in read_rows(folder / "eval.csv"))


def test_heatmap_cells_are_the_means_over_seeds(tmp_path, monkeypatch):
    base = {"task": "parity", "method": "ntp", "arm": "a", "position": "nope", "stop": "", "n": 8,
            "token_accuracy": 1.0, "stop_step": float("nan"), "train_max": 4, "baseline": 0.5, "step": 1}
    rows = [{**base, "run": f"r{s}", "source": f"r{s}", "seed": s, "length": n, "k": str(k),
             "accuracy": (n + k + s) / 100} for s in (0, 1) for n in (2, 4, 8) for k in (1, 3)]
    drawn = []
    monkeypatch.setattr(matplotlib.axes.Axes, "imshow", lambda ax, grid, **kw: drawn.append(grid) or
                        matplotlib.axes.Axes.scatter(ax, [0], [0]))
    plot_heatmap(aggregate(rows), tmp_path / "heat.png", "k")
    assert drawn == [[[pytest.approx((n + 1 + 0.5) / 100) for n in (2, 4, 8)],
                      [pytest.approx((n + 3 + 0.5) / 100) for n in (2, 4, 8)]]]
    with pytest.raises(Exception, match="no result row has a 'kk' column"):
        plot_heatmap(aggregate(rows), tmp_path / "none.png", "kk")


def test_panels_split_a_task_by_a_swept_option(tmp_path, monkeypatch):
    """accuracy_vs_length with panels = "k": a panel per value, titled by `names`, in their
    order; each line is the arm's rows of that value alone (means over seeds)."""
    base = {"task": "parity", "method": "ntp", "position": "nope", "stop": "", "n": 8, "token_accuracy": 1.0,
            "stop_step": float("nan"), "train_max": 4, "baseline": 0.5, "step": 1}
    rows = [{**base, "arm": arm, "run": f"{arm}{s}", "source": f"{arm}{s}", "seed": s, "length": n, "k": str(k),
             "accuracy": (n + k + s + (arm == "b")) / 100}
            for arm in "ab" for s in (0, 1) for n in (2, 8) for k in (1, 3)]
    moved, rank = split_panels(aggregate(rows), "k", {"3": "hard", "1": "easy"})
    assert sorted(rank, key=rank.get) == ["parity, hard", "parity, easy"]
    assert all(dict(a["series"]).get("k") is None for a in moved)
    titles, lines = [], {}
    monkeypatch.setattr(matplotlib.axes.Axes, "set", lambda ax, **kw: titles.append(kw.get("title")))
    # a panel's lines are drawn before its title is set: len(titles) is the panel's index
    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", lambda ax, x, y, **kw: lines.setdefault(
        (len(titles), kw["label"]), y))
    plot(aggregate(rows), tmp_path / "panels.png", panels="k", names={"3": "hard", "1": "easy"})
    assert titles == ["parity, hard", "parity, easy"]
    assert lines[(0, "a (2 seeds)")] == [pytest.approx((n + 3 + 0.5) / 100) for n in (2, 8)]
    assert lines[(1, "b (2 seeds)")] == [pytest.approx((n + 1 + 1.5) / 100) for n in (2, 8)]


def test_accuracy_against_an_option_is_read_at_the_longest_length(tmp_path, monkeypatch):
    """A line per training value of k_max, the means over seeds at the longest length, in k's order."""
    base = {"task": "sparse_parity", "method": "ntp", "arm": "rope", "position": "rope", "stop": "", "n": 8,
            "token_accuracy": 1.0, "stop_step": float("nan"), "train_max": 4, "baseline": 0.5, "step": 1}
    rows = [{**base, "run": f"r{m}{s}", "source": f"r{m}{s}", "seed": s, "length": n, "k": str(k),
             "task.options.k_max": str(m), "accuracy": (n + k + s + 10 * m) / 100}
            for m in (2, 4) for s in (0, 1) for n in (4, 16) for k in (4, 2, 10)]
    lines = {}
    monkeypatch.setattr(matplotlib.axes.Axes, "errorbar", lambda ax, x, y, **kw: lines.setdefault(kw["label"], (x, y)))
    assert plot_vs_option(aggregate(rows), tmp_path / "k.png", "k") == 16
    assert lines["rope (k_max=2) (2 seeds)"] == ([2, 4, 10], [pytest.approx((16 + k + 0.5 + 20) / 100) for k in (2, 4, 10)])
    assert lines["rope (k_max=4) (2 seeds)"][1][0] == pytest.approx((16 + 2 + 0.5 + 40) / 100)
    with pytest.raises(Exception, match="no result row at length 5"):
        plot_vs_option(aggregate(rows), tmp_path / "k.png", "k", length=5)


@pytest.mark.slow
def test_an_unknown_position_option_exits_2_naming_the_key(tmp_path):
    out = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "lengthgen", "train", "experiments/core/copy-ntp.toml",
                             "--set", "model.position_options.no_such=1", "--out", str(out)],
                            capture_output=True, text=True)
    assert result.returncode == 2 and not out.exists()
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "model.position_options.no_such" in lines[0], lines


def test_the_heatmap_grid_of_a_report_comes_from_its_rows(tmp_path, capsys):
    """`lengthgen report --heatmap COLUMN` draws the figure from eval.csv rows of a sweep."""
    folder = tmp_path / "run"
    train(new_run_config(None, TINY + ["task.name=multiplication"]), folder, progress=False)
    evaluate_run(folder, EvalSettings(lengths=[2, 3], samples=8, sweep={"max_a_bits": [1, 2]}, progress=False))
    assert main(["report", str(folder), "--heatmap", "max_a_bits"]) == 0
    assert (folder / "accuracy_by_length_and_max_a_bits.png").is_file()
    assert "--heatmap max_a_bits" in (folder / "report.md").read_text()


def test_pivot_table_and_attention_figure_of_a_tra_run(tmp_path):
    """The flip-flop layout of the TRA report: a table per length with a column per split and
    metric, and the attention of one run on one sequence, drawn from its checkpoint."""
    from lengthgen.reporting.report import write_report

    folder = tmp_path / "runs" / "flipflop-tra-s0"
    train(new_run_config(None, TINY + ["task.name=flipflop", "task.train_min=2", "task.train_max=6",
                                       "eval.lengths=6", "model.position=tra"]), folder, progress=False)
    (folder / "series.json").write_text(json.dumps({"arm": "tra"}))
    evaluate_run(folder, EvalSettings(lengths=[6, 12], samples=16, sweep={"p_ignore": [0.8, 0.1]}, progress=False))
    layout = {"figures": [{"kind": "attention", "task": "flipflop", "arm": "tra", "options": {"p_ignore": 0.1}}],
              "tables": [{"by": "p_ignore", "metrics": ["sequence_accuracy", "glitch_rate"],
                          "names": {"0.8": "IID", "0.1": "dense"}}]}
    text = write_report([tmp_path / "runs"], tmp_path / "out", layout=layout).read_text()
    assert "### flipflop, length 6\n" in text and "### flipflop, length 12 (beyond training)" in text
    assert "| series | IID sequence_accuracy | dense sequence_accuracy | IID glitch_rate | dense glitch_rate |" in text
    assert "## Attention on one flipflop sequence" in text and "scored positions right" in text
    assert (tmp_path / "out" / "attention_flipflop_tra.png").is_file()
    with pytest.raises(Exception, match="no setting 'colour'"):
        write_report([tmp_path / "runs"], tmp_path / "bad", layout={"figures": [{"kind": "heatmap", "y": "k",
                                                                                  "colour": "red"}]})


def test_flipflop_source_positions_are_the_last_writes():
    from lengthgen.tasks import get_task

    task = get_task("flipflop", p_ignore=0.3)
    batch = task.sample(40, 12, torch.Generator().manual_seed(1))
    sources = task.source_positions(batch)
    for i in range(len(batch)):
        text = task.decode(batch.inputs[i])
        for at in batch.scored[i].nonzero().flatten().tolist():
            last_write = max(j for j in range(0, at, 2) if text[j] == "w")
            assert sources[i, at] == last_write + 1 and int(batch.targets[i, at]) == int(batch.inputs[i, last_write + 1])
        assert (sources[i][~batch.scored[i]] == -1).all()
