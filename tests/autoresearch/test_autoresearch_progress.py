"""Where a running trial is (phase, step of total, last metrics, time left), on the terminal and
from the journal; and what a decision concluded, in words."""

from __future__ import annotations

import io
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from autoresearch.rl.config import TrialConfig
from autoresearch.rl.progress import ProgressTracker, StudyProgress, describe
from autoresearch.rl.trial import TrialResult
from autoresearch.study.decision_text import decision_text
from autoresearch.study.executors.base import TrialJob
from autoresearch.study.journal import Journal
from autoresearch.study.report import build, status, to_markdown
from autoresearch.study.runner import run_study
from autoresearch.study.spec import Study
from tests.autoresearch.study_helpers import SyntheticExecutor, summary
from tools.processes import wait_until

pytestmark = pytest.mark.timeout(120)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_tracker_follows_warm_up_rl_and_evaluation_and_estimates_time_left():
    clock = Clock()
    tracker = ProgressTracker(TrialConfig(sft={"steps": 2}, rl={"steps": 3},
                                          eval={"every": 0}), clock)
    assert tracker.state["phase"] == "starting" and tracker.state["total"] == 5
    clock.now += 10
    state = tracker.update({"type": "step", "phase": "sft", "step": 0, "loss_per_token": 2.5,
                            "seconds": 10.0})
    assert (state["phase"], state["step"], state["phase_step"], state["phase_total"]) == (
        "sft", 1, 1, 2)
    assert state["eta_seconds"] == 40.0  # 10 s a step, 4 steps to go
    clock.now += 10
    tracker.update({"type": "step", "phase": "sft", "step": 1, "loss_per_token": 1.5})
    clock.now += 20
    state = tracker.update({"type": "step", "phase": "rl", "step": 0, "reward_mean": 0.25,
                            "accuracy": 0.5, "groups_used": 4, "groups_drawn": 9,
                            "groups_dropped": 5})
    assert (state["phase"], state["step"], state["phase_step"]) == ("rl", 3, 1)
    assert state["eta_seconds"] == 30.0  # 30 s for the 2 steps since timing began, 2 to go
    assert describe(state) == ("RL 1/3, step 3/5, reward 0.250, acc 0.50, "
                               "trained on 4 of 9 groups, ~30s left")
    state = tracker.update({"type": "eval_start", "phase": "eval", "stage": "final",
                            "split": "dev"})
    assert describe(state).startswith("evaluation (final on dev), step 3/5")
    state = tracker.update({"type": "eval", "phase": "eval", "stage": "final", "split": "dev",
                            "accuracy": 0.375})
    assert state["dev_accuracy"] == 0.375
    clock.now += 5
    assert describe(state, now=clock.now).endswith("(updated 5s ago)")
    stopped = tracker.end("stopped", interrupted=True)
    assert stopped["step"] == 3 and stopped["interrupted"] and stopped["eta_seconds"] is None
    assert describe(stopped) == ("stopped in evaluation (final on dev), step 3/5, reward 0.250, "
                                 "acc 0.50, dev 0.375")


def test_plain_lines_come_on_phase_changes_and_at_most_every_interval():
    out = io.StringIO()
    display = StudyProgress(out, interval=3600, tty=False)
    base = {"total": 4, "phase_total": 2, "step": 1, "phase_step": 1, "eta_seconds": 60}
    display("t0001", {**base, "phase": "sft"})
    display("t0001", {**base, "phase": "sft", "step": 2, "phase_step": 2})  # same phase: quiet
    display("t0001", {**base, "phase": "rl", "step": 3, "reward": 0.5})
    display("t0001", {**base, "phase": "done", "step": 4})
    lines = out.getvalue().splitlines()
    assert lines == ["t0001: warm-up (SFT) 1/2, step 1/4, ~1m00s left",
                     "t0001: RL 1/2, step 3/4, reward 0.500, ~1m00s left",
                     "t0001: done, step 4/4"]


