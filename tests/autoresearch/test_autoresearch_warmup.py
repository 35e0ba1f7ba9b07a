"""The study-level warm-up on synthetic trials: run once, journaled, every trial forks from it,
reused by a second study through the cache, resumed after a kill, a failure reported clearly."""

from __future__ import annotations

import re
from pathlib import Path

import duckdb
import pytest

from autoresearch.rl.config import TrialConfig
from autoresearch.study.journal import Journal
from autoresearch.study.report import write_report
from autoresearch.study.runner import resume_study, run_study
from autoresearch.study.spec import Study
from tests.autoresearch.study_helpers import SyntheticExecutor

LR = {"rl.adam.learning_rate": {"low": 1e-5, "high": 1e-3, "log": True}}
CHECKPOINT = "tinker://warmup/weights/final"


def _study(name: str, cache: Path, lr: float = 5e-4, **extra) -> Study:
    return Study(name=name, search_space=LR,
                 base_trial={"sft": {"steps": 0}, "rl": {"steps": 4}, "eval": {"every": 0}},
                 warmup={"sft": {"steps": 3, "batch_size": 4, "adam": {"learning_rate": lr}},
                         "cache_dir": str(cache)},
                 budget={"max_trials": 3, "confirm_seeds": 0}, **extra)


def _study_with_transfer(name: str, tmp_path: Path, space: dict, budget: dict) -> Study:
    """A warmed-up study whose final check reads transfer beside test."""
    return Study(name=name, search_space=space,
                 base_trial={"sft": {"steps": 0}, "rl": {"steps": 4},
                             "eval": {"every": 0, "transfer_tasks": 40}},
                 warmup={"sft": {"steps": 3, "batch_size": 4},
                         "cache_dir": str(tmp_path / "cache")},
                 budget=budget)


def test_the_warmup_runs_first_and_every_trial_starts_from_its_checkpoint(tmp_path: Path):
    executor = SyntheticExecutor(lambda c: 0.3)
    outcome = run_study(_study("warm", tmp_path / "cache"), tmp_path / "a", executor=executor)
    assert executor.calls[0] == "warmup" and executor.calls.count("warmup") == 1
    journal = Journal(tmp_path / "a", read_only=True)
    trials = journal.trials()
    warm = trials[0]
    assert warm["id"] == "warmup" and warm["role"] == "warmup" and warm["status"] == "done"
    assert warm["checkpoint"] == CHECKPOINT
    assert warm["config"]["sft"]["steps"] == 3 and warm["config"]["rl"]["steps"] == 0
    assert warm["config"]["eval"]["start"] and warm["config"]["eval"]["test_tasks"] == 0
    others = trials[1:]
    assert [t["role"] for t in others] == ["baseline", "explore", "explore"]
    assert all(t["config"]["init_checkpoint"] == CHECKPOINT for t in others)
    # The warm-up is no candidate and spends no exploration budget.
    assert warm["decision"] is None and len(others) == 3
    assert "## Warm-up" in outcome.report.read_text()
    assert (tmp_path / "cache").is_dir() and len(list((tmp_path / "cache").iterdir())) == 1


def test_a_second_study_with_the_same_warmup_reuses_it_and_a_changed_one_trains_again(
        tmp_path: Path):
    cache = tmp_path / "cache"
    run_study(_study("first", cache), tmp_path / "a", executor=SyntheticExecutor(lambda c: 0.3))
    second = SyntheticExecutor(lambda c: 0.3)
    run_study(_study("second", cache), tmp_path / "b", executor=second)
    assert "warmup" not in second.calls
    journal = Journal(tmp_path / "b", read_only=True)
    warm = journal.trial("warmup")
    assert warm["status"] == "done" and "Reused from the cache" in warm["rationale"]
    assert warm["steps"] == 0 and warm["checkpoint"] == CHECKPOINT  # no cost to this study
    assert any("reused" in e["message"] for e in journal.events())
    assert all(t["config"]["init_checkpoint"] == CHECKPOINT for t in journal.trials()[1:])

    changed = SyntheticExecutor(lambda c: 0.3)
    run_study(_study("third", cache, lr=1e-3), tmp_path / "c", executor=changed)
    assert changed.calls[0] == "warmup"
    assert len(list(cache.iterdir())) == 2


