"""Confidence intervals and tests for accuracies and paired differences of accuracies.

Execution accuracy is a binomial proportion: its interval is Wilson's score interval (it stays
inside [0, 1] and behaves at small n or near 0 and 1, where the normal interval does not).

Two configs scored on the same tasks are compared pairwise. Only the discordant tasks carry
information: `wins` (only the candidate is right) and `losses` (only the incumbent is right).

- Test: under "no difference" each discordant task is a fair coin, so wins ~ Binomial(wins +
  losses, 1/2): the exact McNemar test. 4 wins and 0 losses out of 64 give a two-sided p of
  0.125, although a normal interval on the 64 differences excludes zero.
- Interval: Newcombe's hybrid score interval for paired proportions (his 1998 "method 10",
  built from two Wilson intervals and the correlation of the pair); unlike the normal interval
  it does not collapse to zero width when wins or losses are 0.
- Several seeds: each task's outcome is averaged over the seeds first and the tasks stay the
  unit of comparison; pooling (seed, task) pairs as if they were new tasks narrows the interval
  without any new information about new tasks. The test is then the exact sign-flip
  (permutation) test of the per-task mean differences, which for one seed is exactly the exact
  McNemar test; the interval is a bootstrap over tasks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from scipy.stats import binomtest, bootstrap
from scipy.stats import t as student_t
from statsmodels.stats.proportion import proportion_confint

Z95 = 1.959963984540054

Outcomes = Mapping[str, bool]
"""Task id -> whether one run of a config got that task right."""


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


def _alpha(z: float) -> float:
    return 2 * (1 - 0.5 * (1 + math.erf(z / math.sqrt(2))))


def wilson(successes: int, n: int, z: float = Z95) -> Estimate:
    """Wilson score interval (statsmodels), exact 0 and 1 at the edges."""
    if n <= 0:
        return Estimate(0.0, 0.0, 1.0, 0)
    low, high = proportion_confint(successes, n, alpha=_alpha(z), method="wilson")
    low = 0.0 if successes == 0 else max(0.0, float(low))  # rounding would leave 1e-17
    high = 1.0 if successes == n else min(1.0, float(high))
    return Estimate(successes / n, low, high, n)


@dataclass(frozen=True)
class PairedTable:
    """Counts of a paired 2x2 table: both right, only a right, only b right, both wrong."""

    both: int
    only_a: int
    only_b: int
    neither: int

    @property
    def n(self) -> int:
        return self.both + self.only_a + self.only_b + self.neither

    @classmethod
    def of(cls, a: Sequence[float], b: Sequence[float]) -> PairedTable:
        if len(a) != len(b):
            raise ValueError("paired samples must have the same length")
        if any(x not in (0, 1) for x in (*a, *b)):
            raise ValueError("a paired table needs binary (0/1) outcomes")
        pairs = list(zip(a, b))
        return cls(pairs.count((1, 1)), pairs.count((1, 0)), pairs.count((0, 1)),
                   pairs.count((0, 0)))


def newcombe_paired(table: PairedTable, alpha: float = 0.05) -> Estimate:
    """Newcombe's hybrid score interval for p_a - p_b on paired binary data (method 10 of his
    1998 paper on paired data): Wilson limits of each margin, combined with the estimated
    correlation of the two proportions (the phi coefficient, shrunk towards 0 by n/2 when
    positive, as Newcombe specifies)."""
    n = table.n
    if n == 0:
        return Estimate(0.0, -1.0, 1.0, 0)
    a_right, b_right = table.both + table.only_a, table.both + table.only_b
    p_a, p_b = a_right / n, b_right / n
    la, ua = proportion_confint(a_right, n, alpha=alpha, method="wilson")
    lb, ub = proportion_confint(b_right, n, alpha=alpha, method="wilson")
    margins = [a_right, n - a_right, b_right, n - b_right]
    phi = 0.0
    if all(margins):
        cross = table.both * table.neither - table.only_a * table.only_b
        if cross > n / 2:
            cross -= n / 2
        elif cross > 0:
            cross = 0
        phi = cross / math.sqrt(math.prod(margins))
    diff = p_a - p_b
    below = math.sqrt(max(0.0, (p_a - la) ** 2 - 2 * phi * (p_a - la) * (ub - p_b)
                          + (ub - p_b) ** 2))
    above = math.sqrt(max(0.0, (ua - p_a) ** 2 - 2 * phi * (ua - p_a) * (p_b - lb)
                          + (p_b - lb) ** 2))
    return Estimate(diff, max(-1.0, diff - below), min(1.0, diff + above), n)


def mcnemar_exact(wins: int, losses: int,
                  alternative: Literal["two-sided", "greater"] = "two-sided") -> float:
    """Exact McNemar p-value: wins ~ Binomial(wins + losses, 1/2) under no difference."""
    if wins + losses == 0:
        return 1.0
    return float(binomtest(wins, wins + losses, 0.5, alternative=alternative).pvalue)


def seed_means(runs: Sequence[Outcomes]) -> dict[str, float]:
    """Each task's outcome averaged over the runs (seeds) of one config, on the tasks every run
    was scored on: several seeds make a task's outcome less noisy, never more tasks."""
    if not runs:
        raise ValueError("seed_means needs at least one run")
    shared = set(runs[0]).intersection(*runs[1:])
    return {task: sum(float(r[task]) for r in runs) / len(runs) for task in sorted(shared)}


