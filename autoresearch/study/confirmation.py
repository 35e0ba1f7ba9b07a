"""How a study applies its keep rule to its trials: which finished candidate is judged next,
against which incumbent, which fresh-seed re-runs that needs, the verdict, and which runs the
test split is finally read for.

This is the decision logic alone, on the journal's trial rows (plain dicts), with no journal,
executor or clock: the runner carries out what `next_decision` asks for (queue re-runs, record
a verdict), and `bench/bench_keep_rule.py` calls the same function on simulated trials, so the
error rates it measures are those of the code that decides real studies.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from autoresearch.evaluation.stats import (
    Estimate,
    RunTest,
    paired_difference,
    paired_exact_test,
    run_level_test,
)
from autoresearch.study.decisions import KeepRule, Verdicts, paired_items
from autoresearch.study.spec import WARMUP_ID

ACTIVE = ("queued", "running")
"""Trial statuses that may still produce a result."""
FINISHED = ("done", "kept", "discarded", "pruned")
"""Trial statuses of a trial that ran to its end (or was stopped by the pruner)."""
EVIDENCE_ROLES = ("bank", "confirm", "fresh")
"""Runs made to measure noise, confirm a finding or check it on test (`fresh`): they must be
fresh, never a replay of another study's run unless the study says so."""
BASELINE_ATTEMPTS = 2
"""A crashed baseline is run again once; crashing twice fails the study (every candidate is
judged against it)."""

Trial = dict[str, Any]


class Budget(Protocol):
    confirm_seeds: int
    max_confirm_trials: int
    seed_bank: int
    test_seeds: int


@dataclass(frozen=True)
class Wait:
    """Nothing can be decided until a trial that is queued or running finishes."""

    reason: str


@dataclass(frozen=True)
class Rerun:
    """`candidate` was ahead of `incumbent` on the first look: run these (contender, seed)
    pairs, then decide."""

    candidate: Trial
    incumbent: Trial
    missing: list[tuple[Trial, int]]
    seeds: list[int]


@dataclass(frozen=True)
class QueueSeedBank:
    """Run the base config on these seeds of the study's seed bank. Queued as soon as the
    baseline is: the first look of every candidate compares it with the bank's mean, and the
    pruning margin and the report's power analysis use the bank's run-to-run SD."""

    seeds: list[int]


@dataclass(frozen=True)
class Verdict:
    """The decision on `candidate`: kept (it becomes the incumbent) or discarded."""

    candidate: Trial
    incumbent: Trial | None
    rule: str
    """`reference`, `first look` or `confirmation`."""
    test: Any
    """The comparison the verdict rests on (None for the reference)."""
    kept: bool
    note: str
    runs: RunTest | None = None
    """The run-level comparison of a confirmation (runs as the unit of evidence)."""


@dataclass(frozen=True)
class RetryBaseline:
    """The baseline crashed: run it again before judging anything against it."""

    baseline: Trial


@dataclass(frozen=True)
class StudyFailed:
    """Nothing can be decided: the study must stop and say why."""

    reason: str


Decision = Wait | Rerun | QueueSeedBank | Verdict | RetryBaseline | StudyFailed


@dataclass(frozen=True)
class EvidenceSeeds:
    """Seeds of a study's evidence runs, drawn from its journaled evidence key (its first
    declaration: `journal.evidence_key`): another study gets other seeds, so its runs are fresh
    evidence and never the same cached runs; none is the first look's seed."""

    bank: list[int]
    """The seed bank: extra runs of the base config that measure run-to-run noise."""
    confirm: list[int]
    """Confirmation re-runs, the same for every contender (paired by seed)."""
    test: list[int] = field(default_factory=list)
    """Fresh runs of the kept and the base config for the test check (paired by seed)."""


def study_evidence_key(study_row: dict, study_seed: int) -> str | int:
    """The journaled evidence key; a journal from before keys were journaled drew its seeds
    from the study's `seed` alone, and keeps doing so, so its resume finds its own runs."""
    return study_row.get("evidence_key") or study_seed


