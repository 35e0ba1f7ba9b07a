"""Multi-fidelity search on synthetic trials: candidates that trail beyond noise at an equal step
are pruned through Optuna's pruner, journaled as pruned, never kept, and their unspent steps go
to more candidates; the baseline and close candidates run to the end."""

from __future__ import annotations

import random
import time
from pathlib import Path

import optuna

from autoresearch.study.compare import compare
from autoresearch.study.confirmation import bank_run_sd
from autoresearch.study.journal import Journal
from autoresearch.study.pruning import NoiseMarginPruner, StudyPruning
from autoresearch.study.runner import resume_study, run_study
from autoresearch.study.spec import PruningSpec, Study
from tests.autoresearch.study_helpers import SyntheticExecutor

CHOICES = {"rl.adam.learning_rate": {"choices": [1e-4, 1e-6, 1e-7, 2e-7, 3e-7, 5e-7]}}
PRUNING = {"kind": "successive_halving", "every": 2, "dev_tasks": 48, "min_resource": 2,
           "reduction_factor": 3, "margin_z": 1.0}


def quality(config) -> float:
    """lr 1e-4 (the base) is good; the tiny learning rates are hopeless."""
    return 0.6 if config.rl.adam.learning_rate >= 1e-4 else 0.05


def _study(name: str, **extra) -> Study:
    spec = {"name": name, "search_space": CHOICES, "seed": 1,
            "base_trial": {"rl": {"steps": 6, "adam": {"learning_rate": 1e-4}},
                           "eval": {"every": 0}},
            "pruning": PRUNING, "budget": {"max_trials": 6, "confirm_seeds": 0}}
    spec.update(extra)
    return Study.model_validate(spec)


def test_hopeless_candidates_are_pruned_and_journaled_with_the_rule_numbers(tmp_path: Path):
    outcome = run_study(_study("prune"), tmp_path, executor=SyntheticExecutor(quality))
    journal = Journal(tmp_path, read_only=True)
    trials = {t["id"]: t for t in journal.trials()}
    assert trials["t0001"]["role"] == "baseline" and trials["t0001"]["status"] == "kept"
    pruned = [t for t in trials.values() if t["status"] == "pruned"]
    assert pruned, "no hopeless candidate was pruned"
    for t in pruned:
        assert t["role"] == "explore" and t["decision"] is None  # never a candidate
        assert t["dev_accuracy"] is None and t["steps"] == 2  # stopped at the first rung
        assert "pruned at RL step 2" in t["error"] and "noise margin" in t["error"]
    events = [e for e in journal.events() if e["kind"] == "pruning"]
    assert sorted(e["trial_id"] for e in events) == sorted(t["id"] for t in pruned)
    assert all(e["data"]["step"] == 2 for e in events)
    assert {d["candidate"] for d in journal.decisions()}.isdisjoint({t["id"] for t in pruned})
    assert outcome.best["id"] == "t0001"
    report = outcome.report.read_text()
    assert "## Pruning" in report and "## Dev accuracy along training" in report
    # The curve of every trial shows its subset scores during training.
    assert "rl-2: 0.0" in report or "rl-2: 0.02" in report


def test_the_baseline_and_candidates_within_noise_are_never_pruned(tmp_path: Path):
    # Every config is equally good: differences at a step are seed noise on 48 tasks.
    run_study(_study("noise"), tmp_path, executor=SyntheticExecutor(lambda c: 0.3))
    trials = Journal(tmp_path, read_only=True).trials()
    assert not [t for t in trials if t["status"] == "pruned"]


