"""Steering a running study (pause, resume, stop a trial, stop the study) and what the dashboard
reads back from its journal, on a scripted executor: no model, no kernel."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from autoresearch.evaluation.stats import wilson
from autoresearch.rl.trial import TrialResult
from autoresearch.study.control import (
    ControlledExecutor,
    ControlledProposer,
    StudyControl,
    TrialStopped,
)
from autoresearch.study.executors.base import TrialJob
from autoresearch.study.proposers import Proposal, ProposalBatch
from autoresearch.study.spec import Study
from autoresearch.ui.live import LiveStudy
from autoresearch.ui.snapshot import leaderboard, parse_metrics, read_snapshot
from tools.processes import wait_until

pytestmark = pytest.mark.timeout(120)

TRIAL = {"rl": {"steps": 3, "prompts_per_step": 2, "group_size": 2},
         "eval": {"every": 0, "dev_tasks": 8, "test_tasks": 8}}


def summary(split: str, correct: int, n: int = 20) -> dict[str, Any]:
    verdicts = {f"{split}-{i:02d}": i < correct for i in range(n)}
    return {"split": split, "accuracy": wilson(correct, n).as_dict(), "per_tier": {},
            "mean_reward": correct / n, "components": {}, "verdicts": verdicts, "samples": []}


class ScriptedExecutor:
    """Three RL steps per trial; a trial waits on `gate` after each step while it is closed."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.steps: dict[str, int] = {}
        self.stepped = threading.Condition()

    def run(self, job: TrialJob, on_step) -> TrialResult:
        for step in range(job.config.rl.steps):
            self.gate.wait(30)
            on_step({"type": "step", "phase": "rl", "step": step, "time": time.time(),
                     "reward_mean": 0.1 * step, "accuracy": 0.5, "tokens": 10})
            with self.stepped:
                self.steps[job.id] = self.steps.get(job.id, 0) + 1
                self.stepped.notify_all()
        correct = 10 + job.config.seed
        return TrialResult(job.directory, summary("dev", correct), summary("test", correct),
                           steps=job.config.rl.steps, tokens=30, wall_seconds=0.1,
                           checkpoint=f"tinker://{job.id}/weights/final")

    def wait_for_steps(self, trial_id: str, count: int, timeout: float = 30) -> None:
        with self.stepped:
            assert self.stepped.wait_for(lambda: self.steps.get(trial_id, 0) >= count, timeout)

    def close(self) -> None:
        pass


class WatchedControl(StudyControl):
    """A control that says when a waiting trial has seen the study paused a few times: the
    trial is then provably inside its wait, not merely not started yet."""

    def __init__(self, directory: Path, polls: int = 3) -> None:
        super().__init__(directory, poll_seconds=0.02)
        self.polls, self.paused_reads = polls, 0
        self.waiting = threading.Event()

    def state(self):
        state = super().state()
        if state.paused and threading.current_thread() is not threading.main_thread():
            self.paused_reads += 1
            if self.paused_reads >= self.polls:
                self.waiting.set()
        return state


def job(tmp_path: Path, trial_id: str = "t0001") -> TrialJob:
    return TrialJob(trial_id, Study(base_trial=TRIAL).base_trial, tmp_path / trial_id)


def study(**overrides: Any) -> Study:
    return Study(name="steered", base_trial=TRIAL, proposer={"kind": "random"},
                 search_space={"rl.temperature": {"low": 0.5, "high": 1.5}},
                 **{"budget": {"max_trials": 3, "confirm_seeds": 0}, **overrides})


# ------------------------------------------------------------ the control file
def test_requests_written_by_one_control_are_seen_by_another_on_the_same_directory(tmp_path):
    writer, reader = StudyControl(tmp_path), StudyControl(tmp_path)
    assert not reader.state().paused and not reader.state().stopped
    writer.pause()
    writer.stop_trial("t0002")
    state = reader.state()
    assert state.paused and state.trial_stopped("t0002") and not state.trial_stopped("t0001")
    writer.stop()
    assert reader.state().stopped and not reader.state().paused
    assert reader.state().trial_stopped("t0001")  # stopping the study stops every trial
    writer.reset()
    assert reader.state().as_dict()["stop_trials"] == [] and not reader.state().stopped


def test_a_paused_trial_waits_after_its_current_step_and_goes_on_when_resumed(tmp_path):
    control, inner = WatchedControl(tmp_path), ScriptedExecutor()
    executor = ControlledExecutor(inner, control)
    seen: list[int] = []

    def on_step(entry: dict[str, Any]) -> None:
        seen.append(entry["step"])
        if entry["step"] == 0:
            control.pause()

    runner = threading.Thread(target=executor.run, args=(job(tmp_path), on_step))
    runner.start()
    assert control.waiting.wait(30), "the trial never waited on the pause"
    assert seen == [0] and runner.is_alive()
    control.resume()
    runner.join(10)
    assert seen == [0, 1, 2] and not runner.is_alive()


def test_a_stopped_trial_ends_at_its_next_step_after_its_step_was_recorded(tmp_path):
    control = StudyControl(tmp_path, poll_seconds=0.02)
    executor = ControlledExecutor(ScriptedExecutor(), control)
    seen: list[int] = []

    def on_step(entry: dict[str, Any]) -> None:
        seen.append(entry["step"])
        control.stop_trial("t0001")

    with pytest.raises(TrialStopped, match="t0001: stop requested"):
        executor.run(job(tmp_path), on_step)
    assert seen == [0]
    executor.run(job(tmp_path, "t0002"), lambda _: None)  # other trials are not affected


