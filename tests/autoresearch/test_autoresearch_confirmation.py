"""The keep rule's application to a study's trials (`confirmation.next_decision`), on journal
rows alone: the order candidates are judged in, the re-runs a first look asks for, budgets,
crashes and waiting."""

from __future__ import annotations

from autoresearch.study.confirmation import (
    EvidenceSeeds,
    QueueSeedBank,
    Rerun,
    RetryBaseline,
    StudyFailed,
    Verdict,
    Wait,
    evidence_seeds,
    next_decision,
)
from autoresearch.study.decisions import keep_rule_for
from autoresearch.study.spec import Budget

TASKS = [f"dev-{i:03d}" for i in range(60)]
BUDGET = Budget(max_trials=4, confirm_seeds=2, max_confirm_trials=4, seed_bank=0)
RULE = keep_rule_for(BUDGET)
SEEDS = EvidenceSeeds(bank=[], confirm=[1, 2])


def trial(number: int, role: str, key: str, right: int, seed: int = 0, status: str = "done",
          finished: float | None = None) -> dict:
    verdicts = {t: i < right for i, t in enumerate(TASKS)}
    return {"id": f"t{number:04d}", "role": role, "status": status, "decision": None,
            "finished": number if finished is None else finished, "config_key": key,
            "seed": seed, "dev": {"verdicts": verdicts} if status == "done" else None}


def test_the_baseline_is_judged_first_and_becomes_the_reference():
    trials = [trial(1, "explore", "b", 30, finished=0), trial(0, "baseline", "a", 10,
                                                                finished=5)]
    decision = next_decision(trials, None, RULE, BUDGET, SEEDS)
    assert isinstance(decision, Verdict) and decision.kept
    assert decision.candidate["id"] == "t0000" and decision.rule == "reference"


def test_candidates_wait_for_the_baseline_which_is_retried_once_then_fails_the_study():
    running = [trial(0, "baseline", "a", 10, status="running"), trial(1, "explore", "b", 30)]
    assert isinstance(next_decision(running, None, RULE, BUDGET, SEEDS), Wait)
    crashed = [trial(0, "baseline", "a", 10, status="crashed"), trial(1, "explore", "b", 30)]
    crashed[0]["attempts"] = 1
    decision = next_decision(crashed, None, RULE, BUDGET, SEEDS)
    assert isinstance(decision, RetryBaseline) and decision.baseline["id"] == "t0000"
    crashed[0]["attempts"] = 2
    decision = next_decision(crashed, None, RULE, BUDGET, SEEDS)
    assert isinstance(decision, StudyFailed) and "crashed 2 times" in decision.reason


def test_a_candidate_ahead_on_the_first_look_asks_for_fresh_seed_reruns_of_both():
    base, cand = trial(0, "baseline", "a", 10), trial(1, "explore", "b", 40)
    base["decision"] = {"verdict": "kept"}
    decision = next_decision([base, cand], "t0000", RULE, BUDGET, EvidenceSeeds([], [8, 9]))
    assert isinstance(decision, Rerun)
    assert decision.seeds == [8, 9]
    assert sorted((c["id"], s) for c, s in decision.missing) == [
        ("t0000", 8), ("t0000", 9), ("t0001", 8), ("t0001", 9)]


def test_confirmed_reruns_keep_and_a_behind_candidate_is_discarded_on_the_first_look():
    base, cand = trial(0, "baseline", "a", 10), trial(1, "explore", "b", 40)
    base["decision"] = {"verdict": "kept"}
    reruns = [trial(2 + i, "confirm", key, right, seed=seed, status="done")
              for i, (key, right, seed) in enumerate(
                  [("a", 10, 1), ("a", 11, 2), ("b", 41, 1), ("b", 39, 2)])]
    decision = next_decision([base, cand, *reruns], "t0000", RULE, BUDGET, SEEDS)
    assert isinstance(decision, Verdict) and decision.kept and decision.rule == "confirmation"
    assert decision.runs.p_value < 0.01 and decision.runs.df == 2  # 5 runs in 3 groups
    behind = trial(1, "explore", "b", 5)
    decision = next_decision([base, behind], "t0000", RULE, BUDGET, SEEDS)
    assert isinstance(decision, Verdict) and not decision.kept
    assert decision.rule == "first look"