def test_the_steps_pruning_saves_go_to_more_candidates(tmp_path: Path):
    budget = {"max_trials": 20, "max_steps": 24, "confirm_seeds": 0}
    space = {"rl.adam.learning_rate": {"low": 1e-8, "high": 1e-4, "log": True}}
    plain = _study("plain", pruning={"kind": "none"}, budget=budget, search_space=space)
    run_study(plain, tmp_path / "plain", executor=SyntheticExecutor(quality))
    pruned = _study("saving", budget=budget, search_space=space)
    run_study(pruned, tmp_path / "pruned", executor=SyntheticExecutor(quality))
    without = Journal(tmp_path / "plain", read_only=True).trials()
    with_pruning = Journal(tmp_path / "pruned", read_only=True).trials()
    assert len(without) == 4  # 4 trials x 6 steps
    assert len(with_pruning) > len(without)
    spent = sum(t["steps"] if t["status"] == "pruned" else 6 for t in with_pruning)
    assert spent <= 24


def test_a_resumed_study_rebuilds_the_pruner_from_the_journal(tmp_path: Path):
    run_study(_study("again", budget={"max_trials": 4, "confirm_seeds": 0}), tmp_path,
              executor=SyntheticExecutor(quality))
    before = Journal(tmp_path, read_only=True).trials()
    more = _study("again", budget={"max_trials": 6, "confirm_seeds": 0})
    from autoresearch.study.runner import StudyRunner

    runner = StudyRunner(more, tmp_path, executor=SyntheticExecutor(quality))
    runner._replay_pruning()
    reported = runner.pruning._study.get_trials(deepcopy=False)
    assert len(reported) == len(before)  # one Optuna trial per study trial that reported
    assert {t.state for t in reported} <= {optuna.trial.TrialState.COMPLETE,
                                           optuna.trial.TrialState.PRUNED}
    resume_study(tmp_path, executor=SyntheticExecutor(quality))


def test_the_noise_margin_overrules_a_pruner_that_would_stop_a_close_trial():
    spec = PruningSpec(kind="successive_halving", every=2, min_resource=2, margin_z=1.0)
    pruning = StudyPruning(spec, n=48, max_resource=6)
    assert pruning.report("t0001", "baseline", 2, 0.30) is None
    # Behind the best at step 2, so successive halving alone would stop it: 0.25 vs 0.30 on
    # 48 tasks is well inside one standard error of a difference (about 0.09).
    assert pruning.report("t0002", "explore", 2, 0.25) is None
    numbers = pruning.report("t0003", "explore", 2, 0.02)
    assert numbers is not None and numbers["best"] == 0.30 and numbers["margin"] > 0.05
    assert isinstance(pruning.pruner, NoiseMarginPruner)
    # The baseline is reported but never pruned, however far behind.
    assert pruning.report("t0004", "baseline", 2, 0.0) is None


class JitteredExecutor(SyntheticExecutor):
    """Synthetic trials that take a random time each, from `jitter`'s own random stream."""

    def __init__(self, jitter: int, **kwargs):
        super().__init__(**kwargs)
        self._random = random.Random(jitter)

    def run(self, job, on_step):
        with self._lock:
            pause = self._random.uniform(0.0, 0.15)
        time.sleep(pause)
        return super().run(job, on_step)


def test_in_rounds_a_rerun_journals_the_same_study_whatever_the_trials_timing(tmp_path: Path):
    """Trials end in another order each time; proposals, pruning and decisions do not."""
    spec = {"executor": {"max_parallel_trials": 3, "schedule": "rounds"},
            "search_space": {"rl.adam.learning_rate": {"low": 1e-8, "high": 3e-4, "log": True}},
            "budget": {"max_trials": 9, "confirm_seeds": 1, "max_confirm_trials": 2}}
    for jitter in (1, 2):
        run_study(_study("rounds", **spec), tmp_path / f"run{jitter}",
                  executor=JitteredExecutor(jitter, quality=quality))
    journal = Journal(tmp_path / "run1", read_only=True)
    assert any(t["status"] == "pruned" for t in journal.trials())
    assert compare(tmp_path / "run1", tmp_path / "run2") == []