class Interrupting(SyntheticExecutor):
    """Dies (as a killed study would) in the middle of the warm-up, the first time only."""

    def __init__(self):
        super().__init__(lambda c: 0.3)
        self.killed = False

    def run(self, job, on_step):
        if job.id == "warmup" and not self.killed:
            self.killed = True
            raise KeyboardInterrupt
        return super().run(job, on_step)


def test_a_study_killed_during_the_warmup_resumes_it(tmp_path: Path):
    executor = Interrupting()
    with pytest.raises(KeyboardInterrupt):
        run_study(_study("kill", tmp_path / "cache"), tmp_path / "a", executor=executor)
    warm = Journal(tmp_path / "a", read_only=True).trial("warmup")
    assert warm["status"] == "stopped" and warm["progress"]["interrupted"]
    resume_study(tmp_path / "a", executor=executor)
    journal = Journal(tmp_path / "a", read_only=True)
    warm = journal.trial("warmup")
    assert warm["status"] == "done" and warm["attempts"] == 2
    assert [t["status"] for t in journal.trials()[1:]] != []


def test_a_failed_warmup_ends_the_study_with_a_clear_error_and_a_resume_retries_it(
        tmp_path: Path):
    broken = SyntheticExecutor(lambda c: 0.3, crash_if=lambda c: c.rl.steps == 0)
    outcome = run_study(_study("fail", tmp_path / "cache"), tmp_path / "a", executor=broken)
    journal = Journal(tmp_path / "a", read_only=True)
    assert journal.study()["state"] == "failed" and outcome.best is None
    warm = journal.trial("warmup")
    assert warm["status"] == "crashed" and "loss became NaN" in warm["error"]
    assert len(journal.trials()) == 1  # no trial started without its starting weights
    assert "The warm-up is crashed" in write_report(tmp_path / "a").read_text()
    resume_study(tmp_path / "a", executor=SyntheticExecutor(lambda c: 0.3))
    journal = Journal(tmp_path / "a", read_only=True)
    assert journal.trial("warmup")["status"] == "done" and len(journal.trials()) == 4


def test_a_warmup_without_training_steps_is_refused_when_declared():
    with pytest.raises(ValueError, match="SFT steps, RL steps"):
        Study(name="bad", base_trial={"rl": {"steps": 2}, "eval": {"every": 0}}, search_space=LR,
              warmup={"sft": {"steps": 0}})


def test_the_wall_clock_budget_does_not_count_the_warmup(tmp_path: Path):
    class SlowWarmup(SyntheticExecutor):
        def run(self, job, on_step):
            self.delay = 8.0 if job.id == "warmup" else 0.0
            return super().run(job, on_step)

    study = _study("wall", tmp_path / "cache").model_copy(update={"budget": Study.model_validate(
        {"budget": {"max_trials": 3, "confirm_seeds": 0, "max_wall_seconds": 6.0}}).budget})
    executor = SlowWarmup(lambda c: 0.3)
    run_study(study, tmp_path / "a", executor=executor)
    assert executor.calls[:2] == ["warmup", "t0001"]  # the search still had its 6 seconds


def test_the_report_does_not_count_what_the_runner_adds_to_every_trial_as_a_change(
        tmp_path: Path):
    # Every trial gets the warm-up's checkpoint; the base config staying best has no differences.
    run_study(_study("flat", tmp_path / "cache"), tmp_path / "a",
              executor=SyntheticExecutor(lambda c: 0.3))
    report = (tmp_path / "a" / "report.md").read_text()
    best_config = report.split("## Best config", 1)[1].split("\n## ", 1)[0]
    assert "the base config stays the best" in report
    assert "init_checkpoint" in best_config  # shown in the config itself ...
    assert "| field | base | best |" not in best_config  # ... but not as a difference