def test_reruns_that_would_overspend_the_budget_discard_without_confirmation():
    base, cand = trial(0, "baseline", "a", 10), trial(1, "explore", "b", 40)
    base["decision"] = {"verdict": "kept"}
    spent = [trial(10 + i, "confirm", "z", 0, seed=50 + i) for i in range(3)]
    decision = next_decision([base, cand, *spent], "t0000", RULE, BUDGET, SEEDS)
    assert isinstance(decision, Verdict) and not decision.kept
    assert "no confirmation budget left" in decision.note


def test_running_reruns_wait_and_crashed_ones_drop_their_seed():
    base, cand = trial(0, "baseline", "a", 10), trial(1, "explore", "b", 40)
    base["decision"] = {"verdict": "kept"}
    reruns = [trial(2, "confirm", "a", 10, seed=1), trial(3, "confirm", "a", 10, seed=2),
              trial(4, "confirm", "b", 40, seed=1), trial(5, "confirm", "b", 40, seed=2,
                                                         status="running")]
    assert isinstance(next_decision([base, cand, *reruns], "t0000", RULE, BUDGET, SEEDS), Wait)
    reruns[-1] = trial(5, "confirm", "b", 0, seed=2, status="failed")
    reruns[0] = trial(2, "confirm", "a", 0, seed=1, status="failed")
    decision = next_decision([base, cand, *reruns], "t0000", RULE, BUDGET, SEEDS)
    assert isinstance(decision, Verdict) and not decision.kept
    assert decision.note == "every confirmation re-run crashed"


def test_a_proposal_on_a_confirmation_seed_is_not_its_own_confirmation():
    base, cand = trial(0, "baseline", "a", 10), trial(1, "explore", "b", 40)
    base["decision"] = {"verdict": "kept"}
    lookalike = trial(2, "explore", "b", 40, seed=1)  # same config and seed, but a proposal
    lookalike["decision"] = {"verdict": "discarded"}
    decision = next_decision([base, cand, lookalike], "t0000", RULE, BUDGET, SEEDS)
    assert isinstance(decision, Rerun)
    assert ("t0001", 1) in {(c["id"], s) for c, s in decision.missing}


def test_a_confirmation_waits_for_the_seed_bank_and_counts_its_runs():
    base, cand = trial(0, "baseline", "a", 10), trial(1, "explore", "b", 40)
    base["decision"] = {"verdict": "kept"}
    reruns = [trial(2 + i, "confirm", key, right, seed=seed)
              for i, (key, right, seed) in enumerate(
                  [("a", 10, 1), ("a", 11, 2), ("b", 41, 1), ("b", 39, 2)])]
    bank = [trial(7, "bank", "a", 12, seed=5, status="running"), trial(8, "bank", "a", 9, seed=6)]
    budget = Budget(max_trials=4, confirm_seeds=2, max_confirm_trials=4, seed_bank=3)
    trials = [base, cand, *reruns, *bank]
    assert isinstance(next_decision(trials, "t0000", RULE, budget, SEEDS), Wait)
    bank[0] = trial(7, "bank", "a", 12, seed=5)
    decision = next_decision(trials[:-2] + bank, "t0000", RULE, budget, SEEDS)
    assert isinstance(decision, Verdict) and decision.runs.df == 4  # 7 runs in 3 groups
    assert "3 seed-bank runs" in decision.note


