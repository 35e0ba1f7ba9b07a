"""Stopping a study the way a user does: Ctrl-C in the terminal (SIGINT to the whole process
group), or SIGTERM from a scheduler. The study ends with one line and no traceback, the journal
says `interrupted` with its unfinished trials `stopped` at their last step, `status` and `report`
say so (no verdict for unfinished trials), and `resume` finishes the study."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autoresearch.rl.record import TrialRecord
from autoresearch.study.journal import Journal
from autoresearch.study.runner import resume_study
from autoresearch.study.spec import Study
from autoresearch.ui.snapshot import read_snapshot
from tests.autoresearch.study_helpers import tiny_trial

pytestmark = pytest.mark.timeout(600)
REPO = Path(__file__).resolve().parents[2]
FINISHED = ("done", "kept", "discarded")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("TINKER_BASE_URL", "AUTORESEARCH_API_KEYS")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "datasets")])
    return env


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autoresearch", *args], cwd=REPO, env=_env(),
                          capture_output=True, text=True, timeout=120)


def _saved_a_checkpoint(directory: Path, trial: dict) -> bool:
    """Has the trial recorded a checkpoint it can be resumed from? A step is journaled a moment
    before its checkpoint is saved; a stop in between rightly starts that trial over."""
    return bool(trial.get("directory")) and bool(
        TrialRecord(directory / trial["directory"]).of_type("checkpoint"))


def _stop_mid_trial(args: list[str], directory: Path, log: Path, signum: int) -> tuple[int, str]:
    """Start the CLI in its own process group, wait until a running trial has journaled a step
    and saved a checkpoint, then signal the whole group as a terminal's Ctrl-C does."""
    with open(log, "wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "autoresearch", *args], cwd=REPO,
                                   env=_env(), stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        try:
            deadline = time.monotonic() + 300
            while True:
                assert process.poll() is None, f"exited early:\n{log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, "no trial journaled a step"
                snapshot = read_snapshot(directory, lock_timeout=0.5)
                if snapshot and any(t["status"] == "running" and (t["progress"] or {}).get(
                        "step", 0) >= 1 and _saved_a_checkpoint(directory, t)
                        for t in snapshot.trials):
                    break
                time.sleep(0.2)
            started = time.monotonic()
            os.killpg(process.pid, signum)
            code = process.wait(90)
            stop_seconds = time.monotonic() - started
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(30)
    assert stop_seconds < 60, f"stopping took {stop_seconds:.0f}s"
    return code, log.read_text()


def _assert_clean_interruption(code: int, output: str, directory: Path) -> None:
    assert code == 130, output[-3000:]
    assert "Traceback" not in output and "Exception in thread" not in output, output[-4000:]
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines[-1].startswith("study interrupted") and "autoresearch resume" in lines[-1]
    assert sum("study interrupted" in line for line in lines) == 1
    journal = Journal(directory, read_only=True)
    assert journal.study()["state"] == "interrupted"
    unfinished = [t for t in journal.trials() if t["status"] not in FINISHED]
    assert unfinished and all(t["status"] in ("stopped", "queued") for t in unfinished)
    stopped = [t for t in unfinished if t["status"] == "stopped"]
    assert stopped and all(t["progress"].get("interrupted") for t in stopped), [
        (t["id"], t["status"], t["progress"], t["error"]) for t in journal.trials()]
    assert any(t["progress"]["step"] >= 1 for t in stopped)
    assert any(f"{t['id']} stopped in " in lines[-1] for t in stopped)


@pytest.fixture(scope="module")
def study_dir(sql_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stop")
    trial = tiny_trial(sql_model_dir, sft={"steps": 2, "batch_size": 2},
                       rl={"steps": 3, "prompts_per_step": 2, "group_size": 2, "max_tokens": 16})
    study = Study(name="stop", seed=5, embedded_model=str(sql_model_dir), reward_workers=1,
                  base_trial=trial,
                  search_space={"rl.adam.learning_rate": {"low": 1e-5, "high": 1e-3, "log": True}},
                  budget={"max_trials": 2, "confirm_seeds": 0},
                  executor={"max_parallel_trials": 2})
    (root / "study.yaml").write_text(study.to_yaml())
    return root


def test_ctrl_c_then_sigterm_stop_cleanly_and_resume_finishes_the_study(study_dir: Path):
    directory = study_dir / "out"
    code, output = _stop_mid_trial(["run", str(study_dir / "study.yaml"), "--out",
                                    str(directory)], directory, study_dir / "run.log",
                                   signal.SIGINT)
    _assert_clean_interruption(code, output, directory)
    # The terminal showed where the trials were (plain lines: the output is not a TTY).
    assert "t0001: " in output and "step " in output

    status = _cli("status", str(directory))
    assert status.returncode == 0, status.stderr
    assert "(interrupted)" in status.stdout and "stopped" in status.stdout
    assert "autoresearch resume" in status.stdout
    report = _cli("report", str(directory), "--print")
    assert "This study is unfinished (state: interrupted)" in report.stdout
    assert "No proposed change beat the baseline" not in report.stdout
    assert "No verdict" in report.stdout

    code, output = _stop_mid_trial(["resume", str(directory)], directory,
                                   study_dir / "resume.log", signal.SIGTERM)
    _assert_clean_interruption(code, output, directory)

    outcome = resume_study(directory)
    journal = Journal(directory, read_only=True)
    assert journal.study()["state"] == "finished"
    trials = journal.trials()
    assert [t["status"] in ("kept", "discarded") for t in trials] == [True, True]
    assert all(t["progress"]["phase"] == "done" for t in trials)
    resumed_from_checkpoint = 0
    for t in trials:
        record = TrialRecord(directory / t["directory"])
        assert len(record.of_type("final")) == 1
        resumed_from_checkpoint += any(e["message"].startswith("resumed from")
                                       for e in record.of_type("event"))
    assert resumed_from_checkpoint >= 1  # taken up where it stopped, not started over
    assert "This study is unfinished" not in outcome.report.read_text()
    assert all(d["conclusion"] for d in journal.decisions())
