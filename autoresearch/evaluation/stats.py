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
from scipy.stats import f as f_dist
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
    """Run-to-run standard deviation of the incumbent's runs (pooled with the reference
    groups'), floored at a run's answer noise."""
    df: float
    """Degrees of freedom of the test (Welch-Satterthwaite when each side has its own spread;
    else those of the one pooled estimate)."""
    p_value: float
    """One-sided p of "the candidate is no better" (Student t with `df`)."""
    runs: tuple[int, int]
    """Runs of the candidate and of the incumbent."""
    candidate_sd: float = float("nan")
    """The candidate's own run-to-run SD (its runs alone, floored), or `run_sd` when it has
    one run and its spread is assumed to be the incumbent's (`own_spread` False)."""
    standard_error: float = float("nan")
    """Standard error of `difference`."""
    own_spread: bool = False
    """The candidate's runs spread clearly wider than the incumbent's and were judged by their
    own spread (Welch); False: one spread for both sides."""

    def as_dict(self) -> dict[str, float]:
        return {"run_difference": self.difference, "run_sd": self.run_sd, "run_df": self.df,
                "run_p_value": self.p_value, "candidate_run_sd": self.candidate_sd,
                "own_spread": float(self.own_spread)}

    def describe_spread(self) -> str:
        """How the test's noise was estimated, for decision texts and the report."""
        if self.own_spread:
            return (f"run-to-run SD {self.candidate_sd:.3f} candidate, {self.run_sd:.3f} "
                    f"incumbent, Welch {self.df:.1f} df")
        return (f"run-to-run SD {self.run_sd:.3f}, {self.df:.0f} df, one spread for both "
                "sides")

    def interval(self, alpha: float = 0.05) -> Estimate:
        """The difference with its two-sided 1 - alpha Student t interval: over runs, so it
        holds the luck of each run as well as the draws of its answers."""
        if self.df <= 0 or not math.isfinite(self.standard_error):
            return Estimate(self.difference, -1.0, 1.0, sum(self.runs))
        half = float(student_t.ppf(1 - alpha / 2, self.df)) * self.standard_error
        return Estimate(self.difference, max(-1.0, self.difference - half),
                        min(1.0, self.difference + half), sum(self.runs))


def run_accuracies(runs: Sequence[Outcomes], tasks: Sequence[str]) -> np.ndarray:
    """Each run's accuracy on `tasks`."""
    return np.array([np.mean([float(run[t]) for t in tasks]) for run in runs])


def floored_run_spread(sd: float, mean: float, tasks: int) -> float:
    """A run-to-run SD never below the binomial noise of one run's answers on `tasks` tasks
    at accuracy `mean`: runs that score alike are no proof of a spread of zero. The accuracy
    is taken half a task from 0 and 1, so runs that all score 0 (or 1) still have a width."""
    shrunk = (mean * tasks + 0.5) / (tasks + 1)
    return max(sd, math.sqrt(shrunk * (1 - shrunk) / tasks))


WIDER_QUANTILE = 0.9
"""A candidate's runs count as spreading wider than the incumbent's when the ratio of their
variances passes this quantile of its F distribution under equal spreads. From two or three
runs a variance is rough: judging every candidate whose runs happen to differ more by its own
spread (Welch's df near 1) halved the power at +10 points, for a false-keep rate the F screen
holds about as well (`bench/keep_rule_results.md`)."""


def _wider(sd_c: float, df_c: int, sd_i: float, df_i: int) -> bool:
    """Do the candidate's runs spread clearly wider than the incumbent's (one-sided F)?"""
    return (sd_c / sd_i) ** 2 > float(f_dist.ppf(WIDER_QUANTILE, df_c, df_i))


def run_level_test(candidate: Sequence[Outcomes], incumbent: Sequence[Outcomes],
                   reference: Sequence[Sequence[Outcomes]] = (),
                   own_spreads: bool = True) -> RunTest:
    """Is the candidate's mean run accuracy above the incumbent's, beyond run-to-run noise?

    Every run is scored on the same tasks (those all runs share), so task difficulty cancels;
    what varies between runs of one config is the run's own luck plus the draws of its answers.

    The incumbent's spread is pooled over its runs and any `reference` groups (for instance a
    seed bank of the baseline: runs of one config that are no side of this comparison), each
    around its own mean. A candidate whose own runs spread clearly wider than that (an F
    screen at `WIDER_QUANTILE`) is judged by its own spread: Welch's t with Welch-Satterthwaite
    degrees of freedom, so a config that sometimes wrecks a run is not given the baseline's
    steadiness. Any other is judged with one spread pooled over both sides and the reference
    groups (Student's t, runs minus groups degrees of freedom). A candidate with one run has no
    spread of its own and is assumed to vary as the incumbent, which a noisier candidate
    defeats: a budget should give a confirmation two runs a side (`confirm_seeds >= 2`, the
    default). `own_spreads=False` always pools: the rule before, kept so `bench_keep_rule.py`
    can measure what it let through. With no degrees of freedom there is no estimate and p
    is 1.

    A spread is never taken below the binomial noise of a run's answers on these tasks
    (p(1 - p) / tasks at the runs' mean accuracy): runs that happen to score alike, or that are
    the same bits (reproducible training on one seed), are no proof of a spread of zero, and a
    zero spread would make any difference certain."""
    groups = [list(candidate), list(incumbent), *(list(g) for g in reference if g)]
    runs = [set(run) for group in groups for run in group]
    tasks = sorted(set.intersection(*runs)) if runs else []
    counts = (len(candidate), len(incumbent))
    if not candidate or not incumbent or not tasks:
        return RunTest(0.0, float("nan"), 0, 1.0, counts)
    accuracies = [run_accuracies(g, tasks) for g in groups]
    difference = float(accuracies[0].mean() - accuracies[1].mean())
    n_c, n_i = counts

    def spread(parts: list[np.ndarray]) -> tuple[float, int]:
        """Pooled SD of `parts` around their own means (floored), and its df."""
        df = sum(len(a) for a in parts) - len(parts)
        if df <= 0:
            return float("nan"), 0
        squares = sum(float(((a - a.mean()) ** 2).sum()) for a in parts)
        return floored_run_spread(math.sqrt(squares / df), float(np.concatenate(parts).mean()),
                           len(tasks)), df

    sd_c, df_c = spread(accuracies[:1])
    sd_i, df_i = spread(accuracies[1:])
    if own_spreads and df_c > 0 and df_i > 0 and _wider(sd_c, df_c, sd_i, df_i):
        v_c, v_i = sd_c**2 / n_c, sd_i**2 / n_i
        se = math.sqrt(v_c + v_i)
        df = (v_c + v_i) ** 2 / (v_c**2 / df_c + v_i**2 / df_i)
        own = True
    else:  # one spread for both sides, pooled over every group's runs
        sd, df = spread(accuracies)
        sd_c = sd_i = sd
        se = sd * math.sqrt(1 / n_c + 1 / n_i) if df > 0 else float("nan")
        own = False
    if df <= 0:
        return RunTest(difference, float("nan"), 0, 1.0, counts)
    p = float(student_t.sf(difference / se, df))
    return RunTest(difference, sd_i, df, p, counts, sd_c, se, own)


