"""Statistics over seeds against hand-computed values: the t distribution's p-value against its
closed forms and printed tables, Welch's test on small samples worked by hand, the maximum over
seeds, the success rate and the effective length from result rows; and `lengthgen report
--compare` on hand-written eval.csv files, with its one-line errors."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from lengthgen.cli import main
from lengthgen.errors import UserError
from lengthgen.results.rows import COLUMNS, write_csv
from lengthgen.reporting.compare import compare_section, pairs, parse_arms, seeds_section
from lengthgen.reporting.series import aggregate
from lengthgen.reporting.statistics import (betainc, effective_length, seed_scores, success_rate, t_two_sided_p,
                                            welch)
from tests.helpers.tiny_runs import one_line_error

ROW = {"task": "parity", "method": "ntp", "position": "nope", "stop": "", "seed": 0, "n": 64, "accuracy": 1.0,
       "token_accuracy": 1.0, "stop_step": math.nan, "train_max": 4, "baseline": 0.5, "step": 20}


def test_incomplete_beta_against_a_binomial_sum():
    # I_x(a, b) for integers is a binomial tail: I_0.4(2, 3) = sum_{j=2..4} C(4, j) 0.4^j 0.6^(4-j)
    assert betainc(2, 3, 0.4) == pytest.approx(6 * 0.16 * 0.36 + 4 * 0.064 * 0.6 + 0.0256, abs=1e-12)
    assert betainc(0.5, 0.5, 0.5) == pytest.approx(0.5, abs=1e-12)  # symmetric
    assert (betainc(3, 4, 0), betainc(3, 4, 1)) == (0.0, 1.0)


@pytest.mark.parametrize("t", [0.0, 0.5, 2.0, 12.7062])
def test_p_value_matches_the_closed_forms_of_one_and_two_degrees_of_freedom(t):
    assert t_two_sided_p(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), abs=1e-10)  # Cauchy
    assert t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), abs=1e-10)


@pytest.mark.parametrize("t, df", [(12.7062, 1), (4.3027, 2), (2.7764, 4), (2.2281, 10), (2.0423, 30), (1.96, 1e7)])
def test_p_value_at_the_printed_five_percent_critical_values(t, df):
    assert t_two_sided_p(t, df) == pytest.approx(0.05, abs=2e-5)
    assert t_two_sided_p(-t, df) == t_two_sided_p(t, df)


def test_welch_on_two_samples_worked_by_hand():
    # means 0.9 and 0.6, variances 0.01 and 0.01, n = 3: s.e. = sqrt(0.01/3 + 0.01/3) = 0.08165,
    # t = 0.3 / 0.08165 = 3.6742, df = (2 * 0.01/3)^2 / (2 * (0.01/3)^2 / 2) = 4; and for 4 degrees
    # of freedom P(|T| > t) = 1 - 3u/2 + u^3/2 = 0.021312, where u = t / sqrt(4 + t^2)
    w = welch([0.9, 1.0, 0.8], [0.5, 0.7, 0.6])
    assert (w.difference, w.t, w.df) == pytest.approx((0.3, 3.674235, 4.0), abs=1e-6)
    u = w.t / math.sqrt(4 + w.t ** 2)
    assert w.p == pytest.approx(1 - 1.5 * u + 0.5 * u ** 3, abs=1e-9) == pytest.approx(0.021312, abs=1e-6)
    assert (w.n_a, w.n_b) == (3, 3)


def test_welch_with_unequal_spread_takes_the_satterthwaite_degrees_of_freedom():
    # [0.6, 0.8] against [0.5, 0.5]: all the variance on one side, df = 1; t = 0.2 / sqrt(0.02 / 2) = 2
    w = welch([0.6, 0.8], [0.5, 0.5])
    assert (w.t, w.df) == pytest.approx((2.0, 1.0))
    assert w.p == pytest.approx(1 - 2 / math.pi * math.atan(2), abs=1e-12) == pytest.approx(0.295167, abs=1e-6)
    # equal variances, n = 2 each: df = 2, t = 0.5 / sqrt(0.02) = 3.5355
    w = welch([0.6, 0.8], [0.1, 0.3])
    assert (w.t, w.df, w.p) == pytest.approx((3.535534, 2.0, 0.071523), abs=1e-6)
    # 2 and 5 seeds, variances 0.02 and 0.025: df = (0.01 + 0.005)^2 / (0.01^2 / 1 + 0.005^2 / 4) = 2.1176
    w = welch([0.6, 0.8], [0.1, 0.2, 0.3, 0.4, 0.5])
    assert (w.t, w.df) == pytest.approx((0.4 / math.sqrt(0.015), 0.015 ** 2 / (0.01 ** 2 + 0.005 ** 2 / 4)))


def test_welch_without_spread_and_with_one_seed():
    assert (welch([1.0, 1.0], [1.0, 1.0]).p, welch([1.0, 1.0], [0.5, 0.5]).p) == (1.0, 0.0)
    assert welch([1.0, 1.0], [0.5, 0.5]).t == math.inf
    with pytest.raises(ValueError, match="at least 2"):
        welch([1.0], [0.5, 0.6])


def test_success_rate_counts_seeds_at_or_above_the_threshold():
    assert success_rate([0.95, 0.89, 0.9], 0.9) == (2, 3)
    assert success_rate([0.5, 0.6], 0.9) == (0, 2)


def test_effective_length_stops_at_the_first_length_that_falls_short():
    means = {10: 1.0, 20: 0.95, 30: 0.85, 40: 0.92}
    assert effective_length(means, 0.9) == 20  # 40 passes again, but 30 broke the run
    assert effective_length(means, 0.8) == 40
    assert effective_length({10: 0.5, 20: 1.0}, 0.9) is None
    assert effective_length({10: 1.0, 20: math.nan}, 0.9) == 10


def rows_of(arm: str, scores: dict[int, list[float]], task: str = "parity", lengths=(2, 4, 6, 8), **fields) -> list:
    """A run per seed; accuracy at each length: 1.0 up to train_max, then the seed's values."""
    out = []
    for seed, beyond in scores.items():
        values = dict(zip(lengths, [1.0, 1.0] + list(beyond)))
        out += [{**ROW, "run": f"{arm}-{seed}", "arm": arm, "task": task, "seed": seed, "length": n,
                 "accuracy": values[n], "source": f"{arm}-{seed}", **fields} for n in lengths]
    return out


