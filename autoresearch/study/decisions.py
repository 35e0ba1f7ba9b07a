"""The keep rule: a trial replaces the best only when the dev data says so beyond seed noise.

Two trials of a study are scored on the same fixed dev tasks, so they are compared pairwise: per
task, 1 if a trial's greedy answer executed to the gold result, else 0, and the interval is on the
mean of the per-task differences (`stats.paired_difference`). After one seed each, a candidate is

    discarded  when the difference is zero or negative;
    kept       when the 95% interval of (candidate - best) lies above zero and the study has no
               confirmation budget left;
    confirmed  otherwise: both contenders are re-run with extra seeds and the verdicts of all
               seeds are pooled (each candidate seed paired with the same seed of the best, per
               task); kept only if the pooled interval lies above zero and the re-runs on their
               own also favour the candidate. An inconclusive candidate with no budget left to
               confirm it is discarded.

A significant first look is replicated too when the budget allows: a study keeps the luckiest of
many candidates, so one seed's "significant" win is weaker evidence than it looks (on seed noise
alone, one look keeps about 4% of candidates; with the re-runs, about 2%, at the same power).
Only the dev split is read. Two runs of one config that differ only in their seed must not
replace each other, and this rule is tested on exactly that case.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from autoresearch.evaluation.stats import Estimate, paired_difference

Verdicts = Mapping[str, bool]
"""Task id -> whether the trial's answer matched the gold result."""

Action = Literal["keep", "discard", "confirm"]

RULE = (
    "A candidate replaces the best trial only when the 95% confidence interval of its paired "
    "dev-accuracy difference (same dev tasks, per-task verdicts) excludes zero. A positive "
    "difference, significant or not, is first replicated when the study's confirmation budget "
    "allows: both contenders are re-run with extra seeds, and the candidate is kept only if the "
    "interval of the pooled per-(seed, task) differences excludes zero and the re-runs alone "
    "favour it too. Without budget, a significant difference is kept and an inconclusive one "
    "discarded. The test split is never used to decide; it is read once, to report the final "
    "best against the baseline."
)


@dataclass(frozen=True)
class Comparison:
    difference: Estimate
    """Mean of candidate - incumbent over the paired (seed, task) items, with its interval."""
    seeds: int
    """Seeds pooled (1: the single-seed comparison)."""

    @property
    def significant(self) -> bool:
        return self.difference.n > 0 and self.difference.low > 0

    def as_dict(self) -> dict[str, float]:
        return {**self.difference.as_dict(), "seeds": self.seeds}


def paired_items(candidate: Verdicts, incumbent: Verdicts) -> tuple[list[float], list[float]]:
    """Per-task outcomes on the tasks both were scored on, in a fixed order."""
    shared = sorted(set(candidate) & set(incumbent))
    return ([float(candidate[t]) for t in shared], [float(incumbent[t]) for t in shared])


def compare(candidate_runs: Sequence[Verdicts], incumbent_runs: Sequence[Verdicts]) -> Comparison:
    """Pooled paired difference; run i of the candidate is paired with run i of the incumbent
    (same seed), so seed-to-seed variation shows in the interval instead of hiding in it."""
    if len(candidate_runs) != len(incumbent_runs) or not candidate_runs:
        raise ValueError("compare needs the same number (at least one) of runs on each side")
    a: list[float] = []
    b: list[float] = []
    for cand, inc in zip(candidate_runs, incumbent_runs):
        x, y = paired_items(cand, inc)
        a += x
        b += y
    return Comparison(paired_difference(a, b), len(candidate_runs))


def first_look(candidate: Verdicts, incumbent: Verdicts) -> tuple[Action, Comparison]:
    """After one seed each: discard, keep (significant) or confirm (positive, inconclusive).
    The runner replicates both non-discards when the budget allows."""
    comparison = compare([candidate], [incumbent])
    if comparison.significant:
        return "keep", comparison
    if comparison.difference.value <= 0:
        return "discard", comparison
    return "confirm", comparison


def after_confirmation(candidate_runs: Sequence[Verdicts],
                       incumbent_runs: Sequence[Verdicts]) -> tuple[Action, Comparison]:
    """Pooled over every seed; the re-runs alone must also favour the candidate, so one lucky
    first seed cannot carry the pool (the first look is why the re-runs were asked for)."""
    comparison = compare(candidate_runs, incumbent_runs)
    replication = (compare(candidate_runs[1:], incumbent_runs[1:])
                   if len(candidate_runs) > 1 else None)
    holds = replication is not None and replication.difference.value > 0
    return ("keep" if comparison.significant and holds else "discard"), comparison
