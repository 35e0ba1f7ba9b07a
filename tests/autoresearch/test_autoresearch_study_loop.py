"""The study loop on synthetic trials: parallel dispatch, budgets, crashes, re-runs, resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoresearch.cli import main
from autoresearch.study.confirmation import evidence_seeds, study_evidence_key
from autoresearch.study.journal import Journal
from autoresearch.study.runner import resume_study, run_study
from autoresearch.study.spec import Study
from tests.autoresearch.study_helpers import SyntheticExecutor

LR = {"rl.adam.learning_rate": {"low": 1e-5, "high": 1e-3, "log": True}}


def test_trials_run_in_parallel_up_to_the_declared_limit(tmp_path: Path):
    executor = SyntheticExecutor(lambda c: 0.3, delay=0.4)
    study = Study(name="par", search_space=LR, budget={"max_trials": 4, "confirm_seeds": 0},
                  executor={"max_parallel_trials": 2})
    run_study(study, tmp_path, executor=executor)
    assert executor.max_active == 2
    assert sorted(c for c in executor.calls if not c.endswith("-test")) == [
        "t0001", "t0002", "t0003", "t0004"]


def test_a_crashed_trial_is_recorded_with_its_error_and_the_study_goes_on(tmp_path: Path,
                                                                          capsys):
    executor = SyntheticExecutor(lambda c: 0.3,
                                 crash_if=lambda c: c.rl.adam.learning_rate > 1e-4)
    study = Study(name="crash", search_space=LR, budget={"max_trials": 6, "confirm_seeds": 0})
    run_study(study, tmp_path, executor=executor)
    trials = Journal(tmp_path, read_only=True).trials()
    assert len(trials) == 6
    crashed = [t for t in trials if t["status"] == "crashed"]
    assert crashed and all("loss became NaN" in t["error"] for t in crashed)
    assert all(t["status"] in ("kept", "discarded") for t in trials if t not in crashed)
    # The command line reads the same journal: status, and the report as HTML with curves.
    assert main(["status", str(tmp_path)]) == 0
    assert "crashed" in capsys.readouterr().out
    assert main(["report", str(tmp_path), "--format", "html"]) == 0
    page = (tmp_path / "report.html").read_text()
    assert "<svg" in page and "Crashed (" in page and "loss became NaN" in page


def test_the_step_budget_limits_how_many_trials_are_proposed(tmp_path: Path):
    study = Study(name="steps", search_space=LR, base_trial={"rl": {"steps": 20}},
                  budget={"max_trials": 10, "max_steps": 50, "confirm_seeds": 0})
    run_study(study, tmp_path, executor=SyntheticExecutor(lambda c: 0.3))
    journal = Journal(tmp_path, read_only=True)
    assert len(journal.trials()) == 2
    assert any("step budget" in e["message"] for e in journal.events())


def test_the_step_budget_counts_the_baseline_queued_in_the_same_batch(tmp_path: Path):
    # Four may run at once, but 50 steps hold only two 20-step trials: the baseline and one.
    study = Study(name="steps", search_space=LR, base_trial={"rl": {"steps": 20}},
                  budget={"max_trials": 10, "max_steps": 50, "confirm_seeds": 0},
                  executor={"max_parallel_trials": 4})
    run_study(study, tmp_path, executor=SyntheticExecutor(lambda c: 0.3))
    trials = Journal(tmp_path, read_only=True).trials()
    assert [t["role"] for t in trials] == ["baseline", "explore"]


def test_a_promising_candidate_is_re_run_with_new_seeds_before_it_is_kept(tmp_path: Path):
    # lr 2e-4 is truly better (0.75 vs 0.45) on 64 tasks.
    def quality(c):
        return 0.75 if c.rl.adam.learning_rate > 1e-4 else 0.45

    study = Study(name="conf", base_trial={"seed": 1},
                  search_space={"rl.adam.learning_rate": {"choices": [5e-5, 2e-4]}},
                  budget={"max_trials": 2, "confirm_seeds": 2, "max_confirm_trials": 4})
    executor = SyntheticExecutor(quality, tasks=64)
    outcome = run_study(study, tmp_path, executor=executor)
    journal = Journal(tmp_path, read_only=True)
    trials = {t["id"]: t for t in journal.trials()}
    # The seed bank is queued with the baseline, before the first proposal.
    assert [t["role"] for t in trials.values()][:4] == ["baseline", "bank", "bank", "explore"]
    candidate = next(t["id"] for t in trials.values() if t["role"] == "explore")
    confirms = [t for t in trials.values() if t["role"] == "confirm"]
    key = study_evidence_key(journal.study(), study.seed)
    seeds = evidence_seeds(key, 1, study.budget)  # the study's own fresh seeds
    assert sorted((t["replicate_of"], t["seed"]) for t in confirms) == sorted(
        (trial, seed) for trial in ("t0001", candidate) for seed in seeds.confirm)
    bank = [t for t in trials.values() if t["role"] == "bank"]
    assert sorted(t["seed"] for t in bank) == sorted(seeds.bank)
    decision = journal.decisions()[-1]
    # Decided on the fresh seeds alone: tasks stay tasks, seeds are averaged per task.
    assert decision["candidate"] == candidate and decision["rule"] == "confirmation"
    assert decision["seeds"] == 2 and decision["n"] == 64
    assert decision["p_value"] <= decision["alpha"] == 0.05  # one confirmation fits the budget
    assert outcome.best["id"] == candidate and trials[candidate]["status"] == "kept"
    # 2 trials, 4 re-runs, 2 seed-bank runs, 4 fresh runs for the test check (the kept and the
    # base config on the study's 2 test seeds), and the test split read for those 4
    fresh = [t for t in trials.values() if t["role"] == "fresh"]
    assert sorted((t["replicate_of"], t["seed"]) for t in fresh) == sorted(
        (trial, seed) for trial in ("t0001", candidate) for seed in seeds.test)
    assert len(executor.calls) == len(set(executor.calls)) == 2 + 4 + 2 + 4 + 4


def test_without_confirmation_budget_an_inconclusive_candidate_is_discarded(tmp_path: Path):
    study = Study(name="nobudget", search_space=LR,
                  budget={"max_trials": 5, "confirm_seeds": 2, "max_confirm_trials": 0})
    run_study(study, tmp_path, executor=SyntheticExecutor(lambda c: 0.5))
    journal = Journal(tmp_path, read_only=True)
    assert not [t for t in journal.trials() if t["role"] == "confirm"]
    ahead = [d for d in journal.decisions() if d["difference"] and d["difference"] > 0]
    assert all(d["verdict"] == "discarded" for d in ahead)
    assert all("no confirmation budget" in d["note"] or "not ahead enough" in d["note"]
               for d in ahead)


class Interrupting(SyntheticExecutor):
    """Stops the whole study (as a kill would) when a given trial starts."""

    def __init__(self, stop_at: str, **kwargs):
        super().__init__(lambda c: 0.3, **kwargs)
        self.stop_at = stop_at

    def run(self, job, on_step):
        if job.id == self.stop_at:
            raise KeyboardInterrupt
        return super().run(job, on_step)


def test_a_stopped_study_resumes_without_running_any_trial_twice(tmp_path: Path):
    study = Study(name="resume", search_space=LR, budget={"max_trials": 5, "confirm_seeds": 0},
                  executor={"max_parallel_trials": 2})
    first = Interrupting("t0003", delay=0.2)
    with pytest.raises(KeyboardInterrupt):
        run_study(study, tmp_path, executor=first)
    journal = Journal(tmp_path, read_only=True)
    before = {t["id"]: t["status"] for t in journal.trials()}
    assert before["t0003"] == "stopped" and journal.study()["state"] == "interrupted"
    assert journal.trial("t0003")["progress"]["interrupted"]
    second = SyntheticExecutor(lambda c: 0.3)
    outcome = resume_study(tmp_path, executor=second)
    finished_before = {i for i, s in before.items() if s in ("done", "kept", "discarded")}
    assert not finished_before & set(second.calls)
    assert "t0003" in second.calls and len(second.calls) == len(set(second.calls))
    trials = Journal(tmp_path, read_only=True).trials()
    assert [t["id"] for t in trials] == ["t0001", "t0002", "t0003", "t0004", "t0005"]
    assert all(t["status"] in ("kept", "discarded") for t in trials)
    assert outcome.report.exists()