def test_a_queued_trial_does_not_start_while_paused_nor_once_the_study_is_stopped(tmp_path):
    control, inner = WatchedControl(tmp_path), ScriptedExecutor()
    executor = ControlledExecutor(inner, control)
    control.pause()
    raised: list[BaseException] = []

    def run() -> None:
        try:
            executor.run(job(tmp_path), lambda _: None)
        except TrialStopped as exc:
            raised.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    assert control.waiting.wait(30), "the queued trial never reached the pause"
    assert inner.steps == {} and runner.is_alive()
    control.stop()
    runner.join(5)
    assert inner.steps == {} and not runner.is_alive()
    assert "the study was stopped" in str(raised[0])


def test_a_stopped_study_gets_no_more_proposals(tmp_path):
    class Fixed:
        name = "fixed"

        def propose(self, context: Any, n: int) -> ProposalBatch:
            return ProposalBatch("fixed", "sampled", [Proposal({"rl.temperature": 0.7}, "why")])

    control = StudyControl(tmp_path)
    proposer = ControlledProposer(Fixed(), control)
    assert len(proposer.propose(None, 1).proposals) == 1
    control.stop()
    batch = proposer.propose(None, 1)
    assert batch.proposals == [] and batch.errors == ["the study was stopped"]


# ------------------------------------------------------------ a live study
def test_a_live_study_runs_in_the_background_and_the_dashboard_reads_its_journal(tmp_path):
    from autoresearch.ui.widgets import StudyDashboard

    executor = ScriptedExecutor()
    executor.gate.clear()
    live = LiveStudy(study(), tmp_path / "study", executor=executor).start()
    dashboard = StudyDashboard(live.directory, control=live.control, live=live)
    wait_until(lambda: (snapshot := dashboard.refresh()) is not None and any(
        t["status"] == "running" for t in snapshot.trials),  # queued first, then running
        30, "the dashboard to show the trial running", interval=0.05)
    assert live.running  # the kernel is free while the trial waits at its gate
    assert 'data-trial="t0001"' in dashboard.leaderboard.value
    assert "t0001" in dashboard.trial_choice.options  # "Stop trial" offers the running trial
    live.pause()
    dashboard.refresh()
    assert "paused" in dashboard.header.value
    live.resume()
    executor.gate.set()
    outcome = live.wait(60)
    dashboard.stop()
    assert outcome.report is not None and outcome.report.exists()
    rows = leaderboard(read_snapshot(live.directory))
    assert [r["id"] for r in sorted(rows, key=lambda r: r["number"])] == ["t0001", "t0002",
                                                                          "t0003"]
    assert all(f'data-trial="{r["id"]}"' in dashboard.leaderboard.value for r in rows)
    assert dashboard.budget.value == dashboard.budget.max == 3
    assert "Leaderboard (dev split)" in dashboard.report.value
    assert rows[0]["best"] and rows[0]["diff_text"] == "best"
    assert all(r["diff_text"].startswith("rl.temperature: 1 → ") for r in rows[1:])


def test_stopping_one_trial_of_a_live_study_leaves_the_others_running(tmp_path):
    executor = ScriptedExecutor()
    executor.gate.clear()
    live = LiveStudy(study(executor={"max_parallel_trials": 1}), tmp_path / "study",
                     executor=executor).start()
    deadline = time.monotonic() + 30
    while "t0001" not in executor.steps and time.monotonic() < deadline:
        executor.gate.set()
        executor.gate.clear()
        time.sleep(0.02)
    live.stop_trial("t0001")
    executor.gate.set()
    live.wait(60)
    trials = {t["id"]: t for t in read_snapshot(live.directory).trials}
    assert trials["t0001"]["status"] == "stopped" and "stop requested" in trials["t0001"]["error"]
    assert len(trials) == 3 and trials["t0002"]["status"] == "kept"


def test_stopping_a_live_study_ends_it_early_with_a_report(tmp_path):
    executor = ScriptedExecutor()
    executor.gate.clear()
    live = LiveStudy(study(budget={"max_trials": 8, "confirm_seeds": 0}), tmp_path / "study",
                     executor=executor).start()
    while not executor.steps:
        executor.gate.set()
        executor.gate.clear()
        time.sleep(0.02)
    live.stop()
    executor.gate.set()
    outcome = live.wait(60)
    snapshot = read_snapshot(live.directory)
    assert snapshot.finished and outcome.report.exists()
    assert len(snapshot.trials) < 8
    statuses = {t["status"] for t in snapshot.trials}
    assert "stopped" in statuses and statuses <= {"stopped", "kept"}


def test_the_command_line_pauses_continues_and_stops_a_study_through_its_control_file(
        tmp_path, capsys):
    from autoresearch.cli import main

    control = StudyControl(tmp_path)
    assert main(["pause", str(tmp_path)]) == 0 and control.state().paused
    assert main(["continue", str(tmp_path)]) == 0 and not control.state().paused
    assert main(["stop", str(tmp_path), "--trial", "t0002"]) == 0
    state = control.state()
    assert state.trial_stopped("t0002") and not state.trial_stopped("t0001")
    assert main(["stop", str(tmp_path)]) == 0 and control.state().stopped
    assert "stopping" in capsys.readouterr().out


# ------------------------------------------------------------ server health
def test_metrics_are_summed_over_label_sets_and_comments_are_skipped():
    text = ("# HELP autoresearch_queue_depth Requests waiting\n"
            'autoresearch_queue_depth{run="a"} 2.0\nautoresearch_queue_depth{run="b"} 3.0\n'
            "autoresearch_engine_duty_cycle 0.75\nautoresearch_resident_adapters 4\n")
    assert parse_metrics(text) == {"autoresearch_queue_depth": 5.0,
                                   "autoresearch_engine_duty_cycle": 0.75,
                                   "autoresearch_resident_adapters": 4.0}
