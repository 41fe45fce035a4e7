"""Timing variants side by side: every benchmark's clock.

On a shared machine absolute times drift between minutes, so a benchmark never times one variant
in a block of its own steps and then the next: `alternate` calls the variants in turn (A, B, C,
A, B, C, ...), after warm-up rounds taken in the same order, so a slow spell hits every variant
alike. Each variant's samples are summarised by their median and spread (quartiles, min and max);
ratios come from samples of the same run: the ratio of the medians, and the median of the ratios
round by round (`paired`), which is steadier still when the machine's speed changes between
rounds.

    timings = alternate({"eager": eager_step, "compiled": compiled_step}, rounds=20, warmup=3)
    timings["eager"].median, timings["eager"].iqr, timings.ratio("eager", "compiled")

A variant takes the round's input when `draw` is given (the same batch for every variant of a
round), and may time itself (`returns_seconds`: it returns the seconds, or a list of them, that
it measured, e.g. in a child process). `sync` is called before the clock is read on each side of
a call (torch.cuda.synchronize on a GPU, whose calls return before the work is done).
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class Stats:
    """A variant's timed samples (seconds, in the order taken) and their summary."""

    samples: list[float]

    def __post_init__(self):
        if not self.samples:
            raise ValueError("no samples to summarise")

    @property
    def n(self) -> int:
        return len(self.samples)

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def min(self) -> float:
        return min(self.samples)

    @property
    def max(self) -> float:
        return max(self.samples)

    @property
    def q1(self) -> float:
        return quartiles(self.samples)[0]

    @property
    def q3(self) -> float:
        return quartiles(self.samples)[1]

    @property
    def iqr(self) -> float:
        low, high = quartiles(self.samples)
        return high - low

    def as_dict(self, scale: float = 1.0) -> dict:
        """The summary (and the samples) times `scale` (1000: milliseconds)."""
        return {"n": self.n, "median": self.median * scale, "q1": self.q1 * scale, "q3": self.q3 * scale,
                "min": self.min * scale, "max": self.max * scale, "samples": [s * scale for s in self.samples]}


def quartiles(samples: list[float]) -> tuple[float, float]:
    """(first, third) quartile, linear between order statistics (numpy's default, so a record
    reads the same as np.percentile of its samples); one sample is its own quartiles."""
    ordered = sorted(samples)
    if len(ordered) == 1:
        return ordered[0], ordered[0]

    def at(q: float) -> float:
        pos = q * (len(ordered) - 1)
        low = int(pos)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)
    return at(0.25), at(0.75)


@dataclass
class Timings:
    """What `alternate` measured: each variant's Stats, in the variants' order; the warm-up
    samples apart (a compilation shows there); the last value each variant returned; the calls in
    the order they were made; the variants that failed, with the first line of their error."""

    stats: dict[str, Stats] = field(default_factory=dict)
    warmup: dict[str, list[float]] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Stats:
        return self.stats[name]

    def __contains__(self, name: str) -> bool:
        return name in self.stats

    def median(self, name: str) -> float:
        return self.stats[name].median

    def ratio(self, a: str, b: str) -> float:
        """median(a) / median(b): how many times b's time a takes (a speed-up of b over a)."""
        return self.stats[a].median / self.stats[b].median

    def paired(self, a: str, b: str) -> Stats:
        """a's time over b's, round by round (the two calls of one round are seconds apart)."""
        return Stats([x / y for x, y in zip(self.stats[a].samples, self.stats[b].samples)])

    def as_dict(self, scale: float = 1.0) -> dict:
        """For a record: every variant's summary times `scale`, the order of one round, failures."""
        out = {name: s.as_dict(scale) for name, s in self.stats.items()}
        out.update({name: {"failed": why} for name, why in self.failed.items()})
        return out


def alternate(variants: dict[str, Callable], rounds: int, warmup: int = 1, *, draw: Callable[[], Any] | None = None,
              sync: Callable[[], None] | None = None, clock: Callable[[], float] = time.perf_counter,
              returns_seconds: bool = False, keep_going: bool = False) -> Timings:
    """Call the variants in turn, `warmup` untimed rounds then `rounds` timed ones.

    draw: called once per round (warm-up rounds too), outside the clock; its value is each
    variant's argument in that round. Without it the variants take no argument.
    returns_seconds: the variants time themselves and return seconds (a float or a list); the
    clock is not read.
    keep_going: a variant that raises is dropped (its error kept in Timings.failed) and the others
    go on; else the error propagates."""
    if rounds < 1 or warmup < 0:
        raise ValueError(f"rounds must be >= 1 and warmup >= 0, got {rounds} and {warmup}")
    timings = Timings(warmup={name: [] for name in variants})
    samples: dict[str, list[float]] = {name: [] for name in variants}
    live = dict(variants)
    for i in range(warmup + rounds):
        given = () if draw is None else (draw(),)
        for name, fn in list(live.items()):
            timings.order.append(name)
            try:
                seconds, timings.last[name] = _call(fn, given, sync, clock, returns_seconds)
            except Exception as err:
                if not keep_going:
                    raise
                text = str(err).strip().splitlines()
                timings.failed[name] = f"{type(err).__name__}: {text[0][:200] if text else ''}"
                del live[name]
                continue
            (samples if i >= warmup else timings.warmup)[name].extend(seconds)
    timings.stats = {name: Stats(samples[name]) for name in variants if name in live}
    return timings


def _call(fn, given, sync, clock, returns_seconds) -> tuple[list[float], Any]:
    if returns_seconds:
        out = fn(*given)
        return ([float(s) for s in out] if isinstance(out, (list, tuple)) else [float(out)]), out
    if sync is not None:
        sync()
    start = clock()
    out = fn(*given)
    if sync is not None:
        sync()
    return [clock() - start], out


def time_one(fn: Callable, rounds: int, warmup: int = 1, **options) -> Stats:
    """One variant alone (nothing to compare it with in the same run): its Stats."""
    return alternate({"only": fn}, rounds, warmup, **options)["only"]
