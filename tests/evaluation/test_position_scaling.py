"""RoPE stretched at test time as evaluation arms: `lengthgen eval RUN --sweep 'position.scaling=[...]'`
writes one set of rows per stretch, `none` is the plain evaluation, the factor follows the length (or
is given), a run without RoPE refuses, and the report keeps each stretch a series of its own."""
from __future__ import annotations

import numpy as np
import pytest

from lengthgen.assembly.runs import new_run_config
from lengthgen.cli import main
from lengthgen.evaluation import position_scaling
from lengthgen.evaluation.evaluate import evaluate_run, load_assembled
from lengthgen.evaluation.position_scaling import sequence_width
from lengthgen.evaluation.settings import EvalSettings
from lengthgen.model.rotary import stretched_rope
from lengthgen.reporting import curves as curves_module
from lengthgen.reporting.report import write_report
from lengthgen.reporting.series import aggregate, series_labels
from lengthgen.results.rows import read_position_loss, read_rows
from lengthgen.training.trainer import train

from tests.helpers.documents import docs, lm_overrides  # noqa: F401  (docs is a fixture)
from tests.helpers.tiny_runs import one_line_error

TINY = ["model.d_model=16", "model.n_layer=1", "model.n_head=2", "task.name=copy", "task.train_max=4",
        "train.batch_size=8", "train.steps=20", "train.device=cpu", "train.log_interval=10"]
SCALINGS = ["none", "pi", "ntk", "yarn"]
METRICS = ("accuracy", "token_accuracy", "baseline", "n")


@pytest.fixture(scope="module")
def rope_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("rope") / "run"
    train(new_run_config(None, TINY + ["model.position=rope"]), folder, progress=False)
    return folder


@pytest.fixture
def factors(monkeypatch):
    """The (scaling, factor, training length) of every stretch the evaluation applies."""
    seen = []

    def spy(model, scaling, factor, original_length):
        seen.append((scaling, factor, original_length))
        return stretched_rope(model, scaling, factor, original_length)

    monkeypatch.setattr(position_scaling, "stretched_rope", spy)
    return seen


def test_a_sweep_gives_rows_per_scaling_and_none_is_the_plain_evaluation(rope_run, tmp_path, factors):
    plain = evaluate_run(rope_run, EvalSettings(lengths=[2, 8], samples=32, progress=False, out=tmp_path / "plain"))
    evaluate_run(rope_run, EvalSettings(lengths=[2, 8], samples=32, progress=False, out=tmp_path / "swept",
                                        sweep={"position.scaling": SCALINGS}))
    rows = read_rows(tmp_path / "swept" / "eval.csv")
    assert sorted((r["position.scaling"], r["length"]) for r in rows) == sorted((s, n) for s in SCALINGS for n in (2, 8))
    assert {r["position.factor"] for r in rows} == {"dynamic"}
    none = {r["length"]: r for r in rows if r["position.scaling"] == "none"}
    for r in plain:
        assert all(none[r["length"]][m] == r[m] for m in METRICS)
    # the factor of each length: its sequence over the longest training sequence, 1 at most within training
    run = load_assembled(rope_run)[0]
    train_width = sequence_width(run, run.task, 4)
    assert run.widest == train_width  # measured once, when the run was assembled
    expected = {(s, max(1.0, sequence_width(run, run.task, n) / train_width), train_width)
                for s in SCALINGS[1:] for n in (2, 8)}
    assert set(factors) == expected and any(f > 1 for _, f, _ in factors)


def test_a_given_factor_applies_at_every_length_and_names_its_rows(rope_run, tmp_path, capsys, factors):
    assert main(["eval", str(rope_run), "--lengths", "2,8", "--samples", "8", "--out", str(tmp_path / "out"),
                 "--sweep", "position.scaling=[yarn]", "--sweep", "position.factor=[4.0]", "--no-progress"]) == 0
    assert "position.scaling = yarn, position.factor = 4.0" in capsys.readouterr().out
    assert {f for _, f, _ in factors} == {4.0}
    rows = read_rows(tmp_path / "out" / "eval.csv")
    assert {(r["position.scaling"], r["position.factor"]) for r in rows} == {("yarn", "4.0")}


