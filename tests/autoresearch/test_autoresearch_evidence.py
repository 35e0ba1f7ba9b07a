"""Evidence a study decides on is fresh and honest: the seed bank runs beside the baseline, a
crashed baseline is run again or fails the study, proposals outside the space are rejected, and
the test split is read for the trials planned, once."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoresearch.rl.config import TrialConfig
from autoresearch.study.confirmation import evidence_seeds, study_evidence_key
from autoresearch.study.journal import Journal
from autoresearch.study.proposers import Proposal, ProposalBatch
from autoresearch.study.runner import run_study
from autoresearch.study.spec import Study
from tests.autoresearch.study_helpers import SyntheticExecutor

SPACE = {"rl.adam.learning_rate": {"choices": [5e-5, 2e-4]}}


def _better(config: TrialConfig) -> float:
    return 0.7 if config.rl.adam.learning_rate == 2e-4 else 0.3


def _bank_seeds(study: Study, directory: Path) -> set[int]:
    run_study(study, directory, executor=SyntheticExecutor(lambda c: 0.3, tasks=32))
    return {t["seed"] for t in Journal(directory, read_only=True).trials()
            if t["role"] in ("bank", "confirm")}


def test_two_studies_on_the_same_base_draw_other_evidence_seeds(tmp_path: Path):
    """Studies differing in name (or anything else they declare) run their seed bank on other
    seeds, though both keep the default `seed: 0`; the same declaration run again in another
    directory reproduces its seeds."""
    budget = {"max_trials": 2, "confirm_seeds": 2, "max_confirm_trials": 4, "seed_bank": 3}
    first = Study(name="first", search_space=SPACE, budget=budget)
    second = Study(name="second", search_space=SPACE, budget=budget)
    one, other = _bank_seeds(first, tmp_path / "a"), _bank_seeds(second, tmp_path / "b")
    assert one and other and not one & other
    assert _bank_seeds(first, tmp_path / "again") == one


def test_a_journal_without_an_evidence_key_keeps_its_seeds_from_the_study_seed():
    """Journals written before the key was journaled resume on the seeds they started with."""
    assert study_evidence_key({"evidence_key": None}, 7) == 7
    assert study_evidence_key({}, 7) == 7
    assert study_evidence_key({"evidence_key": "spec-abc"}, 7) == "spec-abc"


def test_the_seed_bank_runs_the_base_config_on_the_studys_own_seeds(tmp_path: Path):
    study = Study(name="bank", seed=7, search_space=SPACE,
                  budget={"max_trials": 2, "confirm_seeds": 2, "max_confirm_trials": 4,
                          "seed_bank": 3})
    outcome = run_study(study, tmp_path, executor=SyntheticExecutor(_better, tasks=96))
    journal = Journal(tmp_path, read_only=True)
    trials = journal.trials()
    bank = [t for t in trials if t["role"] == "bank"]
    seeds = evidence_seeds(study_evidence_key(journal.study(), 7), study.base_trial.seed,
                           study.budget)
    assert sorted(t["seed"] for t in bank) == sorted(seeds.bank) and len(bank) == 2
    assert all(t["config_key"] == outcome.baseline["config_key"] for t in bank)
    confirms = [t for t in trials if t["role"] == "confirm"]
    assert {t["seed"] for t in confirms} == set(seeds.confirm)
    final = journal.decisions()[-1]
    assert final["verdict"] == "kept" and final["rule"] == "confirmation"
    assert "3 seed-bank runs" in final["note"]
    assert any(e["kind"] == "seed bank" for e in journal.events())
    report = outcome.report.read_text()
    assert "Run-to-run noise (seed bank)" in report
    assert "finds a true dev gain of about" in report and "with 80% power" in report
    assert "never below a run's answer noise" in report and "once reached" in report


def test_the_detectable_gain_grows_with_run_luck_and_shrinks_with_seeds():
    from autoresearch.evaluation.stats import detectable_gain

    small, large = detectable_gain(0.02, 4, 2, 0.05), detectable_gain(0.04, 4, 2, 0.05)
    assert large == pytest.approx(2 * small)
    assert detectable_gain(0.02, 4, 8, 0.05) == pytest.approx(small / 2)
    assert detectable_gain(0.02, 0, 2, 0.05) is None


def test_a_crashed_baseline_runs_again_and_a_second_crash_fails_the_study(tmp_path: Path):
    study = Study(name="crash", search_space={"rl.adam.learning_rate": {"choices": [2e-4]}},
                  budget={"max_trials": 2, "confirm_seeds": 0, "seed_bank": 0})
    base_lr = study.base_trial.rl.adam.learning_rate
    executor = SyntheticExecutor(_better, crash_if=lambda c: c.rl.adam.learning_rate == base_lr)
    run_study(study, tmp_path, executor=executor)
    journal = Journal(tmp_path, read_only=True)
    baseline = next(t for t in journal.trials() if t["role"] == "baseline")
    assert executor.calls.count(baseline["id"]) == 2
    assert journal.study()["state"] == "failed"
    assert journal.study()["best_trial"] is None
    assert any("crashed 2 times" in e["message"] for e in journal.events())


class _OutOfSpace:
    """A proposer that proposes a seed (not in the space) and an out-of-range value."""

    def propose(self, context, n: int) -> ProposalBatch:
        return ProposalBatch("stub", "sampled", [
            Proposal({"seed": 1}, "try the confirmation seed"),
            Proposal({"rl.adam.learning_rate": 3.0}, "far too high")])


def test_proposals_outside_the_search_space_are_rejected_with_a_reason(tmp_path: Path):
    study = Study(name="space", search_space=SPACE,
                  budget={"max_trials": 3, "confirm_seeds": 0, "seed_bank": 0})
    run_study(study, tmp_path, executor=SyntheticExecutor(_better), proposer=_OutOfSpace())
    journal = Journal(tmp_path, read_only=True)
    assert [t["role"] for t in journal.trials()] == ["baseline"]
    rejected = [e for e in journal.events() if "outside the search space" in e["message"]]
    assert len(rejected) >= 2
    assert "seed: not in the search space" in rejected[0]["message"]


def test_a_resume_never_reads_the_test_split_for_a_new_best(tmp_path: Path):
    study = Study(name="once", search_space=SPACE,
                  budget={"max_trials": 2, "confirm_seeds": 0, "seed_bank": 0})
    executor = SyntheticExecutor(_better, tasks=32)
    run_study(study, tmp_path, executor=executor)
    tested = [c for c in executor.calls if c.endswith("-test")]
    plan = [e for e in Journal(tmp_path, read_only=True).events() if e["kind"] == "test plan"]
    assert len(plan) == 1 and [f"{t}-test" for t in plan[0]["data"]["trials"]] == tested
    # A changed declaration could make another trial the best; the split was read already.
    journal = Journal(tmp_path)
    other = next(t["id"] for t in journal.trials() if t["id"] not in plan[0]["data"]["trials"])
    journal.set_study(best_trial=other)
    del journal
    run_study(study, tmp_path, executor=executor)
    assert [c for c in executor.calls if c.endswith("-test")] == tested
    events = Journal(tmp_path, read_only=True).events()
    assert any("not read again" in e["message"] for e in events)


def test_the_test_reads_run_side_by_side_and_one_failure_leaves_the_others(tmp_path: Path):
    """The final check's reads run together (up to the executor's width) and are journaled in
    the plan's order; a read that fails is reported and the others keep their results; a
    resume reads only the missing one."""
    study = Study(name="reads", search_space=SPACE, executor={"max_parallel_trials": 3},
                  budget={"max_trials": 2, "seed_bank": 3})
    failing = {"on": True}

    def crash_if(config: TrialConfig) -> bool:
        return failing["on"] and config.name.endswith("-test") and config.seed == 0

    executor = SyntheticExecutor(lambda c: 0.4, tasks=32, crash_if=crash_if, delay=0.2)
    reading, most = [], []
    trial_run = executor.run

    def run(job, sink):
        if job.id.endswith("-test"):
            reading.append(job.id)
            most.append(len(reading))
        try:
            return trial_run(job, sink)
        finally:
            if job.id in reading:
                reading.remove(job.id)

    executor.run = run
    run_study(study, tmp_path, executor=executor)
    journal = Journal(tmp_path, read_only=True)
    planned = next(e for e in journal.events() if e["kind"] == "test plan")["data"]["trials"]
    assert len(planned) == 3 and max(most) == 3
    read = {t["id"]: t["test_accuracy"] for t in journal.trials() if t["id"] in planned}
    failed = [e for e in journal.events() if "final test check of" in e["message"]]
    assert len(failed) == 1 and sum(v is None for v in read.values()) == 1
    assert sum(v is not None for v in read.values()) == len(planned) - 1
    failing["on"] = False
    before = len([c for c in executor.calls if c.endswith("-test")])
    run_study(study, tmp_path, executor=executor)
    assert len([c for c in executor.calls if c.endswith("-test")]) == before + 1
    journal = Journal(tmp_path, read_only=True)
    assert all(t["test_accuracy"] is not None for t in journal.trials() if t["id"] in planned)


def test_the_seed_bank_runs_in_the_baselines_round_where_slots_are_left(tmp_path: Path):
    """Rounds wait for their slowest trial; the bank, queued with the baseline, starts beside
    it when the executor has room, instead of making a round of its own."""
    study = Study(name="bank-round", search_space=SPACE, executor={"max_parallel_trials": 5},
                  budget={"max_trials": 3, "seed_bank": 3})
    executor = SyntheticExecutor(lambda c: 0.4, tasks=32, delay=0.3)
    run_study(study, tmp_path, executor=executor)
    trials = Journal(tmp_path, read_only=True).trials()
    first_round = [t for t in trials if t["role"] in ("baseline", "explore", "bank")]
    assert sorted(t["role"] for t in first_round)[:3] == ["bank", "bank", "baseline"]
    assert executor.max_active == len(first_round) >= 4
