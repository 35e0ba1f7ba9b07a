"""A whole study of real (tiny) trials, run as a user would: `autoresearch run study.yaml`, killed
mid-trial, then `resume`d. It must finish with every trial run once, everything journaled,
decisions taken on dev, and a report."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from autoresearch.rl.record import TrialRecord
from autoresearch.study.journal import Journal
from autoresearch.study.runner import StudyOutcome, resume_study
from autoresearch.study.spec import Study
from tests.autoresearch.study_helpers import tiny_trial

pytestmark = pytest.mark.timeout(420)
REPO = Path(__file__).resolve().parents[2]


def _wait_for_checkpoint(directory: Path, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the study exited early:\n{log.read_text()[-3000:]}")
        for record in directory.glob("trials/*/record.jsonl"):
            if '"checkpoint"' in record.read_text():
                return
        time.sleep(0.2)
    raise AssertionError("no trial reached a checkpoint")


@pytest.fixture(scope="module")
def resumed(sql_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> StudyOutcome:
    root = tmp_path_factory.mktemp("study")
    study = Study(
        name="tiny", seed=3, embedded_model=str(sql_model_dir), reward_workers=1,
        base_trial=tiny_trial(sql_model_dir, eval={"every": 0, "dev_tasks": 4, "test_tasks": 4,
                                                   "transfer_tasks": 3, "max_tokens": 16}),
        search_space={"rl.adam.learning_rate": {"low": 1e-5, "high": 1e-3, "log": True},
                      "rl.advantage": {"choices": ["mean", "zscore"]}},
        budget={"max_trials": 3, "confirm_seeds": 0},
        executor={"max_parallel_trials": 2},
    )
    (root / "study.yaml").write_text(study.to_yaml())
    directory, log = root / "out", root / "run.log"
    env = {k: v for k, v in os.environ.items() if k not in ("TINKER_BASE_URL",
                                                            "AUTORESEARCH_API_KEYS")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "datasets")])
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "autoresearch", "run", str(root / "study.yaml"), "--out",
             str(directory)], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            _wait_for_checkpoint(directory, process, log)
        finally:
            process.send_signal(signal.SIGKILL)  # a crash: no chance to clean up
            process.wait(30)
    return resume_study(directory)


def test_a_killed_study_resumes_each_interrupted_trial_from_its_checkpoint(
        resumed: StudyOutcome):
    db = duckdb.connect(str(resumed.journal), read_only=True)
    reattached = {row[0] for row in db.execute(
        "SELECT trial_id FROM events WHERE message LIKE 're-attaching%'").fetchall()}
    attempts = dict(db.execute("SELECT id, attempts FROM trials").fetchall())
    directories = dict(db.execute("SELECT id, directory FROM trials").fetchall())
    db.close()
    assert reattached, "the trials running at the kill were not re-attached"
    resumed_from_checkpoint = 0
    for trial_id in reattached:
        assert attempts[trial_id] == 2
        record = TrialRecord(resumed.directory / directories[trial_id])
        resumed_from_checkpoint += any(e["message"].startswith("resumed from")
                                       for e in record.of_type("event"))
    assert resumed_from_checkpoint >= 1  # the one that had checkpointed did not start over
    for trial_id, directory in directories.items():
        assert len(TrialRecord(resumed.directory / directory).of_type("final")) == 1, trial_id
    assert sorted(p.name for p in (resumed.directory / "trials").iterdir()) == sorted(directories)


def test_every_trial_is_journaled_with_scores_cost_and_decision(resumed: StudyOutcome):
    db = duckdb.connect(str(resumed.journal), read_only=True)
    trials = db.execute(
        "SELECT id, role, status, proposer, rationale, dev_accuracy, dev_low, dev_high, dev_n, "
        "test_accuracy, steps, tokens, wall_seconds, checkpoint, diff_vs_best FROM trials "
        "ORDER BY number").fetchall()
    assert [t[1] for t in trials] == ["baseline", "explore", "explore"]
    assert trials[0][2] == "kept"  # the baseline is the first reference
    assert {t[2] for t in trials[1:]} <= {"kept", "discarded"}
    for (trial_id, _, _, proposer, rationale, acc, low, high, n, test_acc, steps, tokens, wall,
         checkpoint, _) in trials:
        assert proposer in ("baseline", "optuna-tpe") and rationale
        assert low <= acc <= high and n == 4
        # Nothing can be kept without confirmations: the test split is read once, for the
        # baseline (the final best) alone.
        assert (test_acc is not None) == (trial_id == trials[0][0])
        assert steps == 2 and tokens > 0 and wall > 0
        assert checkpoint.startswith("tinker://")
        step_rows = db.execute("SELECT phase, step FROM steps WHERE trial_id = ? ORDER BY time",
                               [trial_id]).fetchall()
        assert step_rows == [("sft", 0), ("rl", 0)]  # copied from the record, none twice
        assert db.execute("SELECT count(*) FROM evals WHERE trial_id = ? AND split = 'dev'",
                          [trial_id]).fetchone()[0] == 1
    assert all(t[14] for t in trials[1:])  # proposed trials carry their diff against the best
    assert db.execute("SELECT count(*) FROM evals WHERE split = 'test'").fetchone()[0] == 0
    # Transfer is read in the same single check as test, never by the search's trials.
    assert db.execute("SELECT count(*) FROM evals WHERE split = 'transfer'").fetchone()[0] == 0
    transfer = db.execute("SELECT trial_id, data FROM events WHERE kind = 'transfer'").fetchall()
    assert [t[0] for t in transfer] == [trials[0][0]]
    assert '"n": 3' in str(transfer[0][1]).replace("'", '"')
    decided = db.execute("SELECT candidate FROM decisions ORDER BY id").fetchall()
    assert sorted(d[0] for d in decided) == [t[0] for t in trials]
    state = db.execute("SELECT state, best_trial FROM study").fetchone()
    db.close()
    assert state[0] == "finished" and state[1] in {t[0] for t in trials}

    report = resumed.report.read_text()
    assert "## Leaderboard (dev split)" in report and "## Best config" in report
    assert "Keep rule:" in report and "## Transfer (databases no corpus has)" in report
    for trial_id, *_ in trials:
        assert trial_id in report


def test_each_run_of_the_study_journals_the_environment_with_the_servers_dtype(
        resumed: StudyOutcome):
    events = [e for e in Journal(resumed.directory, read_only=True).events()
              if e["kind"] == "environment"]
    assert len(events) == 2  # the killed run and its resume, on this machine
    server = events[0]["data"]["server"]
    assert server["dtype"] in ("float32", "bfloat16") and server["dtype_reason"]
    assert events[0]["message"] == events[1]["message"]
    assert "This study ran in one environment." in resumed.report.read_text()
