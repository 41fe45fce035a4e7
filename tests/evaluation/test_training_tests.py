"""Tests during training (tests.interval, lengthgen.evaluation.during_training): what they write to
metrics.jsonl, that they agree with the evaluator, that they leave training untouched, and the
config errors they raise."""
from __future__ import annotations

import json

import pytest
import torch

from lengthgen.assembly.runs import new_run_config
from lengthgen.errors import ConfigError
from lengthgen.evaluation.during_training import training_tests
from lengthgen.evaluation.evaluate import evaluate_run
from lengthgen.evaluation.settings import EvalSettings
from lengthgen.reporting.curves import metrics_of, read_tests
from lengthgen.runtime.checkpoint import latest
from lengthgen.training.trainer import train

TINY = ["task.name=parity", "task.train_max=4", "model.d_model=16", "model.n_layer=1", "model.n_head=2",
        "train.batch_size=16", "train.steps=120", "optim.lr=3e-3", "train.device=cpu", "data.curriculum_start=2",
        "data.curriculum_interval=30", "train.log_interval=50", "train.checkpoint_interval=120"]


def run(folder, *extra: str, method: str = "looped"):
    cfg = new_run_config(None, [f"method={method}", *TINY, *extra])
    train(cfg, folder, progress=False, hooks=training_tests)
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def tested(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tested")
    rows = run(folder, "tests.interval=40", "tests.lengths=6,8", "tests.samples=256",
               'tests.stops=["oracle", "confidence:+4"]')
    return folder, rows


def test_tests_are_written_at_every_interval_with_the_current_maximum(tested):
    _, rows = tested
    keys = {"test@max", "test@6", "test@8", "test@max/confidence:+4", "test@6/confidence:+4", "test@8/confidence:+4"}
    with_tests = [r for r in rows if "test@max" in r]
    assert [r["step"] for r in with_tests] == [40, 80, 120]  # not multiples of log_interval: rows of their own
    assert all(keys <= r.keys() and all(0 <= r[k] <= 1 for k in keys) for r in with_tests)
    assert [r["max_length"] for r in with_tests] == [3, 4, 4]  # the curriculum's maximum at that step
    assert all("test@max" not in r for r in rows if r["step"] % 40)
    curves = read_tests(metrics_of(tested[0]))
    assert set(curves) == keys and list(curves["test@6"][0]) == [40, 80, 120]


def test_the_last_test_is_what_the_evaluator_measures(tested):
    folder, rows = tested
    last = rows[-1]
    got = evaluate_run(folder, EvalSettings(lengths=[4, 6, 8], samples=256, stops=["oracle", "confidence:+4"],
                                            progress=False))
    by = {(r["length"], r["stop"]): r["accuracy"] for r in got}
    for n, name in [(4, "max"), (6, "6"), (8, "8")]:
        assert by[(n, "oracle")] == pytest.approx(last[f"test@{name}"], abs=1e-9)
        assert by[(n, "confidence:+4")] == pytest.approx(last[f"test@{name}/confidence:+4"], abs=1e-9)


def test_a_run_that_tests_trains_the_same_weights(tested, tmp_path):
    from safetensors.torch import load_file
    plain = tmp_path / "plain"
    run(plain)
    a, b = (load_file(latest(f) / "model.safetensors") for f in (tested[0], plain))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_tests_follow_learning(tmp_path):
    """The tests measure the model as it learns: the first one, early in training, is below the last."""
    rows = run(tmp_path / "r", "tests.interval=15", "train.steps=300", "train.checkpoint_interval=300",
               "data.curriculum_start=0")
    curve = [r["test@max"] for r in rows if "test@max" in r]
    assert len(curve) == 20 and curve[-1] >= curve[0] + 0.1, curve


def test_ntp_runs_test_without_stop_rules(tmp_path):
    """A method without stop rules ignores tests.stops (a grid's ntp arm on a looped preset)."""
    rows = run(tmp_path / "ntp", "tests.interval=60", "tests.lengths=5", 'tests.stops=["oracle"]',
               method="ntp")
    assert [sorted(k for k in r if k.startswith("test@")) for r in rows if "test@max" in r] == [["test@5", "test@max"]] * 2


def test_test_offset_moves_the_tests_as_the_released_code(tmp_path):
    """tests.offset 1: after steps 1, 41, 81 (the released i % 1000 == 0 comes after update i + 1), and the last."""
    rows = run(tmp_path / "r", "tests.interval=40", "tests.offset=1")
    assert [r["step"] for r in rows if "test@max" in r] == [1, 41, 81, 120]


@pytest.mark.slow
def test_test_options_set_the_tested_samples_task(tmp_path):
    """Multiplication tested with the short factor fixed at 2 bits, as the released tests: the
    last test equals the evaluator on that task option, not on the training one."""
    folder = tmp_path / "mult"
    cfg = new_run_config(None, ["method=looped", *TINY, "task.name=multiplication", "tests.interval=60",
                                "tests.lengths=5", "tests.samples=256", "tests.options={min_a_bits = 2}"])
    train(cfg, folder, progress=False, hooks=training_tests)
    last = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()][-1]
    got = evaluate_run(folder, EvalSettings(lengths=[5], samples=256, sweep={"min_a_bits": [1, 2]}, progress=False))
    by = {r["min_a_bits"]: r["accuracy"] for r in got}  # option values as CSV cells
    assert by["2"] == pytest.approx(last["test@5"], abs=1e-9), (by, last["test@5"])
    assert abs(by["1"] - by["2"]) > 0.02, by  # the option changes what is measured: the check can fail


@pytest.mark.parametrize("extra, needle", [
    (["tests.interval=40", "tests.offset=40"], "tests.offset must be in 0..tests.interval - 1"),
    (["tests.options={max_a_bits = 2}"], "tests.options"),
    (["task.name=multiplication", "tests.options={min_a_bits = 3}"], "tests.options: multiplication: min_a_bits"),
    (["tests.interval=-1"], "tests.interval must be >= 0"),
    (["tests.samples=0"], "tests.samples must be >= 1"),
    (["tests.lengths=abc"], "tests.lengths"),
    (["tests.lengths=0"], "tests.lengths"),
    (['tests.stops=["sometimes"]'], "tests.stops: stop rule 'sometimes'"),
    (['tests.stops=["halt"]'], "tests.stops: stop rule halt reads a halting head"),
])
def test_bad_test_settings_are_refused_in_one_line(extra, needle):
    with pytest.raises(ConfigError) as err:
        new_run_config(None, ["method=looped", *TINY, *extra])
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_the_training_curves_figure_adds_a_row_of_tests(tested, tmp_path):
    from matplotlib.image import imread

    from lengthgen.cli import main
    folder, _ = tested
    evaluate_run(folder, EvalSettings(lengths=[4, 6], samples=64, progress=False))
    assert main(["report", str(folder), "--out", str(tmp_path / "report"), "--curves"]) in (0, None)
    height, width = imread(tmp_path / "report" / "training_curves.png").shape[:2]
    assert height > width  # one task: a loss panel above a panel of tests (alone the loss panel is wider than tall)
    assert "--curves" in (tmp_path / "report" / "report.md").read_text()  # the command that rebuilds it
