"""The keep rule carried out in the journal: `confirmation.next_decision` says what to do next
(decide, re-run, retry the baseline, give up); this journals it (verdicts, the seed bank and the
confirmation re-runs it queues), so the study loop only has to dispatch what is queued.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from autoresearch.rl.config import TrialConfig
from autoresearch.study.confirmation import (
    QueueSeedBank,
    Rerun,
    RetryBaseline,
    StudyFailed,
    Wait,
    against_warmup,
    evidence_seeds,
    missing_test_runs,
    next_decision,
    study_evidence_key,
    warmup_of,
)
from autoresearch.study.decision_text import decision_text
from autoresearch.study.decisions import KeepRule
from autoresearch.study.journal import Journal
from autoresearch.study.spec import Study

log = logging.getLogger(__name__)

TrialRow = Callable[..., dict[str, Any]]
"""Builds a queued trial's journal row: (number, role, config, changes, proposer, rationale,
best_config, best_id, replicate_of=...) as the runner numbers and places its trials."""


class DecisionsImpossible(RuntimeError):
    """The keep rule cannot decide anything (the baseline keeps crashing): the study fails."""


class KeepRuleJournal:
    """Applies the study's keep rule to its finished trials and journals every consequence."""

    def __init__(self, study: Study, journal: Journal, rule: KeepRule,
                 base: Callable[[], TrialConfig], trial_row: TrialRow) -> None:
        self.study, self.journal, self.rule = study, journal, rule
        self._base = base
        """The base config as it is now (after the warm-up, it starts from its checkpoint)."""
        self._trial_row = trial_row

    def decide(self) -> None:
        """Decide finished trials, in order, until one has to wait; raises
        `DecisionsImpossible` when nothing can ever be decided."""
        key = study_evidence_key(self.journal.study(), self.study.seed)
        seeds = evidence_seeds(key, self._base().seed, self.study.budget)
        while True:
            decision = next_decision(self.journal.trials(), self.journal.study()["best_trial"],
                                     self.rule, self.study.budget, seeds)
            if decision is None or isinstance(decision, Wait):
                return
            if isinstance(decision, StudyFailed):
                raise DecisionsImpossible(decision.reason)
            if isinstance(decision, RetryBaseline):
                baseline = decision.baseline
                self.journal.update_trial(baseline["id"], status="queued", error=None)
                self.journal.event("trial", "the baseline crashed; running it again (every "
                                   "candidate is judged against it)", baseline["id"])
                return
            if isinstance(decision, QueueSeedBank):
                self._queue_seed_bank(decision.seeds)
                continue
            if isinstance(decision, Rerun):
                self._queue_reruns(decision)
                return
            verdict = "kept" if decision.kept else "discarded"
            self._record(decision.candidate, decision.incumbent, decision.rule, decision.test,
                         verdict, decision.note, decision.runs)

    def queue_test_runs(self) -> bool:
        """Journal the fresh runs the test check reads when a change was kept (the kept and
        the base config on the study's test seeds); True when some were queued."""
        if not self.study.base_trial.eval.test_tasks or any(
                e["kind"] == "test plan" for e in self.journal.events()):
            return False  # nothing to read, or the one read already planned: no runs for it
        key = study_evidence_key(self.journal.study(), self.study.seed)
        seeds = evidence_seeds(key, self._base().seed, self.study.budget)
        best_id = self.journal.study()["best_trial"]
        missing = missing_test_runs(self.journal.trials(), best_id, seeds)
        if not missing:
            return False
        number = self.journal.next_number()
        rows = []
        for contender, seed in missing:
            config = TrialConfig.model_validate(contender["config"]).with_changes({"seed": seed})
            rows.append(self._trial_row(
                number, "fresh", config, contender["changes"] or {}, "test check",
                f"{contender['id']}'s config with seed {seed}: a fresh run for the test check, "
                "whose luck no dev decision selected", config, best_id,
                replicate_of=contender["id"]))
            number += 1
        self.journal.add_trials(rows)
        self.journal.event("test runs", f"the kept config and the base config on fresh seeds "
                           f"{seeds.test} for the test check", best_id,
                           queued=[r["id"] for r in rows])
        return True

    def _queue_seed_bank(self, seeds: list[int]) -> None:
        """Journal the seed bank: the base config on seeds of its own; with the baseline's run,
        its mean is what first looks compare with, and its spread the run-to-run noise every
        confirmation is judged against. Queued with the baseline."""
        number = self.journal.next_number()
        baseline = next(t for t in self.journal.trials() if t["role"] == "baseline")
        base = self._base()
        rows = []
        for seed in seeds:
            rows.append(self._trial_row(
                number, "bank", base.with_changes({"seed": seed}), {}, "seed bank",
                f"the base config with seed {seed}: with the baseline's own run, the seed bank "
                "that measures run-to-run noise", base, None, replicate_of=baseline["id"]))
            number += 1
        self.journal.add_trials(rows)
        self.journal.event("seed bank", f"the base config on {len(seeds)} more seeds {seeds} "
                           f"(with {baseline['id']}: {len(seeds) + 1} runs) measures run-to-run "
                           "noise", baseline["id"], seeds=seeds, queued=[r["id"] for r in rows])

    def _queue_reruns(self, rerun: Rerun) -> None:
        """Journal the confirmation re-runs a first look asked for; the loop starts them."""
        candidate, incumbent = rerun.candidate, rerun.incumbent
        number = self.journal.next_number()
        rows = []
        best_config = TrialConfig.model_validate(incumbent["config"])
        for contender, seed in rerun.missing:
            config = TrialConfig.model_validate(contender["config"]).with_changes({"seed": seed})
            rows.append(self._trial_row(
                number, "confirm", config, contender["changes"] or {}, "keep rule",
                f"re-run of {contender['id']} with seed {seed}: {candidate['id']} was ahead "
                f"of {incumbent['id']} on the first look", best_config,
                incumbent["id"], replicate_of=contender["id"]))
            number += 1
        self.journal.add_trials(rows)
        self.journal.event("decision", f"{candidate['id']} vs {incumbent['id']}: ahead on "
                           f"the first look; confirming on fresh seeds {rerun.seeds}",
                           candidate["id"], queued=[r["id"] for r in rows])

    def _record(self, candidate: dict[str, Any], incumbent: dict[str, Any] | None, rule: str,
                comparison: Any, verdict: str, note: str, runs: Any = None) -> None:
        diff = comparison.as_dict() if comparison is not None else {}
        if runs is not None:
            diff.update(runs.as_dict())
        warmups = self.journal.trials("role = ?", ["warmup"])
        vs_warmup = against_warmup(candidate, warmup_of(candidate, warmups))
        alpha = self.rule.budget.per_confirmation if rule == "confirmation" else None
        decision = {"verdict": verdict, "rule": rule, "against": incumbent and incumbent["id"],
                    **diff, "alpha": alpha, "note": note}
        if vs_warmup is not None:
            decision["vs_warmup"] = vs_warmup.as_dict()
        decision["conclusion"] = conclusion = decision_text(decision)
        self.journal.add_decision(
            {"candidate": candidate["id"], "incumbent": incumbent and incumbent["id"],
             "rule": rule, "difference": diff.get("value"), "low": diff.get("low"),
             "high": diff.get("high"), "n": diff.get("n"), "seeds": diff.get("seeds"),
             "wins": diff.get("wins"), "losses": diff.get("losses"),
             "p_value": diff.get("p_value"), "alpha": alpha,
             "verdict": verdict, "note": note, "conclusion": conclusion},
            {candidate["id"]: {"status": verdict, "decision": decision}},
            best_trial=candidate["id"] if verdict == "kept" else None)
        log.info("decision on %s: %s", candidate["id"], conclusion)
