"""The settings of the dependence measurement (eval.dependence_options; the measurement itself is
lengthgen.evaluation.dependence): plain data at the bottom of the import graph, beside the schema."""
from __future__ import annotations

import math
from dataclasses import dataclass

RANKS = ("attention", "leave_one_out")  # how the dependence measurement ranks far tokens


@dataclass
class Dependence:
    """The settings of the dependence measurement (eval.dependence_options, lengthgen.evaluation.dependence):
    its keywords are the options."""

    tau: float = 0.1  # nats: T* holds the tokens whose long-context benefit D(t) exceeds tau
    top_p: float = 10.0  # percent: also flag the top_p % of scored tokens by D (0 = off); D > 0 always
    epsilon: float = 0.1  # k(t) recovers at least (1 - epsilon) of D(t)
    rank: str = "attention"  # how far tokens are ranked: attention (one pass) or leave_one_out (full - near passes)
    max_tokens: int = 0  # search k for at most this many tokens of T*, evenly spaced over it (0 = all)
    random_baseline: bool = True  # also search k with the far tokens in a random order (k_random; -1 when off)

    def __post_init__(self):
        for key in ("tau", "top_p", "epsilon"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"{key} must be a finite number, got {value!r}")
        if self.tau < 0:
            raise ValueError(f"tau must be >= 0 (nats), got {self.tau}")
        if not 0 <= self.top_p <= 100:
            raise ValueError(f"top_p must be a percentage in [0, 100], got {self.top_p}")
        if not 0 <= self.epsilon < 1:
            raise ValueError(f"epsilon must be in [0, 1), got {self.epsilon}")
        if self.rank not in RANKS:
            raise ValueError(f"rank {self.rank!r} is unknown; choose from {', '.join(RANKS)}")
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens < 0:
            raise ValueError(f"max_tokens must be an integer >= 0, got {self.max_tokens!r}")
        if not isinstance(self.random_baseline, bool):
            raise ValueError(f"random_baseline must be true or false, got {self.random_baseline!r}")
