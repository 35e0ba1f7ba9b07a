"""Confidence intervals for accuracies and differences of accuracies.

Execution accuracy is a binomial proportion: the Wilson score interval is used because it stays
inside [0, 1] and behaves at small n or near 0 and 1, where the normal interval does not. Two
trials evaluated on the same tasks are compared with a paired interval on the per-task
differences, which is much tighter than comparing two independent intervals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

Z95 = 1.959963984540054


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float
    n: int

    def as_dict(self) -> dict[str, float]:
        return {"value": self.value, "low": self.low, "high": self.high, "n": self.n}

    def __str__(self) -> str:
        return f"{self.value:.3f} [{self.low:.3f}, {self.high:.3f}] (n={self.n})"


def wilson(successes: int, n: int, z: float = Z95) -> Estimate:
    if n <= 0:
        return Estimate(0.0, 0.0, 1.0, 0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    low = 0.0 if successes == 0 else max(0.0, centre - half)  # exact at the edges, where
    high = 1.0 if successes == n else min(1.0, centre + half)  # rounding would leave 1e-17
    return Estimate(p, low, high, n)


def paired_difference(a: Sequence[float], b: Sequence[float], z: float = Z95) -> Estimate:
    """Mean of a - b over paired items with a normal-approximation interval."""
    if len(a) != len(b):
        raise ValueError("paired samples must have the same length")
    n = len(a)
    if n == 0:
        return Estimate(0.0, -1.0, 1.0, 0)
    diffs = [x - y for x, y in zip(a, b)]
    mean = sum(diffs) / n
    if n == 1:
        return Estimate(mean, -1.0, 1.0, 1)
    var = sum((d - mean) ** 2 for d in diffs) / (n - 1)
    half = z * math.sqrt(var / n)
    return Estimate(mean, mean - half, mean + half, n)