def test_evidence_seeds_come_from_the_study_seed_and_avoid_the_first_looks():
    budget = Budget(confirm_seeds=2, seed_bank=3)
    one, again, other = (evidence_seeds(s, 0, budget) for s in (1, 1, 2))
    assert one == again and one != other
    assert len(one.bank) == 2 and len(one.confirm) == 2 and len(one.test) == 2
    assert len({*one.bank, *one.confirm, *one.test, 0}) == 7
    # More test seeds leave the bank's and the confirmations' seeds as they were (a journal
    # that resumes under a larger budget finds its own runs).
    more = evidence_seeds(1, 0, Budget(confirm_seeds=2, seed_bank=3, test_seeds=5))
    assert (more.bank, more.confirm, more.test[:2]) == (one.bank, one.confirm, one.test)


def test_the_seed_bank_is_queued_with_the_baseline_when_the_study_can_confirm():
    budget = Budget(max_trials=4, confirm_seeds=2, max_confirm_trials=4, seed_bank=3)
    seeds = EvidenceSeeds(bank=[5, 6], confirm=[1, 2])
    queued = [trial(0, "baseline", "a", 0, status="queued")]
    decision = next_decision(queued, None, keep_rule_for(budget), budget, seeds)
    assert isinstance(decision, QueueSeedBank) and decision.seeds == [5, 6]
    # one bank run journaled already (a resumed study): only the other is asked for
    decision = next_decision(queued + [trial(1, "bank", "a", 0, seed=5, status="queued")],
                             None, keep_rule_for(budget), budget, seeds)
    assert isinstance(decision, QueueSeedBank) and decision.seeds == [6]
    # a study that can keep nothing spends nothing on a bank
    none = Budget(max_trials=4, confirm_seeds=2, max_confirm_trials=0, seed_bank=3)
    assert next_decision(queued, None, keep_rule_for(none), none, seeds) is None


def test_the_first_look_compares_with_the_seed_banks_mean_not_one_lucky_baseline_run():
    budget = Budget(max_trials=4, confirm_seeds=2, max_confirm_trials=4, seed_bank=3)
    rule, seeds = keep_rule_for(budget), EvidenceSeeds(bank=[5, 6], confirm=[1, 2])
    base, cand = trial(0, "baseline", "a", 30), trial(3, "explore", "b", 28)
    base["decision"] = {"verdict": "kept"}
    bank = [trial(1, "bank", "a", 12, seed=5, status="running"), trial(2, "bank", "a", 12, seed=6)]
    assert isinstance(next_decision([base, *bank, cand], "t0000", rule, budget, seeds), Wait)
    # Against the lucky baseline run alone (30 right) the candidate (28) is behind; against the
    # mean of the base config's three runs (18) it is well ahead, so it goes on to confirm.
    bank[0] = trial(1, "bank", "a", 12, seed=5)
    decision = next_decision([base, *bank, cand], "t0000", rule, budget, seeds)
    assert isinstance(decision, Rerun) and decision.candidate["id"] == "t0003"
    alone = next_decision([base, cand], "t0000", RULE, BUDGET, SEEDS)  # no bank: one run
    assert isinstance(alone, Verdict) and alone.rule == "first look" and not alone.kept
    assert "1 run(s) of t0000's config" in alone.note


def test_a_kept_configs_first_look_is_not_what_later_candidates_are_judged_against():
    kept = trial(1, "explore", "b", 50)
    kept["decision"] = {"verdict": "kept"}
    reruns = [trial(2, "confirm", "b", 20, seed=1), trial(3, "confirm", "b", 22, seed=2)]
    later = trial(4, "explore", "c", 30)
    decision = next_decision([trial(0, "baseline", "a", 10) | {"decision": {}}, kept, *reruns,
                              later], "t0001", RULE, BUDGET, SEEDS)
    # 30 right is behind the selecting look (50) but ahead of the kept config's fresh re-runs
    # (21 on average): the look that picked it is biased upward and is left out.
    assert isinstance(decision, Rerun) and decision.incumbent["id"] == "t0001"
