"""The keep rule: a trial replaces the best only when fresh runs confirm it, within an error
budget for the whole study.

Trials of a study are scored on the same fixed dev tasks, so a candidate is compared pairwise
with the incumbent (the best so far): per task, right or wrong (`stats.paired_exact_test`).

    first look    the candidate's one run against the incumbent's runs: the baseline's run and
                  its seed bank (queued with the baseline), or a kept config's confirmation
                  re-runs, each task's outcome averaged over them. Against the mean of several
                  runs, the luck of one baseline run (the same run for every study on this
                  base) does not decide which candidates go on. It only selects: a candidate
                  that is ahead with a one-sided exact p at most `select_p` (sign-flip test
                  over tasks; McNemar's with one incumbent run) is sent to confirmation; every
                  other one is discarded. Nothing is ever kept on the first look: the look
                  that picked a candidate out of many is biased upward (the winner's curse).
    confirmation  both contenders are re-run with fresh seeds (never the first look's). Each
                  task's outcome is averaged over those seeds, and the candidate is kept when
                  the exact one-sided sign-flip test of the per-task differences (for one seed,
                  the exact McNemar test) gives p at most the per-confirmation alpha, and so
                  does a test with runs as the unit (`stats.run_level_test`: each run's
                  accuracy one observation, the run-to-run spreads pooled with the baseline's
                  seed bank, or Welch's t where the candidate's runs spread clearly wider). A
                  run's own luck is shared by all its tasks, so the task-level test alone
                  treats one lucky run as many independent wins.
    error budget  the study's alpha (the chance that it keeps any change that is no better) is
                  split evenly (Bonferroni) over the most confirmations its budget allows, so it
                  holds whichever candidates are picked, in whatever order, however the tests
                  depend on each other.

A candidate that needs confirming when no confirmation budget is left is discarded, not kept.
Only the dev split is read; the test split is read once, for the final best against the base
config. `bench/bench_keep_rule.py` measures the false-keep rate and the power of this rule.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from autoresearch.evaluation.stats import (
    PairedTest,
    RunTest,
    detectable_gain,
    paired_exact_test,
    run_level_test,
)

Verdicts = Mapping[str, bool]
"""Task id -> whether the trial's answer matched the gold result."""

Action = Literal["keep", "discard", "confirm"]


class ConfirmationBudget(Protocol):
    """What a study declares about confirmations (`spec.Budget` has these fields)."""

    alpha: float
    confirm_seeds: int
    max_confirm_trials: int


