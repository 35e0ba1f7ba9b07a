"""The warm-up on real (tiny) trials and the embedded server: a second study, with its own
embedded server and data directory, forks its trials from the cached warm-up checkpoint, and the
pruning evaluations run on the fixed dev subset."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoresearch.rl.record import TrialRecord
from autoresearch.study.journal import Journal
from autoresearch.study.runner import run_study
from autoresearch.study.spec import Study
from tests.autoresearch.study_helpers import tiny_trial

pytestmark = pytest.mark.timeout(420)


def _study(name: str, model: Path, cache: Path) -> Study:
    base = tiny_trial(model, sft={"steps": 0},
                      rl={"steps": 2, "prompts_per_step": 2, "group_size": 2, "max_tokens": 16},
                      eval={"every": 0, "dev_tasks": 4, "test_tasks": 2, "max_tokens": 16})
    return Study(name=name, embedded_model=str(model), reward_workers=1, base_trial=base,
                 warmup={"sft": {"steps": 2, "batch_size": 2}, "checkpoint_every": 1,
                         "cache_dir": str(cache)},
                 pruning={"kind": "successive_halving", "every": 1, "dev_tasks": 2,
                          "min_resource": 1},
                 search_space={"rl.adam.learning_rate": {"low": 1e-5, "high": 1e-3,
                                                         "log": True}},
                 budget={"max_trials": 1, "confirm_seeds": 0})


def test_a_second_study_forks_from_the_cached_warmup_on_its_own_embedded_server(
        sql_model_dir: Path, tmp_path: Path):
    cache = tmp_path / "cache"
    first = run_study(_study("warm-a", sql_model_dir, cache), tmp_path / "a")
    a = Journal(first.journal, read_only=True)
    warm = a.trial("warmup")
    assert warm["status"] == "done" and warm["steps"] == 2
    stages = [(e["stage"], e["split"]) for e in a.query(
        "SELECT stage, split FROM evals WHERE trial_id = 'warmup' ORDER BY time")]
    assert stages == [("start", "dev"), ("final", "dev")]  # base vs after, same dev tasks
    checkpoint = warm["checkpoint"]
    baseline = a.trial("t0001")
    assert baseline["config"]["init_checkpoint"] == checkpoint and baseline["status"] == "kept"
    record = TrialRecord(first.directory / "trials/t0001")
    assert any(e["message"] == f"started from {checkpoint}" for e in record.of_type("event"))
    subset = [e for e in record.of_type("eval") if e["stage"] == "rl-1"]
    assert len(subset) == 1 and subset[0]["accuracy"]["n"] == 2  # the fixed pruning subset
    assert "after the warm-up" in first.report.read_text()

    second = run_study(_study("warm-b", sql_model_dir, cache), tmp_path / "b")
    b = Journal(second.journal, read_only=True)
    assert "Reused from the cache" in b.trial("warmup")["rationale"]
    assert not (tmp_path / "b" / "warmup").exists()  # nothing was trained again
    trial = b.trial("t0001")
    # Its own server (a fresh data directory) loaded the warm-up's weights from the cache copy.
    assert trial["status"] == "kept" and trial["config"]["init_checkpoint"] == checkpoint
    record = TrialRecord(second.directory / "trials/t0001")
    assert any(e["message"] == f"started from {checkpoint}" for e in record.of_type("event"))
    from server.storage.checkpoints import CheckpointStore, TinkerPath

    run_id = TinkerPath.parse(checkpoint).run_id
    assert (CheckpointStore(tmp_path / "b" / "server-data").run_dir(run_id) / "run.json").exists()
    # The report of the second study still shows the warm-up's effect, from the cache.
    assert "after the warm-up" in second.report.read_text()