def test_the_wall_clock_budget_does_not_count_the_time_the_study_was_down(tmp_path: Path):
    def budget(max_trials: int) -> Study:
        return _study("down", tmp_path / "cache").model_copy(update={"budget": Study.model_validate(
            {"budget": {"max_trials": max_trials, "confirm_seeds": 0,
                        "max_wall_seconds": 60.0}}).budget})

    run_study(budget(1), tmp_path / "a", executor=SyntheticExecutor(lambda c: 0.3))
    # Down for ten minutes, far longer than the whole budget: everything it wrote moves back.
    with duckdb.connect(str(tmp_path / "a" / "journal.duckdb")) as db:
        db.execute("UPDATE study SET created = created - 600, updated = updated - 600")
        for table in ("events", "steps", "evals", "proposals", "decisions"):
            db.execute(f"UPDATE {table} SET time = time - 600")
    later = SyntheticExecutor(lambda c: 0.3)
    run_study(budget(2), tmp_path / "a", executor=later)
    assert later.calls == ["t0002"]  # the search had time left, so it proposed again
    down = [e for e in Journal(tmp_path / "a", read_only=True).events()
            if (e["data"] or {}).get("down_seconds")]
    assert len(down) == 1 and down[0]["data"]["down_seconds"] >= 600


def test_remote_checkpoint_exists_asks_the_server_itself(sql_server, sql_model_dir):
    """Against a real server: a saved checkpoint exists, a missing one and another key's do
    not."""
    import tinker

    from autoresearch.study.warmup import remote_checkpoint_exists
    from tests.server.server_helpers import new_run

    with tinker.ServiceClient(base_url=sql_server.url, api_key="tml-warmup-owner") as service:
        run = new_run(service, str(sql_model_dir), seed=3)
        saved = run.save_state("warm").result().path
    assert remote_checkpoint_exists(sql_server.url, "tml-warmup-owner", saved)
    assert not remote_checkpoint_exists(sql_server.url, "tml-warmup-owner",
                                        saved.replace("/warm", "/never-saved"))
    assert not remote_checkpoint_exists(sql_server.url, "tml-someone-else", saved)


def test_every_trial_is_compared_with_the_warmup_and_the_report_says_when_rl_made_it_worse(
        tmp_path: Path):
    # The warm-up's weights answer 60% of dev; every RL trial forked from them answers 20%.
    executor = SyntheticExecutor(lambda c: 0.6 if c.rl.steps == 0 else 0.2, tasks=96)
    outcome = run_study(_study("worse", tmp_path / "cache"), tmp_path / "a", executor=executor)
    journal = Journal(tmp_path / "a", read_only=True)
    decided = [t for t in journal.trials() if t["decision"]]
    assert decided and all(t["decision"]["vs_warmup"]["high"] < 0 for t in decided)
    report = outcome.report.read_text()
    assert "## Against the warm-up" in report
    assert (f"One run each, over tasks: RL's run scored below the warm-up it started from in "
            f"{len(decided)} of") in report
    assert "beyond noise in" not in report  # one run's task interval is no verdict on a config
    assert "The best config's run scored below stopping after the warm-up" in report
    # the sentence to quote takes runs as the unit: the base config's runs, the warm-up's score
    assert re.search(r"With runs as the unit, the base config's RL fell below the warm-up "
                     r"\(warmup\): mean dev accuracy 0\.\d{3} over \d+ run\(s\) against 0\.\d{3}",
                     report)
    # the warm-up is read with the test check, so the same comparison is made on test
    warmup = journal.trial("warmup")
    assert warmup["test"] and warmup["test_accuracy"] is not None
    assert re.search(r"On the test split, read once with the warm-up beside them: With runs "
                     r"as the unit, the base config's RL .* the warm-up \(warmup\): mean test "
                     r"accuracy", report)