def test_the_report_draws_each_scaling_as_its_own_series(rope_run, tmp_path):
    evaluate_run(rope_run, EvalSettings(lengths=[2, 8], samples=8, progress=False, out=tmp_path / "out",
                                        sweep={"position.scaling": SCALINGS}))
    agg = aggregate([{**r, "source": str(tmp_path / "out")} for r in read_rows(tmp_path / "out" / "eval.csv")])
    labels = set(series_labels(agg).values())
    assert labels == {f"ntp (scaling={s})" for s in SCALINGS}


@pytest.mark.parametrize("sweep, needle", [
    ("position.scaling=[none,rescale]", "'rescale' is unknown; choose from none, pi, ntk, yarn"),
    ("position.factor=[2.0]", "needs eval.sweep.position.scaling"),
    ("position.stretch=[2]", "the position keys are position.scaling, position.factor"),
])
def test_a_bad_position_sweep_is_one_line(rope_run, capsys, sweep, needle):
    assert main(["eval", str(rope_run), "--lengths", "2", "--samples", "8", "--sweep", sweep, "--no-progress"]) == 2
    assert needle in one_line_error(capsys)


def test_a_run_without_rope_refuses_every_stretch_but_none(tmp_path, capsys):
    folder = tmp_path / "alibi"
    train(new_run_config(None, TINY + ["model.position=alibi", "train.steps=2"]), folder, progress=False)
    assert main(["eval", str(folder), "--lengths", "2", "--samples", "8", "--sweep", "position.scaling=[none,pi]",
                 "--no-progress"]) == 2
    assert "model.position alibi" in one_line_error(capsys)
    assert main(["eval", str(folder), "--lengths", "2", "--samples", "8", "--sweep", "position.scaling=[none]",
                 "--no-progress"]) == 0


def test_eval_sweep_in_a_config_takes_the_position_keys():
    cfg = new_run_config(None, TINY + ["model.position=rope", 'eval.sweep={"position.scaling"=["none","yarn"]}'])
    assert cfg.eval.sweep == {"position.scaling": ["none", "yarn"]}
    with pytest.raises(Exception, match="model.position nope"):
        new_run_config(None, TINY + ['eval.sweep={"position.scaling"=["ntk"]}'])


@pytest.mark.slow
def test_perplexity_by_window_is_stretched_per_window(docs, tmp_path, factors, monkeypatch):  # noqa: F811
    folder, _ = docs
    run = tmp_path / "lm"
    train(new_run_config("experiments/lm/cpu/text.toml", lm_overrides(folder, "model.position=rope", "train.steps=10")),
          run, progress=False)
    evaluate_run(run, EvalSettings(lengths=[16, 64], samples=256, progress=False,
                                   sweep={"position.scaling": ["none", "yarn"]}))
    rows = read_rows(run / "eval.csv")
    by = {(r["position.scaling"], r["length"]): r["perplexity"] for r in rows}
    assert set(by) == {(s, n) for s in ("none", "yarn") for n in (16, 64)}
    assert by["none", 16] == by["yarn", 16] and by["none", 64] != by["yarn", 64]  # s = 1 at the training window
    assert factors == [("yarn", 1.0, 16), ("yarn", 4.0, 16)]
    curves = {(r["position.scaling"], r["window"]) for r in read_position_loss(run / "position_loss.csv")}
    assert curves == set(by)  # a loss-by-position curve per stretch and window
    drawn = []
    monkeypatch.setattr(curves_module, "band", lambda ax, x, c, color, label, style="-": drawn.append((label, c[0])))
    report = write_report([run], tmp_path / "report", layout={
        "summary": [1.0, 4.0], "summary_metric": "perplexity",
        "figures": [{"kind": "accuracy_vs_length", "metric": "perplexity"}, {"kind": "position_loss", "windows": [64]}]})
    assert "ntp (scaling=yarn)" in report.read_text()
    lines = dict(drawn)  # the position-loss panel draws each stretch from its own curve
    assert set(lines) == {"ntp (scaling=none)", "ntp (scaling=yarn)"}
    assert not np.array_equal(lines["ntp (scaling=none)"], lines["ntp (scaling=yarn)"])