def evidence_seeds(key: str | int, base_seed: int, budget: Budget) -> EvidenceSeeds:
    """The bank's, the confirmations' and the test check's seeds, drawn in that order (a budget
    with more test seeds leaves the others unchanged)."""
    rng = random.Random(f"autoresearch-evidence-seeds:{key}")
    drawn: list[int] = []
    banked = max(0, budget.seed_bank - 1)
    confirmed = banked + budget.confirm_seeds
    while len(drawn) < confirmed + budget.test_seeds:
        seed = rng.randrange(1, 2**31 - 1)
        if seed != base_seed and seed not in drawn:
            drawn.append(seed)
    return EvidenceSeeds(drawn[:banked], drawn[banked:confirmed], drawn[confirmed:])


def config_runs(trials: Sequence[Trial], config_key: str, roles: tuple[str, ...],
                usable: Callable[[Trial], bool]) -> list[Trial]:
    """One config's runs in `roles` that `usable` accepts, in journal order: the runs a first
    look, a confirmation or the test check treats as that config's replicates."""
    return [t for t in trials
            if t["config_key"] == config_key and t["role"] in roles and usable(t)]


def bank_runs(trials: Sequence[Trial]) -> list[Trial] | Wait:
    """The base config's runs that measure run-to-run noise: the baseline's first look and its
    seed-bank runs that finished (crashed ones drop out); `Wait` while any of them runs."""
    bank = [t for t in trials if t["role"] == "bank"]
    if any(t["status"] in ACTIVE for t in bank):
        return Wait("the seed bank is still running")
    baseline = [t for t in trials if t["role"] == "baseline"]
    return [t for t in baseline + bank if t["status"] != "crashed" and t.get("dev")]


def missing_bank_seeds(trials: Sequence[Trial], seeds: EvidenceSeeds) -> list[int]:
    """Seed-bank seeds with no run in the journal yet (all of them in a new study; some in a
    study resumed from a journal of a version that queued the bank later)."""
    banked = {t["seed"] for t in trials if t["role"] == "bank"}
    return [s for s in seeds.bank if s not in banked]


def incumbent_runs(trials: Sequence[Trial], incumbent: Trial) -> list[Trial] | Wait:
    """The incumbent's runs a first look compares a candidate with: every run of its config
    that no look selected (the baseline, its seed bank, the confirmation re-runs), so the
    comparison is with the config's mean rather than with one run's luck, which would otherwise
    judge every candidate of every study on this base against the same lucky or unlucky run.
    A kept candidate's own first look is left out (the look that picked it is biased upward):
    its confirmation re-runs stand for it. `Wait` while the seed bank runs."""
    roles = ("baseline", "bank", "confirm")
    if config_runs(trials, incumbent["config_key"], ("bank",), lambda t: t["status"] in ACTIVE):
        return Wait("the seed bank is still running")
    return config_runs(trials, incumbent["config_key"], roles,
                       lambda t: t["status"] in FINISHED and bool(t.get("dev"))) or [incumbent]


def bank_run_sd(trials: Sequence[Trial]) -> tuple[float, int] | None:
    """The run-to-run SD of the base config's dev accuracy and its degrees of freedom, once the
    seed bank has finished (None before, or with fewer than two finished runs)."""
    if not any(t["role"] == "bank" for t in trials):
        return None
    runs = bank_runs(trials)
    if isinstance(runs, Wait):
        return None
    scores = [float(t["dev_accuracy"]) for t in runs if t.get("dev_accuracy") is not None]
    if len(scores) < 2:
        return None
    return statistics.stdev(scores), len(scores) - 1


def next_candidate(trials: Sequence[Trial]) -> Trial | None:
    """The next finished, undecided baseline or proposal: the baseline first, then in the
    order they finished."""
    undecided = sorted(
        (t for t in trials if t["role"] in ("baseline", "explore") and t["status"] == "done"
         and t["decision"] is None),
        key=lambda t: (t["role"] != "baseline", t["finished"]))
    return undecided[0] if undecided else None


