"""The report's statistics over seeds and its comparison of two arms (`lengthgen report --compare
ARM_A,ARM_B`), as Markdown, from lengthgen.reporting.statistics (docs/statistics.md).

An arm is a row's `arm` (a reproduction's), or its method outside a grid, as series labels name
it. In each task both arms ran, a series of one arm is set against a series of the other when
they agree in every column (other than arm and method) that varies within both arms: two grids'
arms that sweep k are compared k by k, while a looped arm's stop rules are each set against a
baseline that has none. Where each arm has one series in every task they share, a last row
compares the suite mean: each seed's score averaged over those tasks (seeds that ran them all).
"""
from __future__ import annotations

import difflib
import math

from lengthgen.errors import UserError
from lengthgen.reporting.series import mean_stderr, series_labels
from lengthgen.reporting.statistics import effective_length, seed_scores, success_rate, welch


def parse_arms(text: str) -> tuple[str, str]:
    """'A,B' -> ("A", "B"); anything else is a UserError."""
    names = [n.strip() for n in str(text).split(",")]
    if len(names) != 2 or not all(names) or names[0] == names[1]:
        raise UserError(f"--compare takes two different arms as ARM_A,ARM_B (e.g. --compare rope,nope), got {text!r}")
    return names[0], names[1]


def check_threshold(threshold) -> float:
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 <= threshold <= 1:
        raise UserError(f"--threshold must be a number between 0 and 1 (a share of the metric's range), got {threshold!r}")
    return float(threshold)


def arm_of(series: tuple) -> str:
    d = dict(series)
    return d.get("arm", "") or d.get("method", "")


def _mean(scores) -> str:
    if not scores:
        return "–"
    mean, err = mean_stderr(list(scores))
    return f"{mean:.3f}" + ("" if math.isnan(err) else f" ± {err:.3f}")


def _lengths(scored: list[int], beyond: bool) -> str:
    if not scored:
        return "–"
    span = f"{scored[0]}" if len(scored) == 1 else f"{scored[0]}–{scored[-1]}"
    return f"{span} ({len(scored)})" + ("" if beyond else ", none beyond training")


def seeds_section(rows: list[dict], agg: list[dict], threshold: float, metric: str = "accuracy") -> list[str]:
    """A row per (task, series): seeds, score mean ± s.e., max over seeds, success rate, effective length."""
    scores, labels = seed_scores(rows, metric), series_labels(agg)
    means = {}
    for a in agg:
        means.setdefault((a["task"], a["series"]), {})[a["length"]] = a.get(metric, math.nan)
    lines = ["## Over seeds: best seed, success rate, effective length", "",
             f"A seed's score is its mean `{metric}` over the lengths beyond training that every seed of the series "
             f"was evaluated at (`lengths scored`). Mean ± standard error of the scores; `max over seeds` is the best "
             f"seed's score (what Delétang et al. report), not a mean; `success` counts the seeds whose score is ≥ "
             f"{threshold:g}. `effective length`: the longest tested length L such that the mean `{metric}` over "
             f"seeds is ≥ {threshold:g} at every tested length ≤ L (– where the shortest falls short; `all` where "
             "every tested length passes).", "",
             "| task | series | seeds | score, mean ± s.e. | max over seeds | success | effective length | lengths scored |",
             "|---|---|---:|---:|---:|---:|---:|---|"]
    for (task, series), s in sorted(scores.items(), key=lambda item: (item[0][0], labels[item[0][1]])):
        values = list(s["scores"].values())
        ok, n = success_rate(values, threshold)
        length = effective_length(means[(task, series)], threshold)
        every = length is not None and length == max(means[(task, series)])
        lines.append(f"| {task} | {labels[series]} | {n} | {_mean(values)} | {max(values):.3f} | {ok}/{n} | "
                     f"{'–' if length is None else length}{' (all)' if every else ''} | "
                     f"{_lengths(s['lengths'], s['beyond'])} |")
    return lines + [""]