def test_in_rounds_a_trial_is_pruned_only_against_earlier_rounds():
    pruning = StudyPruning(PruningSpec.model_validate(PRUNING), 48, 6, rounds=True)
    pruning.start_round([], {})
    # Round 1: nothing to compare with, so nobody is pruned, whoever reports first.
    assert pruning.report("t0001", "baseline", 2, 0.9) is None
    assert pruning.report("t0002", "explore", 2, 0.0) is None
    finished = [{"id": f"t000{k}", "number": k, "role": r, "finished": 1.0 + k,
                 "dev_accuracy": v, "status": "done"}
                for k, r, v in ((1, "baseline", 0.9), (2, "explore", 0.0))]
    pruning.start_round(finished, {"t0001": [(2, 0.9)], "t0002": [(2, 0.0)]})
    stopped = pruning.report("t0003", "explore", 2, 0.0)
    assert stopped is not None and stopped["best"] == 0.9


def test_run_to_run_luck_widens_the_margin_from_the_prior_then_the_seed_bank():
    spec = PruningSpec(kind="successive_halving", every=2, min_resource=2, margin_z=1.0)
    # 0.30 vs 0.15 on 48 tasks: behind by about 1.8 binomial SEs, so pruned without run luck.
    tasks_only = StudyPruning(spec, n=48, max_resource=6)
    tasks_only.report("t0001", "baseline", 2, 0.30)
    assert tasks_only.report("t0002", "explore", 2, 0.15) is not None
    # A run-to-run SD of 10 points (each run's own luck) makes that gap noise.
    lucky = StudyPruning(spec.model_copy(update={"run_sd": 0.10}), n=48, max_resource=6)
    lucky.report("t0001", "baseline", 2, 0.30)
    assert lucky.report("t0002", "explore", 2, 0.15) is None
    # The seed bank's measurement replaces the prior for every later decision, rounds too.
    rounds = StudyPruning(spec, n=48, max_resource=6, rounds=True)
    finished = [{"id": "t0001", "number": 1, "role": "baseline", "finished": 1.0,
                 "dev_accuracy": 0.30, "status": "done"}]
    rounds.start_round(finished, {"t0001": [(2, 0.30)]})
    rounds.set_run_sd(0.10)
    assert rounds.report("t0002", "explore", 2, 0.15) is None
    rounds.set_run_sd(0.0)
    stopped = rounds.report("t0003", "explore", 2, 0.15)
    assert stopped is not None and stopped["run_sd"] == 0.0


def test_the_seed_banks_sd_is_known_only_once_the_bank_has_finished():
    def row(role: str, status: str, acc: float | None) -> dict:
        return {"role": role, "status": status, "dev_accuracy": acc,
                "dev": {"verdicts": {}} if acc is not None else None}

    trials = [row("baseline", "kept", 0.10), row("explore", "done", 0.5)]
    assert bank_run_sd(trials) is None  # no bank yet
    trials += [row("bank", "done", 0.14), row("bank", "running", None)]
    assert bank_run_sd(trials) is None  # still running
    trials[-1] = row("bank", "done", 0.12)
    sd, df = bank_run_sd(trials)
    assert df == 2 and abs(sd - 0.02) < 1e-12


def test_a_study_swaps_the_prior_for_its_seed_banks_sd_and_journals_it(tmp_path: Path):
    spec = {"budget": {"max_trials": 6, "confirm_seeds": 1, "max_confirm_trials": 4,
                       "seed_bank": 3},
            "pruning": {**PRUNING, "run_sd": 0.01},
            "search_space": {"rl.adam.learning_rate": {"choices": [1e-4, 2e-4, 1e-6]}}}
    run_study(_study("bank-margin", **spec), tmp_path,
              executor=SyntheticExecutor(lambda c: 0.3 + 0.1 * (c.rl.adam.learning_rate > 1e-4)))
    journal = Journal(tmp_path, read_only=True)
    measured = bank_run_sd(journal.trials())
    assert measured is not None
    events = [e for e in journal.events() if e["kind"] == "pruning margin"]
    assert len(events) == 1
    assert f"run-to-run SD {measured[0]:.3f} ({measured[1]} df)" in events[0]["message"]
    assert "in place of the prior 0.010" in events[0]["message"]