def next_decision(trials: Sequence[Trial], best_id: str | None, rule: KeepRule,
                  budget: Budget, seeds: EvidenceSeeds) -> Decision | None:
    """What to do next for the study whose trials are `trials` and whose incumbent is
    `best_id`; None when every finished candidate is decided."""
    baseline = next((t for t in trials if t["role"] == "baseline"), None)
    if best_id is None and baseline is not None and baseline["status"] == "crashed":
        if (baseline.get("attempts") or 0) < BASELINE_ATTEMPTS:
            return RetryBaseline(baseline)
        return StudyFailed(f"the baseline {baseline['id']} crashed "
                           f"{baseline.get('attempts') or 0} times: every candidate is judged "
                           "against it, so nothing can be decided")
    # The bank serves decisions: a study that can keep nothing spends nothing on it.
    if (rule.budget.confirmations and baseline is not None
            and baseline["status"] not in ("crashed", "stopped")):
        bank_missing = missing_bank_seeds(trials, seeds)
        if bank_missing:
            return QueueSeedBank(bank_missing)
    candidate = next_candidate(trials)
    if candidate is None:
        return None
    if best_id is None:
        if candidate["role"] == "baseline":
            return Verdict(candidate, None, "reference", None, True,
                           "the baseline is the first reference")
        if baseline is not None and baseline["status"] == "stopped":
            return Verdict(candidate, None, "reference", None, True,
                           "the baseline was stopped on request: the first finished trial is "
                           "the reference, and nothing was compared with the base config")
        return Wait("every candidate is judged against the baseline: waiting for it")
    incumbent = next(t for t in trials if t["id"] == best_id)
    reference = incumbent_runs(trials, incumbent)
    if isinstance(reference, Wait):
        return reference
    action, test = rule.first_look(candidate["dev"]["verdicts"],
                                   [t["dev"]["verdicts"] for t in reference])
    if action != "confirm":
        return Verdict(candidate, incumbent, "first look", test, False,
                       f"not ahead enough on the first look to confirm (against the mean of "
                       f"{len(reference)} run(s) of {incumbent['id']}'s config)")
    runs = replicates(candidate, incumbent, trials, budget, seeds.confirm)
    if isinstance(runs, Rerun | Wait):
        return runs
    bank = bank_runs(trials)
    if isinstance(bank, Wait):
        return bank
    if runs == "no budget":
        return Verdict(candidate, incumbent, "first look", test, False,
                       "ahead on the first look, but no confirmation budget left: not kept "
                       "without confirmation")
    if not runs[0]:
        return Verdict(candidate, incumbent, "first look", test, False,
                       "every confirmation re-run crashed")
    first = test
    action, test, run_test = rule.confirm(*runs, reference=[[t["dev"]["verdicts"]
                                                             for t in bank]])
    alpha = rule.budget.per_confirmation
    note = (f"fresh seeds only: per task one-sided p={test.p_value:.4g}, per run one-sided "
            f"p={run_test.p_value:.4g} ({run_test.describe_spread()}, "
            f"{len(bank)} seed-bank runs), both against alpha {alpha:.4g} per confirmation; the "
            f"selecting first look was {first.difference.value:+.3f} ({first.wins:g} wins, "
            f"{first.losses:g} losses)")
    return Verdict(candidate, incumbent, "confirmation", test, action == "keep", note, run_test)