def test_on_a_terminal_each_running_trial_has_its_own_bar():
    out = io.StringIO()
    display = StudyProgress(out, tty=True)
    state = {"phase": "rl", "total": 4, "phase_total": 2, "step": 3, "phase_step": 1,
             "reward": 0.5, "accuracy": 0.25, "eta_seconds": 90}
    display("t0001", state)
    display("t0002", {**state, "step": 1, "phase": "sft"})
    assert len(display._bars) == 2
    assert sorted(display._slots.values()) == [0, 1]
    display.write("12:00:00 decision on t0001: kept")
    display("t0001", {**state, "phase": "done", "step": 4})
    display.close()
    text = out.getvalue()
    assert "t0001" in text and "RL 1/2, step 3/4, reward 0.500, acc 0.25, ~1m30s left" in text
    assert "decision on t0001: kept" in text and "t0001: done, step 4/4" in text


# ------------------------------------------------------------ decisions in words
@pytest.mark.parametrize(("decision", "expected"), [
    ({"verdict": "discarded", "rule": "paired", "against": "t0001", "value": -0.125,
      "low": -0.26, "high": 0.01, "n": 24, "seeds": 1},
     "discarded: not better than t0001 beyond noise (difference -0.125 [-0.260, +0.010], "
     "24 pairs)"),
    ({"verdict": "discarded", "rule": "paired", "against": "t0001", "value": -0.3,
      "low": -0.45, "high": -0.15, "n": 24, "seeds": 1},
     "discarded: worse than t0001 beyond noise (difference -0.300 [-0.450, -0.150], 24 pairs)"),
    ({"verdict": "kept", "rule": "pooled seeds", "against": "t0001", "value": 0.2, "low": 0.05,
      "high": 0.35, "n": 48, "seeds": 2},
     "kept: better than t0001 beyond noise over 2 seeds (difference +0.200 [+0.050, +0.350], "
     "48 pairs)"),
    ({"verdict": "discarded", "rule": "pooled seeds", "incumbent": "t0002", "difference": 0.05,
      "low": -0.02, "high": 0.12, "n": 48, "seeds": 2},
     "discarded: the re-runs did not confirm it better than t0002 beyond noise (difference "
     "+0.050 [-0.020, +0.120], 48 pairs)"),
    ({"verdict": "discarded", "rule": "paired", "against": "t0001", "value": 0.05, "low": -0.1,
      "high": 0.2, "n": 24, "note": "inconclusive and no confirmation budget left: discarded"},
     "discarded: not better than t0001 beyond noise (difference +0.050 [-0.100, +0.200], "
     "24 pairs); inconclusive and no confirmation budget left"),
    ({"verdict": "discarded", "rule": "first look", "against": "t0001", "value": -0.083,
      "low": -0.148, "high": -0.019, "n": 48, "seeds": 3},
     "discarded: its one run was behind the mean of 3 runs of t0001's config on the first "
     "look, not enough to confirm it (the interval is over tasks for that one run) "
     "(difference -0.083 [-0.148, -0.019], 48 pairs)"),
    ({"verdict": "kept", "rule": "reference", "note": "the baseline is the first reference"},
     "kept as the reference (the baseline is the first reference)"),
])
def test_a_decision_says_what_the_rule_concluded(decision: dict[str, Any], expected: str):
    assert decision_text(decision) == expected


