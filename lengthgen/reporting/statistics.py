"""Statistics that settle a comparison, computed from result rows (docs/statistics.md).

A seed's *score* in a series is its mean of a metric (accuracy by default) over the lengths
beyond training (length > train_max), as Delétang et al. and Ruoss et al. score a run: one
number per trained model. Over a series' seeds this module gives the mean ± standard error,
the maximum over seeds (what those papers report), and the success rate (the share of seeds
whose score is at or above a threshold). Its *effective length*, in the spirit of RULER's
effective context, is the largest tested length L such that the mean over seeds is at or
above the threshold at every tested length <= L (None when the shortest already falls short).
Two arms are compared by Welch's unequal-variance t-test on their seeds' scores, its
two-sided p-value from the t distribution computed here with a regularized incomplete beta
function (no scipy).
"""
from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from lengthgen.reporting.series import key_columns, mean_stderr, replicate

DEFAULT_THRESHOLD = 0.9


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz; Numerical Recipes 6.4)."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 1000):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            return h
    raise ArithmeticError(f"incomplete beta did not converge (a={a}, b={b}, x={x})")


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1.0) / (a + b + 2.0):  # where the fraction converges fast; else by symmetry
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` degrees of freedom: I_{df/(df+t²)}(df/2, 1/2)."""
    if math.isnan(t):
        return math.nan
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


@dataclass(frozen=True)
class Welch:
    """Welch's t-test of mean(a) - mean(b): the difference, t, the Welch-Satterthwaite degrees
    of freedom, the two-sided p-value and the number of seeds on each side."""

    difference: float
    t: float
    df: float
    p: float
    n_a: int
    n_b: int


def welch(a: list[float], b: list[float]) -> Welch:
    """t = (mean_a - mean_b) / sqrt(s_a²/n_a + s_b²/n_b) (s² the sample variance, n - 1 below);
    df = (s_a²/n_a + s_b²/n_b)² / ((s_a²/n_a)²/(n_a - 1) + (s_b²/n_b)²/(n_b - 1)). Where both
    sides have no spread the test degenerates: equal means give p = 1, different ones p = 0."""
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's t-test needs at least 2 values on each side, got {len(a)} and {len(b)}")
    (mean_a, se_a), (mean_b, se_b) = mean_stderr(a), mean_stderr(b)
    va, vb = se_a ** 2, se_b ** 2  # s²/n on each side
    diff = mean_a - mean_b
    if va + vb == 0.0:
        return Welch(diff, 0.0 if diff == 0 else math.copysign(math.inf, diff), math.nan, 1.0 if diff == 0 else 0.0,
                     len(a), len(b))
    t = diff / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return Welch(diff, t, df, t_two_sided_p(t, df), len(a), len(b))


def success_rate(scores: list[float], threshold: float = DEFAULT_THRESHOLD) -> tuple[int, int]:
    """(seeds whose score is at or above `threshold`, seeds)."""
    return sum(s >= threshold for s in scores), len(scores)


def effective_length(means: dict[int, float], threshold: float = DEFAULT_THRESHOLD) -> int | None:
    """The largest tested length L with mean >= threshold at every tested length <= L (a NaN
    mean falls short); None where the shortest tested length already falls short."""
    last = None
    for length in sorted(means):
        if not means[length] >= threshold:
            break
        last = length
    return last


def seed_scores(rows: list[dict], metric: str = "accuracy") -> dict[tuple, dict]:
    """{(task, series): {"scores": {replicate: score}, "lengths": the lengths scored, "beyond":
    whether they are beyond training}} where a series is keyed as `aggregate` keys it (without
    the task) and a replicate is (model seed, data seed). A score is the seed's mean of `metric`
    over the lengths beyond training that every seed of the series was evaluated at; a series
    evaluated at no such length is scored over every common length, and says so."""
    keys = key_columns(rows)
    runs: dict[tuple, dict] = defaultdict(lambda: defaultdict(dict))
    train_max = {}
    for r in rows:
        key = dict(zip(keys, (r[k] for k in keys)))
        at = (key["task"], tuple((k, v) for k, v in key.items() if k != "task"))
        runs[at][replicate(r)][r["length"]] = r.get(metric, math.nan)
        train_max[at] = r["train_max"]
    out = {}
    for at, by_seed in runs.items():
        common = sorted(set.intersection(*(set(v) for v in by_seed.values())))
        beyond = [n for n in common if n > train_max[at]]
        scored = beyond or common
        out[at] = {"scores": {seed: sum(v[n] for n in scored) / len(scored) if scored else math.nan
                              for seed, v in sorted(by_seed.items())},
                   "lengths": scored, "beyond": bool(beyond)}
    return out