def test_seed_scores_average_the_lengths_beyond_training():
    rows = rows_of("rope", {0: [0.9, 0.7], 1: [0.5, 0.3], 2: [1.0, 1.0]})
    ((task, series), got), = seed_scores(rows).items()
    assert task == "parity" and dict(series)["arm"] == "rope"
    assert got["lengths"] == [6, 8] and got["beyond"]
    assert got["scores"] == pytest.approx({("0", ""): 0.8, ("1", ""): 0.4, ("2", ""): 1.0})


def test_the_section_over_seeds_shows_max_success_and_effective_length():
    rows = rows_of("rope", {0: [0.9, 0.7], 1: [0.5, 0.3], 2: [1.0, 1.0]})
    text = "\n".join(seeds_section(rows, aggregate(rows), 0.75))
    # scores 0.8, 0.4, 1.0: mean 0.733, s.e. sqrt(0.0933 / 3) = 0.176; max 1.0; 2 of 3 >= 0.75;
    # mean accuracy 1, 1, 0.8, 0.667 at lengths 2, 4, 6, 8: effective length 6 at 0.75
    assert "| parity | rope | 3 | 0.733 ± 0.176 | 1.000 | 2/3 | 6 | 6–8 (2) |" in text
    assert "≥ 0.75" in text and "max over seeds" in text


def test_arms_are_matched_on_the_columns_both_vary_and_a_lone_value_meets_every_other():
    rows = rows_of("looped", {0: [1, 1]}, stop="oracle") + rows_of("looped", {0: [1, 1]}, stop="confidence")
    rows += rows_of("ntp", {0: [1, 1]})
    got = pairs(seed_scores(rows), "looped", "ntp")
    assert sorted(dict(a)["stop"] for _, a, _ in got) == ["confidence", "oracle"]
    assert {dict(b)["stop"] for _, _, b in got} == {""}


