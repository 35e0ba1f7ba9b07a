"""How a study applies its keep rule to its trials: which finished candidate is judged next,
against which incumbent, which fresh-seed re-runs that needs, and the verdict.

This is the decision logic alone, on the journal's trial rows (plain dicts), with no journal,
executor or clock: the runner carries out what `next_decision` asks for (queue re-runs, record
a verdict), and `bench/bench_keep_rule.py` calls the same function on simulated trials, so the
error rates it measures are those of the code that decides real studies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from autoresearch.study.decisions import KeepRule, Verdicts

ACTIVE = ("queued", "running")
"""Trial statuses that may still produce a result."""

Trial = dict[str, Any]


class Budget(Protocol):
    confirm_seeds: int
    max_confirm_trials: int


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


Decision = Wait | Rerun | Verdict


def confirmation_seeds(base_seed: int, budget: Budget) -> list[int]:
    """The seeds of the confirmation re-runs (never the first look's)."""
    return [base_seed + k for k in range(1, budget.confirm_seeds + 1)]


def next_candidate(trials: Sequence[Trial]) -> Trial | None:
    """The next finished, undecided baseline or proposal: the baseline first, then in the
    order they finished."""
    undecided = sorted(
        (t for t in trials if t["role"] in ("baseline", "explore") and t["status"] == "done"
         and t["decision"] is None),
        key=lambda t: (t["role"] != "baseline", t["finished"]))
    return undecided[0] if undecided else None


def next_decision(trials: Sequence[Trial], best_id: str | None, rule: KeepRule,
                  budget: Budget, base_seed: int) -> Decision | None:
    """What to do next for the study whose trials are `trials` and whose incumbent is
    `best_id`; None when every finished candidate is decided."""
    candidate = next_candidate(trials)
    if candidate is None:
        return None
    if best_id is None:
        baseline = next((t for t in trials if t["role"] == "baseline"), None)
        if candidate["role"] != "baseline" and baseline and baseline["status"] in ACTIVE:
            return Wait("every candidate is judged against the baseline: waiting for it")
        note = ("the baseline is the first reference" if candidate["role"] == "baseline"
                else "the baseline crashed: the first finished trial is the reference")
        return Verdict(candidate, None, "reference", None, True, note)
    incumbent = next(t for t in trials if t["id"] == best_id)
    action, test = rule.first_look(candidate["dev"]["verdicts"], incumbent["dev"]["verdicts"])
    if action != "confirm":
        return Verdict(candidate, incumbent, "first look", test, False,
                       "not ahead enough on the first look to confirm")
    runs = replicates(candidate, incumbent, trials, budget, base_seed)
    if isinstance(runs, (Wait, Rerun)):
        return runs
    if runs == "no budget":
        return Verdict(candidate, incumbent, "first look", test, False,
                       "ahead on the first look, but no confirmation budget left: not kept "
                       "without confirmation")
    if not runs[0]:
        return Verdict(candidate, incumbent, "first look", test, False,
                       "every confirmation re-run crashed")
    first = test
    action, test = rule.confirm(*runs)
    note = (f"fresh seeds only: one-sided p={test.p_value:.4g} vs alpha "
            f"{rule.budget.per_confirmation:.4g} per confirmation; the selecting first look "
            f"was {first.difference.value:+.3f} ({first.wins:g} wins, {first.losses:g} losses)")
    return Verdict(candidate, incumbent, "confirmation", test, action == "keep", note)


def replicates(candidate: Trial, incumbent: Trial, trials: Sequence[Trial], budget: Budget,
               base_seed: int) -> tuple[list[Verdicts], list[Verdicts]] | Wait | Rerun | str:
    """The verdicts of both contenders' fresh-seed re-runs, paired by seed; a `Rerun` for the
    ones not run yet (or "no budget" if they would overspend it); `Wait` while any runs. The
    incumbent's re-runs are reused across candidates; a crashed re-run drops its seed from
    both sides."""
    seeds = confirmation_seeds(base_seed, budget)
    if not seeds:
        return "no budget"
    found: dict[tuple[str, int], Trial] = {}
    missing: list[tuple[Trial, int]] = []
    for contender in (candidate, incumbent):
        for seed in seeds:
            match = next((t for t in trials if t["config_key"] == contender["config_key"]
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