def run_mean(runs: Sequence[Outcomes], alpha: float = 0.05, clip: bool = True) -> Estimate:
    """One config's accuracy with runs as the unit: the mean of its runs' accuracies on the
    tasks they share, with a Student t interval over runs (the spread floored at a run's
    binomial answer noise, as in `run_level_test`); one run gives its Wilson interval over
    tasks, which leaves the run's own luck out. `clip=False` leaves the t interval's bounds
    outside [0, 1] as they are: what a difference from a fixed accuracy subtracts from."""
    runs = [run for run in runs if run]
    if not runs:
        return Estimate(0.0, 0.0, 1.0, 0)
    tasks = sorted(set.intersection(*(set(run) for run in runs)))
    if len(runs) == 1 or not tasks:
        run = runs[0]
        return wilson(sum(bool(v) for v in run.values()), len(run))
    accuracies = run_accuracies(runs, tasks)
    mean = float(accuracies.mean())
    sd = floored_run_spread(float(accuracies.std(ddof=1)), mean, len(tasks))
    half = float(student_t.ppf(1 - alpha / 2, len(runs) - 1)) * sd / math.sqrt(len(runs))
    if not clip:
        return Estimate(mean, mean - half, mean + half, len(runs))
    return Estimate(mean, max(0.0, mean - half), min(1.0, mean + half), len(runs))


def runs_and_questions_mean(runs: Sequence[Outcomes], alpha: float = 0.05) -> Estimate:
    """One config's accuracy as it would generalise to other runs and other questions: the
    mean over runs and the tasks they share, with a t interval whose variance combines both
    sources (a crossed two-way random-effects model: `(MS_runs + MS_tasks - MS_error) / (R Q)`,
    Satterthwaite's degrees of freedom, never below either main effect's own share). `run_mean`
    holds the questions fixed; this one does not. One run gives its Wilson interval."""
    runs = [run for run in runs if run]
    if not runs:
        return Estimate(0.0, 0.0, 1.0, 0)
    tasks = sorted(set.intersection(*(set(run) for run in runs)))
    if len(runs) == 1 or len(tasks) < 2:
        run = runs[0]
        return wilson(sum(bool(v) for v in run.values()), len(run))
    x = np.array([[float(bool(run[t])) for t in tasks] for run in runs])
    r, q = x.shape
    mean = float(x.mean())
    run_means, task_means = x.mean(1), x.mean(0)
    ms_runs = q * float(((run_means - mean) ** 2).sum()) / (r - 1)
    ms_tasks = r * float(((task_means - mean) ** 2).sum()) / (q - 1)
    resid = x - run_means[:, None] - task_means[None, :] + mean
    ms_error = float((resid ** 2).sum()) / ((r - 1) * (q - 1))
    combined = max(ms_runs + ms_tasks - ms_error, ms_runs, ms_tasks)
    if combined <= 0:  # every answer alike: a question's binomial noise, shrunk off 0 and 1
        combined = floored_run_spread(0.0, mean, q) ** 2 * r * q
    terms = (ms_runs ** 2 / (r - 1) + ms_tasks ** 2 / (q - 1)
             + ms_error ** 2 / ((r - 1) * (q - 1)))
    df = combined ** 2 / terms if terms > 0 else float(r - 1)
    half = float(student_t.ppf(1 - alpha / 2, max(df, 1.0))) * math.sqrt(combined / (r * q))
    return Estimate(mean, max(0.0, mean - half), min(1.0, mean + half), len(runs))


def detectable_gain(run_sd: float, df: int, seeds: int, alpha: float,
                    power: float = 0.8) -> float | None:
    """The smallest true gain a run-level comparison of `seeds` runs a side finds with
    `power`, given the run-to-run SD and its degrees of freedom (one-sided t at `alpha`)."""
    if df <= 0 or seeds <= 0 or alpha <= 0:
        return None
    return float((student_t.ppf(1 - alpha, df) + student_t.ppf(power, df))
                 * run_sd * (2 / seeds) ** 0.5)