def test_compare_section_tests_each_task_and_the_suite_mean():
    rows = rows_of("rope", {0: [0.9, 1.0], 1: [0.9, 1.0], 2: [0.8, 0.8]}) + \
        rows_of("nope", {0: [0.5, 0.5], 1: [0.7, 0.7], 2: [0.6, 0.6]})
    rows += rows_of("rope", {0: [0.6, 0.6], 1: [0.8, 0.8]}, task="copy") + \
        rows_of("nope", {0: [0.6, 0.6], 1: [0.5, 0.5]}, task="copy")
    text = "\n".join(compare_section(rows, aggregate(rows), "rope", "nope"))
    # parity: scores 0.95, 0.95, 0.8 against 0.5, 0.7, 0.6: difference 0.25; df and p from welch
    w = welch([0.95, 0.95, 0.8], [0.5, 0.7, 0.6])
    assert f"| parity | rope | nope | 3, 3 | 0.900 ± 0.050 | 0.600 ± 0.058 | +0.300 | {w.t:.2f} | {w.df:.1f} | {w.p:.3g} |" \
        in text
    # suite: seeds 0 and 1 ran both tasks: (0.95 + 0.6) / 2, (0.95 + 0.8) / 2 against (0.5 + 0.6) / 2, (0.7 + 0.5) / 2
    w = welch([0.775, 0.875], [0.55, 0.6])
    assert f"| mean of 2 tasks | rope | nope | 2, 2 | 0.825 ± 0.050 | 0.575 ± 0.025 | +0.250 | {w.t:.2f} | {w.df:.1f} | " \
        f"{w.p:.3g} |" in text


@pytest.mark.parametrize("text", ["rope", "rope,", "rope,nope,alibi", "rope,rope", ""])
def test_a_badly_formed_compare_is_a_user_error(text):
    with pytest.raises(UserError, match="ARM_A,ARM_B"):
        parse_arms(text)


def write_runs(root: Path, arm: str, position: str, scores: dict[int, list[float]]) -> None:
    """A run folder per seed with its eval.csv and a config.toml naming its seed."""
    for row in rows_of(arm, scores, position=position):
        folder = root / row["run"]
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.toml").write_text(f"[train]\nmodel_seed = {row['seed']}\n")
    for seed in scores:
        run = [{k: v for k, v in r.items() if k != "source"} for r in rows_of(arm, {seed: scores[seed]}, position=position)]
        write_csv(root / f"{arm}-{seed}" / "eval.csv", run, COLUMNS)


def test_report_compare_prints_the_test_and_refuses_bad_input(tmp_path, capsys):
    runs = tmp_path / "runs"
    write_runs(runs, "rope", "rope", {0: [0.9, 1.0], 1: [0.9, 1.0], 2: [0.8, 0.8]})
    write_runs(runs, "nope", "nope", {0: [0.5, 0.5], 1: [0.7, 0.7], 2: [0.6, 0.6]})
    assert main(["report", str(runs), "--out", str(tmp_path / "out"), "--compare", "rope,nope", "--threshold", "0.85"]) == 0
    printed = capsys.readouterr().out
    w = welch([0.95, 0.95, 0.8], [0.5, 0.7, 0.6])
    assert "## rope against nope" in printed and f"| +0.300 | {w.t:.2f} | {w.df:.1f} | {w.p:.3g} |" in printed
    assert "| parity | rope | 3 | 0.900 ± 0.050 | 0.950 | 2/3 | 8 (all) | 6–8 (2) |" in printed
    assert "--compare rope,nope --threshold 0.85" in (tmp_path / "out" / "report.md").read_text()
    for bad, says in [("rope,nop", "no arm 'nop' in these runs (did you mean nope?); they hold nope, rope"),
                      ("rope", "takes two different arms as ARM_A,ARM_B")]:
        assert main(["report", str(runs), "--out", str(tmp_path / "bad"), "--compare", bad]) == 2
        assert says in one_line_error(capsys)
        assert not (tmp_path / "bad").exists()
    alone = tmp_path / "alone"
    write_runs(alone, "rope", "rope", {0: [0.9, 1.0]})
    write_runs(alone, "nope", "nope", {0: [0.5, 0.5], 1: [0.7, 0.7]})
    assert main(["report", str(alone), "--out", str(tmp_path / "bad"), "--compare", "rope,nope"]) == 2
    assert "arm rope has one seed only" in one_line_error(capsys)
    assert main(["report", str(runs), "--out", str(tmp_path / "bad"), "--threshold", "2"]) == 2
    assert "--threshold must be a number between 0 and 1" in one_line_error(capsys)