@dataclass(frozen=True)
class ErrorBudget:
    """The study's chance of keeping a change that is no better, spread over its confirmations."""

    alpha: float = 0.05
    confirmations: int = 1
    """The most confirmations the study can run (each needs fresh candidate runs)."""
    spent: float = 0.0
    """Alpha already spent, by `used` confirmations decided under an earlier declaration."""
    used: int = 0

    @classmethod
    def for_study(cls, alpha: float, confirm_seeds: int, max_confirm_trials: int) -> ErrorBudget:
        """The first confirmation re-runs both contenders (2 * confirm_seeds trials); later
        ones at least the candidate (the best's re-runs are reused, and a kept candidate's
        confirmation runs are the re-runs of the new best)."""
        if not confirm_seeds or max_confirm_trials < 2 * confirm_seeds:
            return cls(alpha, 0)
        return cls(alpha, 1 + (max_confirm_trials - 2 * confirm_seeds) // confirm_seeds)

    @property
    def per_confirmation(self) -> float:
        if not self.used:
            return self.alpha / self.confirmations if self.confirmations else 0.0
        left = self.confirmations - self.used
        return max(0.0, self.alpha - self.spent) / left if left > 0 else 0.0

    @classmethod
    def journaled(cls, data: dict) -> ErrorBudget | None:
        """The budget in force, as an `error budget` event recorded it (None for an event that
        recorded no budget). A re-declaration before any confirmation records the first
        alpha with nothing spent: that budget, not the re-declared one, still holds when the
        study resumes again under the same re-declaration."""
        if "alpha" not in data or "confirmations" not in data:
            return None
        return cls(float(data["alpha"]), int(data["confirmations"]),
                   float(data.get("spent") or 0.0), int(data.get("used") or 0))

    def redeclared(self, first_alpha: float, spent: float, used: int) -> ErrorBudget:
        """This declaration's budget for a study that already decided `used` confirmations,
        spending `spent`: the study's alpha is never raised past the one it started with
        (choosing it after seeing results would not bound anything), and only what is left of
        it is split over the confirmations still allowed."""
        return ErrorBudget(min(self.alpha, first_alpha), self.confirmations, spent, used)

    def describe(self) -> str:
        if self.used:
            return (f"Error budget re-declared: alpha {self.alpha:g} for the whole study, of "
                    f"which {self.spent:.4g} was spent on {self.used} confirmation(s) already "
                    f"decided; the {max(0.0, self.alpha - self.spent):.4g} left is split over "
                    f"the {max(0, self.confirmations - self.used)} confirmation(s) still "
                    f"allowed: each keeps its candidate only at one-sided p <= "
                    f"{self.per_confirmation:.4g}.")
        if not self.confirmations:
            return (f"Error budget: alpha {self.alpha:g} for the whole study, but no confirmation "
                    "budget: no change can be kept.")
        return (f"Error budget: alpha {self.alpha:g} for the whole study (the chance of keeping "
                f"any change that is no better), split over at most {self.confirmations} "
                f"confirmation(s): each confirmation keeps its candidate only at one-sided "
                f"p <= {self.per_confirmation:.4g} (Bonferroni). First looks only select and "
                "spend none of it.")


@dataclass(frozen=True)
class KeepRule:
    budget: ErrorBudget = ErrorBudget()
    select_p: float = 0.2
    """A first look sends a candidate to confirmation when it is ahead with one-sided exact
    p at most this (0.5: ahead at all). Selecting harder spends the confirmation budget
    on likelier winners (measured by bench/bench_keep_rule.py); it costs no error budget."""
    run_level: bool = True
    """Also require the run-level test at a confirmation. False leaves the task-level test
    alone: the rule before runs were the unit, kept so `bench_keep_rule.py` can measure what
    it let through."""
    own_spreads: bool = True
    """The run-level test estimates each side's spread from its own runs (Welch). False pools
    one spread over every config: the rule before, which a candidate noisier than the base
    config defeats, kept so `bench_keep_rule.py` can measure it beside this one."""

    def first_look(self, candidate: Verdicts, incumbent: Verdicts | Sequence[Verdicts]
                   ) -> tuple[Action, PairedTest]:
        """The candidate's one run against the incumbent's runs (per task, their mean):
        "confirm" (promising) or "discard". Never "keep"."""
        test = paired_exact_test(candidate, incumbent, interval="t")
        promising = test.difference.value > 0 and (
            self.select_p >= 0.5 or test.p_value <= self.select_p)
        return ("confirm" if promising else "discard"), test

    def confirm(self, candidate_runs: Sequence[Verdicts], incumbent_runs: Sequence[Verdicts],
                reference: Sequence[Sequence[Verdicts]] = ()
                ) -> tuple[Action, PairedTest, RunTest]:
        """Fresh runs only (the first look is not pooled in): keep or discard.

        Two tests must both pass at the per-confirmation alpha: per task (the exact sign-flip
        test over tasks, which sees the noise of each answer) and per run (each run's accuracy
        one observation, `stats.run_level_test`: the spreads pooled with the `reference`
        runs, the seed bank, or Welch's t where the candidate's runs spread clearly wider: it
        sees the luck a run shares across all its tasks, which the task-level test cannot).
        Without run-to-run degrees of freedom nothing is kept."""
        if not candidate_runs or not incumbent_runs:
            raise ValueError("a confirmation needs at least one fresh run on each side")
        alpha = self.budget.per_confirmation
        test = paired_exact_test(candidate_runs, incumbent_runs, alpha=0.05)
        runs = run_level_test(candidate_runs, incumbent_runs, reference, self.own_spreads)
        keep = (alpha > 0 and test.difference.value > 0 and test.p_value <= alpha
                and (runs.p_value <= alpha or not self.run_level))
        return ("keep" if keep else "discard"), test, runs

    def describe(self) -> str:
        return (
            "The first look (the candidate's one run against the best's runs: the baseline "
            "and its seed bank, or a kept config's re-runs; paired per dev task) only selects: "
            f"a candidate ahead of the best's mean (one-sided exact sign-flip p <= "
            f"{self.select_p:g}) is re-run, with the best, on fresh seeds. It is kept only if "
            "those re-runs alone favour it at the per-confirmation alpha both per task "
            "(per-task outcomes averaged over seeds; exact one-sided McNemar / sign-flip test) "
            "and per run (each run's accuracy one observation; a one-sided t-test with one "
            "run-to-run spread pooled over both sides and the baseline's seed bank, or, where "
            "the candidate's runs spread clearly wider, Welch's t with each side's own; a "
            "side with one re-run borrows the other's spread). "
            "Without confirmation budget nothing is kept. " + self.budget.describe() + " Intervals "
            "are 95%: Newcombe's score interval for one seed, a bootstrap over tasks for "
            "several. The test split is read once, at the end, for runs no dev decision "
            "selected (fresh runs of a kept config and of the base config; with nothing kept, "
            "the base config's runs), with the warm-up beside them."
        )


ASSUMED_RUN_SD = 0.03
"""Run-to-run SD of a run's dev accuracy assumed before a study has measured its own: the 2-4
points measured on the demo's configurations (`bench/bench_keep_rule.py`)."""


def detectable_before_start(dev_tasks: int, run_sd: float, seed_bank: int,
                            confirm_seeds: int, budget: ErrorBudget) -> str:
    """What a confirmation can find, said before the study spends anything: the true dev gain
    found with 80% power, from the budget, the dev size and a run's expected spread (the
    declared prior, else `ASSUMED_RUN_SD`, never below one run's answer noise at accuracy 0.5,
    the widest case)."""
    if not budget.confirmations or not dev_tasks:
        return ("Before the study: its budget allows no confirmation, so no change can be kept "
                "whatever its size.")
    answer_noise = (0.25 / dev_tasks) ** 0.5
    spread = max(run_sd or ASSUMED_RUN_SD, answer_noise)
    df = max(1, max(seed_bank, 1) + 2 * confirm_seeds - 3)
    gain = detectable_gain(spread, df, confirm_seeds, budget.per_confirmation)
    source = "the declared" if run_sd else "an assumed"
    return (f"Before the study: with {dev_tasks} dev tasks, {confirm_seeds} confirmation "
            f"run(s) a side and one-sided p <= {budget.per_confirmation:.4g} per confirmation, "
            f"a confirmation, once reached, finds a true dev gain of about +{gain:.3f} with 80% "
            f"power when a run's dev accuracy varies by {spread:.3f} (the larger of {source} "
            f"run-to-run SD {run_sd or ASSUMED_RUN_SD:.3f} and one run's answer noise on "
            f"{dev_tasks} tasks, {answer_noise:.3f}); smaller gains are mostly discarded. The "
            "study's own chance of keeping such a change is lower: its first looks must pick "
            "the change out first, on one run each (bench/bench_keep_rule.py measures both). "
            "More dev tasks or more confirmation runs a side find smaller ones.")


def keep_rule_for(budget: ConfirmationBudget) -> KeepRule:
    """The keep rule of a study, from its declared budget."""
    return KeepRule(ErrorBudget.for_study(budget.alpha, budget.confirm_seeds,
                                          budget.max_confirm_trials))


RULE = KeepRule().describe()
"""The rule in words with the default budget (a study states its own in its journal)."""


def paired_items(candidate: Verdicts, incumbent: Verdicts) -> tuple[list[float], list[float]]:
    """Per-task outcomes on the tasks both were scored on, in a fixed order."""
    shared = sorted(set(candidate) & set(incumbent))
    return ([float(candidate[t]) for t in shared], [float(incumbent[t]) for t in shared])