def sign_flip_p(differences: Sequence[float], seeds: int) -> float:
    """Exact one-sided p of the sign-flip test: P(sum of randomly signed |d_i| >= sum of d_i).

    With `seeds` runs per side the per-task differences are multiples of 1/seeds, so the null
    distribution is the convolution of small integer steps, computed exactly. For one seed
    this is the exact McNemar test."""
    steps = [round(abs(d) * seeds) for d in differences]
    observed = round(sum(d * seeds for d in differences))
    total = sum(steps)
    if total == 0:
        return 1.0
    dist = np.zeros(2 * total + 1)  # index = sum + total
    dist[total] = 1.0
    for s in steps:
        if s:
            dist = 0.5 * (np.roll(dist, s) + np.roll(dist, -s))
    return float(min(1.0, dist[observed + total:].sum()))


@dataclass(frozen=True)
class PairedTest:
    """A paired comparison of a candidate with an incumbent on the same tasks."""

    difference: Estimate
    """Mean over tasks of candidate - incumbent (per-task means over seeds), with its interval."""
    wins: float
    """Tasks only the candidate got right (with several seeds: the sum of positive per-task
    differences)."""
    losses: float
    p_value: float
    """One-sided exact p of "the candidate is no better" (McNemar / sign-flip)."""
    seeds: int

    def as_dict(self) -> dict[str, float]:
        return {**self.difference.as_dict(), "wins": self.wins, "losses": self.losses,
                "p_value": self.p_value, "seeds": self.seeds}


def _as_runs(outcomes: Outcomes | Sequence[Outcomes]) -> list[Outcomes]:
    return [outcomes] if isinstance(outcomes, Mapping) else list(outcomes)


def paired_exact_test(candidate: Outcomes | Sequence[Outcomes],
                      incumbent: Outcomes | Sequence[Outcomes],
                      alpha: float = 0.05, bootstrap_seed: int = 0,
                      interval: Literal["bootstrap", "t"] = "bootstrap") -> PairedTest:
    """Compare one or several runs (seeds) of a candidate with those of an incumbent.

    Per task, each side's outcomes are averaged over its runs; the tasks both sides were scored
    on are compared pairwise. One run each: exact McNemar and Newcombe's interval. Several:
    the exact sign-flip test and a bootstrap over tasks (BCa, fixed seed so a decision is
    reproducible) unless the seeds agree on every task; `interval="t"` gives a paired t
    interval there instead, for a look that only selects and is taken many times (a bootstrap
    costs about 10 ms). The interval's level is 1 - alpha (two-sided); the decision rests on
    the exact p-value."""
    cand_runs, inc_runs = _as_runs(candidate), _as_runs(incumbent)
    cand, inc = seed_means(cand_runs), seed_means(inc_runs)
    tasks = sorted(set(cand) & set(inc))
    x = np.array([cand[t] for t in tasks])
    y = np.array([inc[t] for t in tasks])
    d = x - y
    step = math.lcm(len(cand_runs), len(inc_runs))  # differences are multiples of 1/step
    estimate = (paired_t(d, alpha) if interval == "t" and step > 1
                else paired_difference(x.tolist(), y.tolist(), alpha, bootstrap_seed))
    return PairedTest(estimate,
                      float(d[d > 0].sum()), float(abs(d[d < 0].sum())),
                      sign_flip_p(d.tolist(), step), max(len(cand_runs), len(inc_runs)))