def pairs(scores: dict[tuple, dict], a: str, b: str) -> list[tuple[str, tuple, tuple]]:
    """[(task, series of a, series of b)] to set against each other (see the module's docstring)."""
    arms = sorted({arm_of(series) for _, series in scores})
    for name in (a, b):
        if name not in arms:
            close = difflib.get_close_matches(name, arms, n=1, cutoff=0.5)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise UserError(f"--compare: no arm {name!r} in these runs{hint}; they hold {', '.join(arms)}")
    out = []
    for task in sorted({t for t, _ in scores}):
        mine = {name: [dict(s) for t, s in scores if t == task and arm_of(s) == name] for name in (a, b)}
        if not (mine[a] and mine[b]):
            continue
        columns = sorted({c for d in mine[a] + mine[b] for c in d} - {"arm", "method"})
        varying = [c for c in columns if all(len({d.get(c) for d in mine[name]}) > 1 for name in (a, b))]
        out += [(task, tuple(sa.items()), tuple(sb.items())) for sa in mine[a] for sb in mine[b]
                if all(sa.get(c) == sb.get(c) for c in varying)]
    if not out:
        tasks = {name: sorted({t for t, s in scores if arm_of(s) == name}) for name in (a, b)}
        raise UserError(f"--compare: arms {a} and {b} share no task ({a}: {', '.join(tasks[a])}; "
                        f"{b}: {', '.join(tasks[b])})")
    return out


def suite_scores(scores: dict, matched: list[tuple], side: int) -> dict:
    """{replicate: its score averaged over the tasks} for the seeds of one side that ran every task."""
    per_task = [scores[(task, pair[side])]["scores"] for task, *pair in matched]
    common = set.intersection(*(set(s) for s in per_task))
    return {seed: sum(s[seed] for s in per_task) / len(per_task) for seed in sorted(common)}


def _test_cells(x: dict, y: dict) -> str:
    if len(x) < 2 or len(y) < 2:
        return f"{_mean(x.values())} | {_mean(y.values())} | – | – | – | – (needs 2 seeds each) |"
    w = welch(list(x.values()), list(y.values()))
    t = f"{w.t:.2f}" if math.isfinite(w.t) else "∞" if w.t > 0 else "−∞"
    return (f"{_mean(x.values())} | {_mean(y.values())} | {w.difference:+.3f} | {t} | "
            f"{'–' if math.isnan(w.df) else f'{w.df:.1f}'} | {w.p:.3g} |")


def compare_section(rows: list[dict], agg: list[dict], a: str, b: str, metric: str = "accuracy") -> list[str]:
    """The report's section comparing arm `a` with arm `b` by Welch's t-test on their seeds' scores."""
    scores, labels = seed_scores(rows, metric), series_labels(agg)
    matched = pairs(scores, a, b)
    counts = [(len(scores[(t, sa)]["scores"]), len(scores[(t, sb)]["scores"])) for t, sa, sb in matched]
    if all(min(c) < 2 for c in counts):
        one = a if all(c[0] < 2 for c in counts) else b
        raise UserError(f"--compare: arm {one} has one seed only where it meets the other arm; a test of their "
                        f"difference needs at least 2 seeds of each (reproduce with --seeds 3, or add runs)")
    lines = [f"## {a} against {b}", "",
             f"Welch's t-test (unequal variances, two-sided) of the difference in mean score, where a seed's score is "
             f"its mean `{metric}` over the lengths beyond training (as in the section above); `df` is the "
             "Welch-Satterthwaite degrees of freedom, `seeds` those of each arm.", "",
             f"| task | series of {a} | series of {b} | seeds | {a}, mean ± s.e. | {b}, mean ± s.e. | difference {a} − {b} "
             "| t | df | p |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for (task, sa, sb), (na, nb) in zip(matched, counts):
        lines.append(f"| {task} | {labels[sa]} | {labels[sb]} | {na}, {nb} | "
                     + _test_cells(scores[(task, sa)]["scores"], scores[(task, sb)]["scores"]))
    tasks = [t for t, _, _ in matched]
    if len(set(tasks)) > 1 and len(set(tasks)) == len(tasks):
        x, y = suite_scores(scores, matched, 0), suite_scores(scores, matched, 1)
        lines.append(f"| mean of {len(tasks)} tasks | {a} | {b} | {len(x)}, {len(y)} | " + _test_cells(x, y))
        lines += ["", "The last row scores each seed by its mean over the tasks (seeds that ran every task)."]
    elif len(set(tasks)) > 1:
        lines += ["", "No mean over the tasks: an arm has several series in a task (compare them one by one)."]
    return lines + [""]