def replicates(candidate: Trial, incumbent: Trial, trials: Sequence[Trial], budget: Budget,
               seeds: Sequence[int]) -> tuple[list[Verdicts], list[Verdicts]] | Wait | Rerun | str:
    """The verdicts of both contenders' fresh-seed re-runs, paired by seed; a `Rerun` for the
    ones not run yet (or "no budget" if they would overspend it); `Wait` while any runs. Only
    trials made as re-runs count (a proposal that happens to use a confirmation seed is not its
    own confirmation). The incumbent's re-runs are reused across candidates; a crashed re-run
    drops its seed from both sides."""
    seeds = list(seeds)
    if not seeds:
        return "no budget"
    found: dict[tuple[str, int], Trial] = {}
    missing: list[tuple[Trial, int]] = []
    for contender in (candidate, incumbent):
        for seed in seeds:
            match = next((t for t in trials if t["role"] == "confirm"
                          and t["config_key"] == contender["config_key"]
                          and t["seed"] == seed), None)
            if match is None:
                missing.append((contender, seed))
            else:
                found[(contender["id"], seed)] = match
    if missing:
        spent = sum(1 for t in trials if t["role"] == "confirm")
        if spent + len(missing) > budget.max_confirm_trials:
            return "no budget"
        return Rerun(candidate, incumbent, missing, seeds)
    if any(t["status"] in ACTIVE for t in found.values()):
        return Wait("confirmation re-runs are still running")
    candidate_runs: list[Verdicts] = []
    incumbent_runs: list[Verdicts] = []
    for seed in seeds:
        a, b = found[(candidate["id"], seed)], found[(incumbent["id"], seed)]
        if a["dev"] and b["dev"]:
            candidate_runs.append(a["dev"]["verdicts"])
            incumbent_runs.append(b["dev"]["verdicts"])
    return candidate_runs, incumbent_runs


def missing_test_runs(trials: Sequence[Trial], best_id: str | None,
                      seeds: EvidenceSeeds) -> list[tuple[Trial, int]]:
    """(contender, seed) runs the test check still needs: with a change kept by a confirmation,
    the kept config and the base config each on every test seed, none of them a run any dev
    decision read. A best that is only the reference (the baseline was stopped on request) was
    never compared with the base config: nothing is run again for it."""
    baseline = next((t for t in trials if t["role"] == "baseline"), None)
    if best_id is None or baseline is None or best_id == baseline["id"]:
        return []
    best = next(t for t in trials if t["id"] == best_id)
    if (best.get("decision") or {}).get("rule") != "confirmation":
        return []
    have = {(t["config_key"], t["seed"]) for t in trials if t["role"] == "fresh"}
    return [(contender, seed) for contender in (best, baseline) for seed in seeds.test
            if (contender["config_key"], seed) not in have]


def test_arms(trials: Sequence[Trial], best_id: str) -> tuple[list[Trial], list[Trial]]:
    """The runs the test split is read for, as (best config's arm, base config's arm): several
    independent runs per arm where the study has them. With a change kept, both arms are the
    fresh runs made for this check (`missing_test_runs`): runs whose luck no keep decision
    selected, so a false keep is confirmed on test no more often than chance allows. A study
    without them (`test_seeds: 0`, or a journal from before) reads the kept config's
    confirmation re-runs (never the first look that selected it) and the base config's runs.
    With nothing kept, the best is the baseline and only it is read (the base arm is empty):
    there is no change to check."""
    best = next(t for t in trials if t["id"] == best_id)
    baseline = next((t for t in trials if t["role"] == "baseline"), None)
    if baseline is None or best_id == baseline["id"]:
        return [best], []
    if any(t["role"] == "fresh" for t in trials):
        return (config_runs(trials, best["config_key"], ("fresh",), _evaluable),
                config_runs(trials, baseline["config_key"], ("fresh",), _evaluable))
    kept = config_runs(trials, best["config_key"], ("confirm",), _evaluable) or [best]
    base = config_runs(trials, baseline["config_key"], ("baseline", "bank", "confirm"),
                       _evaluable)
    return kept, base


def _evaluable(t: Trial) -> bool:
    """A finished run with a checkpoint the test split can be read from."""
    return t["status"] in FINISHED and bool(t.get("checkpoint"))