def test_with_nothing_kept_the_seed_bank_meets_the_warmup_on_test_with_runs_as_the_unit(
        tmp_path: Path):
    """The single test read covers the base config's seed bank when no change was kept, so
    the sentence about RL against the warm-up is over runs on test as on dev."""
    def quality(config: TrialConfig) -> float:  # the warm-up; the base config; any change
        if config.rl.steps == 0:
            return 0.6
        return 0.2 if config.rl.adam.learning_rate == TrialConfig().rl.adam.learning_rate else 0.05

    executor = SyntheticExecutor(quality, tasks=96)
    study = _study_with_transfer("bank-on-test", tmp_path, LR,
                                 {"max_trials": 3, "confirm_seeds": 1, "max_confirm_trials": 2,
                                  "seed_bank": 3})
    outcome = run_study(study, tmp_path / "a", executor=executor)
    journal = Journal(tmp_path / "a", read_only=True)
    assert outcome.best["role"] == "baseline"
    base_runs = [t for t in journal.trials() if t["role"] in ("baseline", "bank")]
    assert len(base_runs) == 3 and all(t["test"] for t in base_runs)
    plan = next(e for e in journal.events() if e["kind"] == "test plan")
    assert plan["data"]["trials"] == [t["id"] for t in base_runs] + ["warmup"]
    report = outcome.report.read_text()
    assert re.search(r"On the test split, read once with the warm-up beside them: .*mean test "
                     r"accuracy 0\.\d{3} over 3 run\(s\)", report)
    assert re.search(r"\| test \(runs\) \| 0\.\d{3} \[.*\] \(mean of 3 runs\) \|", report)
    # the transfer split, read in the same check, is reported the same way
    assert re.search(r"\| transfer \(runs\) \| 0\.\d{3} \[.*\] \(mean of 3 runs\) \|", report)
    assert re.search(r"On the transfer split .*read in the same check: .*mean transfer "
                     r"accuracy 0\.\d{3} over 3 run\(s\)", report)


def test_after_a_keep_both_fresh_arms_meet_the_warmup_on_test_and_transfer(tmp_path: Path):
    """With a change kept, the final check reads fresh runs of the best and the base config;
    each arm is set against the warm-up on test and on transfer, runs as the unit."""
    def quality(config: TrialConfig) -> float:  # the warm-up; a faster learner; the rest
        if config.rl.steps == 0:
            return 0.4
        return 0.3 if config.rl.adam.learning_rate == TrialConfig().rl.adam.learning_rate else 0.8

    study = _study_with_transfer("keep-vs-warmup", tmp_path,
                                 {"rl.adam.learning_rate": {"choices": [1e-4, 2e-4]}},
                                 {"max_trials": 2, "confirm_seeds": 1, "max_confirm_trials": 2,
                                  "test_seeds": 2})
    outcome = run_study(study, tmp_path / "a", executor=SyntheticExecutor(quality, tasks=96))
    assert outcome.best["role"] == "explore"  # kept
    journal = Journal(tmp_path / "a", read_only=True)
    assert journal.trial("warmup")["test"]
    report = outcome.report.read_text()
    best = outcome.best["id"]
    for split in ("test", "transfer"):
        for who in (rf"the best config \({best}\)", "the base config"):
            assert re.search(rf"With runs as the unit, {who}'s RL [a-z ]+ the warm-up "
                             rf"\(warmup\): mean {split} accuracy 0\.\d{{3}} over 2 run\(s\)",
                             report), (split, who)


def test_one_run_meets_the_warmup_paired_per_task_not_against_a_fixed_score():
    """A kept config's one fresh run with 3 of 48 right, against a warm-up with none: paired
    per task this is no gain beyond noise (as the same run against the base config's run with
    none is), where the run's Wilson interval less a fixed 0 would have claimed one."""
    from autoresearch.study.report import _runs_against_warmup

    tasks = [f"t{i:02d}" for i in range(48)]
    warmup = {"id": "warmup", "role": "warmup", "test": {"verdicts": dict.fromkeys(tasks, False)}}
    forked = {"id": "t0001", "role": "baseline", "config": {}}
    run = {k: i < 3 for i, k in enumerate(tasks)}
    said = _runs_against_warmup([warmup, forked], forked, [run], "the best config", "test")
    assert "did not differ beyond noise from the warm-up" in said
    assert "paired per task over 48 tasks" in said and "cannot speak for the config" in said
    assert "+0.062 [-0.0" in said