def paired_bootstrap(a: Sequence[float], b: Sequence[float], alpha: float = 0.05,
                     seed: int = 0, resamples: int = 1999) -> Estimate:
    """Mean of a - b with a bootstrap interval that resamples tasks (scipy, BCa)."""
    if len(a) != len(b):
        raise ValueError("paired samples must have the same length")
    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    n = len(d)
    if n == 0:
        return Estimate(0.0, -1.0, 1.0, 0)
    mean = float(d.mean())
    if n == 1 or np.all(d == d[0]):
        return Estimate(mean, mean if np.all(d == d[0]) and n > 1 else -1.0,
                        mean if np.all(d == d[0]) and n > 1 else 1.0, n)
    res = bootstrap((d,), np.mean, confidence_level=1 - alpha, n_resamples=resamples,
                    method="BCa", rng=np.random.default_rng(seed))
    low, high = float(res.confidence_interval.low), float(res.confidence_interval.high)
    if not (math.isfinite(low) and math.isfinite(high)):
        low, high = float(np.quantile(d, alpha / 2)), float(np.quantile(d, 1 - alpha / 2))
    return Estimate(mean, max(-1.0, low), min(1.0, high), n)


def paired_t(differences: Sequence[float], alpha: float = 0.05) -> Estimate:
    """Mean of paired differences with Student's t interval over them (clipped to [-1, 1])."""
    d = np.asarray(differences, dtype=float)
    n = len(d)
    mean = float(d.mean()) if n else 0.0
    if n < 2:
        return Estimate(mean, -1.0, 1.0, n)
    half = float(student_t.ppf(1 - alpha / 2, n - 1)) * float(d.std(ddof=1)) / math.sqrt(n)
    return Estimate(mean, max(-1.0, mean - half), min(1.0, mean + half), n)


def paired_difference(a: Sequence[float], b: Sequence[float], alpha: float = 0.05,
                      bootstrap_seed: int = 0) -> Estimate:
    """Mean of a - b over paired tasks: Newcombe's interval when every per-task outcome is 0 or
    1 (one seed, or seeds that agree), else a bootstrap over tasks (per-task seed means)."""
    if len(a) != len(b):
        raise ValueError("paired samples must have the same length")
    if all(v in (0, 1) for v in (*a, *b)):
        return newcombe_paired(PairedTable.of(list(a), list(b)), alpha)
    return paired_bootstrap(a, b, alpha, bootstrap_seed)


@dataclass(frozen=True)
class RunTest:
    """Runs as the unit: each run's accuracy on the shared tasks is one observation, so the
    luck a run shares across all its tasks (its seed, its sampling) is in the noise."""

    difference: float
    """Mean run accuracy of the candidate minus the incumbent's."""
    run_sd: float
    """Run-to-run standard deviation of a run's accuracy, pooled within groups."""
    df: int
    """Degrees of freedom of that estimate (runs minus groups)."""
    p_value: float
    """One-sided p of "the candidate is no better" (Student t, pooled variance)."""
    runs: tuple[int, int]
    """Runs of the candidate and of the incumbent."""

    def as_dict(self) -> dict[str, float]:
        return {"run_difference": self.difference, "run_sd": self.run_sd, "run_df": self.df,
                "run_p_value": self.p_value}

    def interval(self, alpha: float = 0.05) -> Estimate:
        """The difference with its two-sided 1 - alpha Student t interval: over runs, so it
        holds the luck of each run as well as the draws of its answers."""
        if self.df <= 0 or not math.isfinite(self.run_sd):
            return Estimate(self.difference, -1.0, 1.0, sum(self.runs))
        half = (float(student_t.ppf(1 - alpha / 2, self.df)) * self.run_sd
                * math.sqrt(1 / self.runs[0] + 1 / self.runs[1]))
        return Estimate(self.difference, max(-1.0, self.difference - half),
                        min(1.0, self.difference + half), sum(self.runs))


def run_accuracies(runs: Sequence[Outcomes], tasks: Sequence[str]) -> np.ndarray:
    """Each run's accuracy on `tasks`."""
    return np.array([np.mean([float(run[t]) for t in tasks]) for run in runs])