def dev_arms(trials: Sequence[Trial], best_id: str) -> tuple[list[Verdicts], list[Verdicts]]:
    """Dev verdicts of the runs that say how good each config is, none of them a run a look
    selected: the best config's confirmation re-runs (empty when the best is the baseline),
    and the base config's runs (the baseline, its seed bank and its re-runs)."""
    best = next(t for t in trials if t["id"] == best_id)
    baseline = next((t for t in trials if t["role"] == "baseline"), None)

    def scored(t: Trial) -> bool:
        return t["status"] in FINISHED and bool((t.get("dev") or {}).get("verdicts"))

    base = [] if baseline is None else [
        t["dev"]["verdicts"] for t in config_runs(
            trials, baseline["config_key"], ("baseline", "bank", "confirm"), scored)]
    if baseline is not None and best_id == baseline["id"]:
        return [], base
    kept = [t["dev"]["verdicts"] for t in config_runs(trials, best["config_key"], ("confirm",),
                                                       scored)]
    return kept, base


def test_warmup(trials: Sequence[Trial]) -> list[Trial]:
    """The warm-up the base config forked from, when it has a checkpoint: read with the test
    arms, so that RL against the warm-up is measured on test as well as on dev."""
    baseline = next((t for t in trials if t["role"] == "baseline"), None)
    warmup = warmup_of(baseline, list(trials)) if baseline is not None else None
    return [warmup] if warmup is not None and warmup.get("checkpoint") else []


def test_reads(trials: Sequence[Trial], best_id: str) -> list[Trial]:
    """Every run the study's one read of the test split covers: both test arms; the base
    config's other runs (seed bank, re-runs) when nothing was kept, so that the base config
    meets the warm-up on test with runs as the unit, as on dev; and the warm-up itself."""
    kept, base = test_arms(trials, best_id)
    best = next(t for t in trials if t["id"] == best_id)
    if not base and best["role"] == "baseline":
        base = config_runs(trials, best["config_key"], ("baseline", "bank", "confirm"),
                           _evaluable)
    reads: list[Trial] = []
    for row in [*kept, *base, *test_warmup(trials)]:
        if all(row["id"] != r["id"] for r in reads):
            reads.append(row)
    return reads


def test_verdicts(trials: Sequence[Trial], best_id: str, split: str = "test"
                  ) -> tuple[list[Verdicts], list[Verdicts]] | None:
    """Verdicts on `split` (test, or transfer, read in the same check) of the runs read for
    each arm (`test_arms`): the best config's and the base config's; None when the best is the
    baseline or an arm was not read."""
    kept, base = (
        [t[split]["verdicts"] for t in arm if (t.get(split) or {}).get("verdicts")]
        for arm in test_arms(trials, best_id))
    return (kept, base) if kept and base else None


def held_out_gain(kept: list[Verdicts], base: list[Verdicts]) -> tuple[Estimate, RunTest | None]:
    """The test check's estimate of best minus base: over runs where each arm has several (the
    run-level test, each run's luck in the interval), else paired task by task over the runs
    read (an interval that holds the answers' draws but not the runs' luck)."""
    if min(len(kept), len(base)) > 1:
        runs = run_level_test(kept, base)
        return runs.interval(), runs
    return paired_exact_test(kept, base).difference, None


def warmup_of(trial: Trial, trials: list[Trial]) -> Trial | None:
    """The warm-up row a trial forked from: the one whose checkpoint is the trial's
    `init_checkpoint` (a study may declare several), else the study's own warm-up."""
    warmups = [t for t in trials if t["role"] == "warmup"]
    start = (trial.get("config") or {}).get("init_checkpoint")
    return (next((w for w in warmups if start and w.get("checkpoint") == start), None)
            or next((w for w in warmups if w["id"] == WARMUP_ID), None))


def against_warmup(trial: Trial, warmup: Trial | None) -> Estimate | None:
    """The trial's dev score minus the warm-up checkpoint's it started from, paired per task
    (None without a scored warm-up or a scored trial): whether RL helped at all."""
    if warmup is None or not (warmup.get("dev") or {}).get("verdicts") or not trial.get("dev"):
        return None
    x, y = paired_items(trial["dev"]["verdicts"], warmup["dev"]["verdicts"])
    return paired_difference(x, y) if x else None
