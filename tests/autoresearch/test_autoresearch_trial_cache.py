"""The trial cache: a trial another study already ran to the end is replayed, not trained again;
its steps and evaluations still reach the study (so pruning can stop the replay), its checkpoint
is installed into the new study's own embedded server, and only finished trials are stored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autoresearch.rl.config import TrialConfig
from autoresearch.rl.record import TrialRecord
from autoresearch.rl.trial import TrialResult
from autoresearch.study.executors.base import TrialJob
from autoresearch.study.journal import Journal
from autoresearch.study.pruning import TrialPruned
from autoresearch.study.runner import run_study
from autoresearch.study.spec import Study
from autoresearch.study.trial_cache import CachingExecutor, TrialCache, trial_key
from tests.autoresearch.study_helpers import tiny_trial


class RecordingExecutor:
    """Writes a record as a real trial does: two RL steps, a dev evaluation after the first."""

    def __init__(self, fail: bool = False):
        self.calls: list[str] = []
        self.fail = fail

    def run(self, job: TrialJob, on_step) -> TrialResult:
        self.calls.append(job.id)
        record = TrialRecord(job.directory)
        record.write_config(job.config.to_yaml())
        on_step(record.append("step", phase="rl", step=0, reward_mean=0.1, tokens=10))
        record.append("eval", stage="rl-1", step=1, split="dev",
                      accuracy={"value": 0.25, "low": 0.1, "high": 0.5, "n": 8})
        on_step({"type": "eval", "phase": "eval", "stage": "rl-1", "split": "dev", "step": 1,
                 "n": 8, "accuracy": 0.25})
        if self.fail:
            raise RuntimeError("loss became NaN at step 1")
        on_step(record.append("step", phase="rl", step=1, reward_mean=0.2, tokens=10))
        dev = {"split": "dev", "accuracy": {"value": 0.5, "low": 0.2, "high": 0.8, "n": 8}}
        final = record.append("final", dev=dev, test=None, steps=2, tokens=20,
                              wall_seconds=12.0, checkpoint=None)
        return TrialResult(Path(job.directory), final["dev"], None, 2, 20, 12.0, None)

    def close(self) -> None:
        pass


def _job(tmp_path: Path, name: str, **changes: Any) -> TrialJob:
    config = TrialConfig().with_changes({"name": name, **changes})
    return TrialJob(name, config, tmp_path / name)


def test_a_finished_trial_is_replayed_through_the_sink_and_its_result_is_the_same(
        tmp_path: Path):
    inner = RecordingExecutor()
    executor = CachingExecutor(inner, TrialCache(tmp_path / "cache", "embedded:x"), None, None)
    seen_first: list[dict] = []
    first = executor.run(_job(tmp_path, "a"), seen_first.append)
    seen_again: list[dict] = []
    again = executor.run(_job(tmp_path, "b"), seen_again.append)  # another name, same config
    assert inner.calls == ["a"] and executor.replayed == ["b"]
    assert (again.dev, again.steps, again.tokens) == (first.dev, first.steps, first.tokens)
    assert [e["type"] for e in seen_again] == [e["type"] for e in seen_first]
    assert seen_again[1]["accuracy"] == 0.25 and seen_again[1]["stage"] == "rl-1"
    replayed = TrialRecord(tmp_path / "b")
    assert replayed.final()["dev"] == first.dev
    assert "replayed from the trial cache" in replayed.of_type("event")[0]["message"]
    # Any change that decides the outcome is another trial.
    executor.run(_job(tmp_path, "c", seed=7), lambda e: None)
    assert inner.calls == ["a", "c"]


def test_a_pruner_stops_a_replay_where_it_would_have_stopped_the_run(tmp_path: Path):
    cache = TrialCache(tmp_path / "cache", "embedded:x")
    CachingExecutor(RecordingExecutor(), cache, None, None).run(_job(tmp_path, "a"),
                                                                lambda e: None)

    def prune(entry: dict) -> None:
        if entry["type"] == "eval":
            raise TrialPruned("behind the best", 1)

    with pytest.raises(TrialPruned):
        CachingExecutor(RecordingExecutor(), cache, None, None).run(_job(tmp_path, "b"), prune)
    kinds = [e["type"] for e in TrialRecord(tmp_path / "b").entries()]
    assert kinds == ["event", "step", "eval"]  # nothing after the pruning point


def test_only_trials_that_ran_to_the_end_are_cached(tmp_path: Path):
    cache = TrialCache(tmp_path / "cache", "embedded:x")
    with pytest.raises(RuntimeError):
        CachingExecutor(RecordingExecutor(fail=True), cache, None, None).run(
            _job(tmp_path, "a"), lambda e: None)
    assert cache.load(cache.key(_job(tmp_path, "a").config)) is None
    inner = RecordingExecutor()
    CachingExecutor(inner, cache, None, None).run(_job(tmp_path, "b"), lambda e: None)
    assert inner.calls == ["b"]


def test_the_key_ignores_the_name_and_not_the_server():
    config = TrialConfig()
    assert trial_key(config.with_changes({"name": "x"}), "s") == trial_key(config, "s")
    assert trial_key(config, "embedded:a") != trial_key(config, "embedded:b")


def _study(name: str, model: Path, cache: Path, test_tasks: int) -> Study:
    base = tiny_trial(model, sft={"steps": 0},
                      rl={"steps": 2, "prompts_per_step": 2, "group_size": 2, "max_tokens": 16},
                      eval={"every": 0, "dev_tasks": 4, "test_tasks": test_tasks,
                            "max_tokens": 16})
    return Study(name=name, embedded_model=str(model), reward_workers=1, base_trial=base,
                 warmup={"sft": {"steps": 1, "batch_size": 2}, "checkpoint_every": 1,
                         "cache_dir": str(cache / "warmups")},
                 trial_cache={"dir": str(cache / "trials")},
                 search_space={"rl.adam.learning_rate": {"low": 1e-5, "high": 1e-3,
                                                         "log": True}},
                 budget={"max_trials": 1, "confirm_seeds": 0})


@pytest.mark.timeout(420)
def test_a_second_study_replays_the_trial_and_scores_its_cached_checkpoint_on_its_own_server(
        sql_model_dir: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    first = run_study(_study("cache-a", sql_model_dir, cache, 2), tmp_path / "a")
    a = Journal(first.journal, read_only=True).trial("t0001")
    assert a["status"] == "kept" and a["test_n"] == 2
    # Another test size: the trial itself is the same (trials are scored on dev only), so it
    # is replayed; its test check is a new one, run from the checkpoint the cache installed.
    second = run_study(_study("cache-b", sql_model_dir, cache, 3), tmp_path / "b")
    b = Journal(second.journal, read_only=True).trial("t0001")
    record = TrialRecord(tmp_path / "b" / "trials" / "t0001")
    assert any("replayed from the trial cache" in e["message"] for e in record.of_type("event"))
    assert b["status"] == "kept" and b["checkpoint"] == a["checkpoint"]
    assert b["dev_accuracy"] == a["dev_accuracy"] and b["steps"] == a["steps"]
    assert b["test_n"] == 3  # scored by the second study's own server from the installed copy
    test_record = TrialRecord(tmp_path / "b" / "final-test" / "t0001")
    assert not any("replayed" in e["message"] for e in test_record.of_type("event"))