def _run_spread(sd: float, mean: float, tasks: int) -> float:
    """A run-to-run SD never below the binomial noise of one run's answers on `tasks` tasks
    at accuracy `mean`: runs that score alike are no proof of a spread of zero."""
    return max(sd, math.sqrt(mean * (1 - mean) / tasks))


def pooled_run_test(candidate: Sequence[Outcomes], incumbent: Sequence[Outcomes],
                    reference: Sequence[Sequence[Outcomes]] = ()) -> RunTest:
    """Is the candidate's mean run accuracy above the incumbent's, beyond run-to-run noise?

    Every run is scored on the same tasks (those all runs share), so task difficulty cancels;
    what varies between runs of one config is the run's own luck plus the draws of its answers.
    The variance of a run's accuracy is pooled over the candidate's runs, the incumbent's and
    any `reference` groups (for instance a seed bank of the baseline: runs of one config that
    are no side of this comparison), each around its own mean; the one-sided p is Student's t
    with that pooled variance. With no degrees of freedom there is no estimate and p is 1.

    The spread is never taken below the binomial noise of a run's answers on these tasks
    (p(1 - p) / tasks at the runs' mean accuracy): runs that happen to score alike, or that are
    the same bits (reproducible training on one seed), are no proof of a spread of zero, and a
    zero spread would make any difference certain."""
    groups = [list(candidate), list(incumbent), *(list(g) for g in reference if g)]
    runs = [set(run) for group in groups for run in group]
    tasks = sorted(set.intersection(*runs)) if runs else []
    if not candidate or not incumbent or not tasks:
        return RunTest(0.0, float("nan"), 0, 1.0, (len(candidate), len(incumbent)))
    accuracies = [run_accuracies(g, tasks) for g in groups]
    df = sum(len(a) for a in accuracies) - len(accuracies)
    squares = sum(float(((a - a.mean()) ** 2).sum()) for a in accuracies)
    difference = float(accuracies[0].mean() - accuracies[1].mean())
    if df <= 0:
        return RunTest(difference, float("nan"), 0, 1.0, (len(candidate), len(incumbent)))
    sd = _run_spread(math.sqrt(squares / df), float(np.mean(np.concatenate(accuracies))),
                     len(tasks))
    scale = sd * math.sqrt(1 / len(accuracies[0]) + 1 / len(accuracies[1]))
    if scale == 0:
        p = 0.0 if difference > 0 else 1.0
    else:
        p = float(student_t.sf(difference / scale, df))
    return RunTest(difference, sd, df, p, (len(candidate), len(incumbent)))


def run_mean(runs: Sequence[Outcomes], alpha: float = 0.05) -> Estimate:
    """One config's accuracy with runs as the unit: the mean of its runs' accuracies on the
    tasks they share, with a Student t interval over runs (the spread floored at a run's
    binomial answer noise, as in `pooled_run_test`); one run gives its Wilson interval over
    tasks, which leaves the run's own luck out."""
    runs = [run for run in runs if run]
    if not runs:
        return Estimate(0.0, 0.0, 1.0, 0)
    tasks = sorted(set.intersection(*(set(run) for run in runs)))
    if len(runs) == 1 or not tasks:
        run = runs[0]
        return wilson(sum(bool(v) for v in run.values()), len(run))
    accuracies = run_accuracies(runs, tasks)
    mean = float(accuracies.mean())
    sd = _run_spread(float(accuracies.std(ddof=1)), mean, len(tasks))
    half = float(student_t.ppf(1 - alpha / 2, len(runs) - 1)) * sd / math.sqrt(len(runs))
    return Estimate(mean, max(0.0, mean - half), min(1.0, mean + half), len(runs))


def detectable_gain(run_sd: float, df: int, seeds: int, alpha: float,
                    power: float = 0.8) -> float | None:
    """The smallest true gain a run-level comparison of `seeds` runs a side finds with
    `power`, given the run-to-run SD and its degrees of freedom (one-sided t at `alpha`)."""
    if df <= 0 or seeds <= 0 or alpha <= 0:
        return None
    return float((student_t.ppf(1 - alpha, df) + student_t.ppf(power, df))
                 * run_sd * (2 / seeds) ** 0.5)
