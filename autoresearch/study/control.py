"""Pause, resume and stop a running study, from a notebook or another process.

The channel is one small JSON file in the study directory (`control.json`), written atomically
by whoever steers (the dashboard's buttons, `StudyControl.pause()` in a notebook cell) and read
by whoever runs trials. Reading it is cheap (a stat, and a parse only when it changed), so a
trial can look at it between every two steps. Nothing in it is ever needed for correctness: a
study with no control file runs as if nobody steered it.

    control = StudyControl(study_dir)
    control.pause()           # trials stop at their next step boundary; nothing new is proposed
    control.resume()
    control.stop_trial("t0003")
    control.stop()            # no new trials; running and queued ones end at their next step

Where the study loop does not know about the channel, `ControlledExecutor` and
`ControlledProposer` wrap the executor and proposer handed to it and apply the same rules from
the outside: a trial blocks in its step callback while paused and raises `TrialStopped` there
when stopped; the proposer waits while paused and proposes nothing once the study is stopped.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoresearch.rl.trial import TrialResult
from autoresearch.study.executors.base import Executor, StepSink, TrialJob, TrialStopped
from autoresearch.study.proposers.base import Context, ProposalBatch, Proposer

CONTROL_FILE = "control.json"
__all__ = ["ControlledExecutor", "ControlledProposer", "StudyControl", "TrialStopped"]


@dataclass(frozen=True)
class ControlState:
    paused: bool = False
    stopped: bool = False
    """The whole study: no new trials, running ones end at their next step."""
    stop_trials: frozenset[str] = field(default_factory=frozenset)
    updated: float = 0.0

    def trial_stopped(self, trial_id: str) -> bool:
        return self.stopped or trial_id in self.stop_trials

    def as_dict(self) -> dict[str, Any]:
        return {"paused": self.paused, "stopped": self.stopped,
                "stop_trials": sorted(self.stop_trials), "updated": self.updated}


class StudyControl:
    """Reads and writes the control file of one study directory; safe to share between threads."""

    def __init__(self, directory: str | Path, poll_seconds: float = 0.25):
        self.dir = Path(directory)
        self.path = self.dir / CONTROL_FILE
        self.poll_seconds = poll_seconds
        self._lock = threading.Lock()
        self._cached: tuple[float, ControlState] | None = None

    # ------------------------------------------------------------ reading
    def state(self) -> ControlState:
        try:
            mtime = self.path.stat().st_mtime_ns
        except FileNotFoundError:
            return ControlState()
        cached = self._cached
        if cached is not None and cached[0] == mtime:
            return cached[1]
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return cached[1] if cached else ControlState()  # mid-replace on an odd filesystem
        state = ControlState(bool(data.get("paused")), bool(data.get("stopped")),
                             frozenset(data.get("stop_trials") or ()),
                             float(data.get("updated") or 0.0))
        self._cached = (mtime, state)
        return state

    # ------------------------------------------------------------ writing
    def _update(self, **changes: Any) -> ControlState:
        with self._lock:
            current = self.state().as_dict()
            current.update(changes, updated=time.time())
            self.dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".control-", dir=self.dir)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                json.dump(current, handle)
            os.replace(tmp, self.path)
            self._cached = None
            return self.state()

    def pause(self) -> ControlState:
        return self._update(paused=True)

    def resume(self) -> ControlState:
        return self._update(paused=False)

    def stop(self) -> ControlState:
        return self._update(stopped=True, paused=False)

    def stop_trial(self, trial_id: str) -> ControlState:
        return self._update(stop_trials=sorted(self.state().stop_trials | {trial_id}))

    def reset(self) -> ControlState:
        """Forget earlier requests (a study that starts or resumes runs unhindered)."""
        return self._update(paused=False, stopped=False, stop_trials=[])

    # ---------------------------------------------------------- obeying
    def wait_while_paused(self, trial_id: str | None = None) -> ControlState:
        """Block while the study is paused; return early when the study (or trial) is stopped."""
        while True:
            state = self.state()
            if not state.paused or state.stopped:
                return state
            if trial_id is not None and state.trial_stopped(trial_id):
                return state
            time.sleep(self.poll_seconds)

    def checkpoint(self, trial_id: str) -> None:
        """What a trial calls between steps: wait while paused, raise if it must stop."""
        state = self.wait_while_paused(trial_id)
        if state.trial_stopped(trial_id):
            who = "the study was stopped" if state.stopped else "stop requested"
            raise TrialStopped(f"{trial_id}: {who}")


class ControlledExecutor:
    """An executor that obeys a `StudyControl` at every step of the trials it runs."""

    def __init__(self, inner: Executor, control: StudyControl):
        self.inner = inner
        self.control = control

    def run(self, job: TrialJob, on_step: StepSink) -> TrialResult:
        self.control.checkpoint(job.id)  # a queued trial does not start while paused or stopped

        def step(entry: dict[str, Any]) -> None:
            on_step(entry)  # journal the step first: a stopped trial keeps its curves
            self.control.checkpoint(job.id)

        return self.inner.run(job, step)

    def close(self) -> None:
        self.inner.close()


class ControlledProposer:
    """A proposer that waits while the study is paused and proposes nothing once it is stopped."""

    def __init__(self, inner: Proposer, control: StudyControl):
        self.inner = inner
        self.control = control
        self.name = getattr(inner, "name", type(inner).__name__)

    def propose(self, context: Context, n: int) -> ProposalBatch:
        state = self.control.wait_while_paused()
        if state.stopped:
            return ProposalBatch(self.name, "sampled", [], attempts=0,
                                 errors=["the study was stopped"])
        return self.inner.propose(context, n)