# ------------------------------------------------------------ status from the journal
class Gated:
    """Two RL steps per trial; each trial waits at `gate` after its first step."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.first_step = threading.Event()

    def run(self, job: TrialJob, on_step) -> TrialResult:
        for step in range(job.config.rl.steps):
            on_step({"type": "step", "phase": "rl", "step": step, "time": time.time(),
                     "reward_mean": 0.125, "accuracy": 0.25, "tokens": 10})
            self.first_step.set()
            self.gate.wait(60)
        on_step({"type": "eval_start", "phase": "eval", "stage": "final", "split": "dev"})
        verdicts = {f"dev-{i}": i < 5 for i in range(10)}
        return TrialResult(job.directory, summary("dev", verdicts), summary("test", verdicts),
                           steps=job.config.rl.steps, tokens=20, wall_seconds=0.1,
                           checkpoint=f"tinker://{job.id}/weights/final")

    def close(self) -> None:
        pass


def test_status_shows_where_a_study_running_elsewhere_is(tmp_path: Path):
    study = Study(name="watched", base_trial={"sft": {"steps": 0}, "rl": {"steps": 2},
                              "eval": {"every": 0}},
                  budget={"max_trials": 1, "confirm_seeds": 0})
    executor = Gated()
    seen: list[tuple[str, dict[str, Any]]] = []
    runner = threading.Thread(target=run_study, args=(study, tmp_path, executor),
                              kwargs={"progress": lambda t, s: seen.append((t, s))})
    runner.start()
    try:
        assert executor.first_step.wait(30)
        wait_until(lambda: "RL 1/2" in status(tmp_path), 30, "`status` to show RL 1/2",
                   interval=0.1)
        text = status(tmp_path)
        assert "t0001 baseline running" in text and "step 1/2, reward 0.125, acc 0.25" in text
        assert "updated" in text
    finally:
        executor.gate.set()
        runner.join(60)
    assert [s["phase"] for t, s in seen][-1] == "done"
    assert "eval" in [s["phase"] for t, s in seen]
    final = status(tmp_path)
    assert "(finished)" in final and "kept as the reference" in final


class Interrupting(SyntheticExecutor):
    def run(self, job, on_step):
        if job.id == "t0002":
            on_step({"type": "step", "phase": "rl", "step": 0, "time": time.time(),
                     "reward_mean": 0.5, "accuracy": 0.5, "tokens": 5})
            raise KeyboardInterrupt
        return super().run(job, on_step)


def test_an_interrupted_study_reports_itself_unfinished_with_no_verdict_for_open_trials(
        tmp_path: Path):
    study = Study(name="cut", search_space={"rl.adam.learning_rate": {"choices": [5e-5, 2e-4]}},
                  budget={"max_trials": 2, "confirm_seeds": 0})
    with pytest.raises(KeyboardInterrupt):
        run_study(study, tmp_path, executor=Interrupting(lambda c: 0.5))
    journal = Journal(tmp_path, read_only=True)
    assert journal.study()["state"] == "interrupted"
    stopped = journal.trial("t0002")
    assert stopped["status"] == "stopped" and stopped["decision"] is None
    assert stopped["progress"]["step"] == 1 and stopped["progress"]["interrupted"]
    report = to_markdown(build(journal))
    assert "This study is unfinished (state: interrupted)" in report
    assert "did not finish: t0002" in report
    assert "No proposed change beat the baseline" not in report
    assert "No verdict: interrupted before it finished (t0002" in report
    text = status(tmp_path)
    assert "t0002 explore  stopped" in text and "stopped in RL 1/" in text
    assert "autoresearch resume" in text


def test_the_report_shows_what_each_rl_step_learned_from(tmp_path: Path):
    from autoresearch.study.journal import Journal
    from autoresearch.study.report import _signal_blocks, to_markdown

    journal = Journal(tmp_path)
    steps = [{"type": "step", "phase": "sft", "step": 0, "loss_per_token": 1.0},
             {"type": "step", "phase": "rl", "step": 0, "reward_mean": 0.25, "groups_used": 4,
              "groups_drawn": 9, "groups_dropped": 5, "samples_drawn": 72},
             {"type": "step", "phase": "rl", "step": 1, "reward_mean": 0.5, "groups_used": 2,
              "groups_drawn": 12, "groups_dropped": 10, "draw_capped": True,
              "samples_drawn": 96},
             # a record written before dynamic sampling: drawn = used + dropped
             {"type": "step", "phase": "rl", "step": 2, "reward_mean": 0.0, "groups_used": 0,
              "groups_dropped": 4}]
    journal.put_steps("t0001", steps)
    text = to_markdown(_signal_blocks(journal, [{"id": "t0001"}, {"id": "t0002"}]))
    assert "## Learning signal per RL step" in text
    assert "| t0001 | 4/9 2/12* 0/4 | 6 of 25 | 1 | 168 | 0.25 0.50 0.00 |" in text
    assert "t0002" not in text
