"""Where a running trial is: its phase, step of total, last metrics and time left.

`ProgressTracker` folds a trial's progress events into one small dict (the *state*), which the
study journals on the trial's row, so `autoresearch status` can show it from the journal of a
study that runs anywhere. `describe` turns a state into the one line both the terminal and
`status` print; `StudyProgress` draws one line per running trial (a tqdm bar on a terminal,
plain lines when the output is a file or a pipe); `TrialProgress` does the same for one trial.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TextIO

from tqdm.auto import tqdm

from autoresearch.rl.config import TrialConfig
from autoresearch.rl.record import step_seconds

PHASES = {"starting": "starting", "sft": "warm-up (SFT)", "rl": "RL", "eval": "evaluation",
          "done": "done", "stopped": "stopped", "crashed": "crashed"}

ProgressCallback = Callable[[str, dict[str, Any]], None]
"""What a study calls with (trial id, progress state) whenever a trial moves."""


class ProgressTracker:
    """The progress state of one trial, updated from the events the trial emits."""

    def __init__(self, config: TrialConfig, clock: Callable[[], float] = time.time):
        self.sft_steps, self.rl_steps = config.sft.steps, config.rl.steps
        self.clock = clock
        self._since: tuple[float, int] | None = None  # (time, steps done) when timing began
        now = clock()
        self.state: dict[str, Any] = {
            "phase": "starting", "step": 0, "total": self.sft_steps + self.rl_steps,
            "phase_step": 0, "phase_total": 0, "reward": None, "accuracy": None, "loss": None,
            "dev_accuracy": None, "eval": None, "eta_seconds": None, "updated": now,
        }

    def update(self, event: dict[str, Any]) -> dict[str, Any]:
        now = self.clock()
        s = self.state
        kind, phase = event.get("type"), event.get("phase")
        if kind == "step" and phase in ("sft", "rl"):
            done = int(event.get("step", 0)) + 1
            s.update(phase=phase, phase_step=done,
                     phase_total=self.sft_steps if phase == "sft" else self.rl_steps,
                     step=done + (self.sft_steps if phase == "rl" else 0))
            for key, source in (("reward", "reward_mean"), ("accuracy", "accuracy"),
                                ("loss", "loss_per_token")):
                if event.get(source) is not None:
                    s[key] = float(event[source])
            if phase == "rl" and event.get("groups_used") is not None:
                drawn = event.get("groups_drawn",
                                  event["groups_used"] + event.get("groups_dropped", 0))
                s["groups"] = [int(event["groups_used"]), int(drawn)]
            if self._since is None:  # the pace is timed from the first step this process saw
                self._since = (now, s["step"])
            start, base = self._since
            per_step = (now - start) / (s["step"] - base) if s["step"] > base else None
            if per_step is None and event.get("seconds") is not None:
                per_step = step_seconds(event)  # the first step: its own duration
            if per_step is not None:
                s["eta_seconds"] = round(per_step * (s["total"] - s["step"]), 1)
        elif kind == "eval_start":
            s.update(phase="eval", eval=f"{event.get('stage')} on {event.get('split')}")
        elif phase == "eval" and event.get("accuracy") is not None:
            if event.get("split") == "dev":
                s["dev_accuracy"] = float(event["accuracy"])
        elif phase == "done":
            s.update(phase="done", step=s["total"], eta_seconds=0.0)
            if event.get("dev_accuracy") is not None:
                s["dev_accuracy"] = float(event["dev_accuracy"])
        s["updated"] = now
        return dict(s)

    def end(self, status: str, **extra: Any) -> dict[str, Any]:
        """The state a finished, stopped or crashed trial keeps (its last step stays, and for an
        unfinished one the phase it was in)."""
        if status != "done" and self.state["phase"] not in ("done", "stopped", "crashed"):
            self.state["stopped_in"] = describe(self.state).split(", ")[0]
        self.state.update(phase=status, updated=self.clock(), **extra)
        if status != "done":
            self.state["eta_seconds"] = None
        return dict(self.state)


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def describe(state: dict[str, Any] | None, now: float | None = None) -> str:
    """One line: phase, step of total, last metrics, time left (and age, given `now`)."""
    if not state:
        return "not started"
    phase = state.get("phase", "starting")
    parts = [PHASES.get(phase, phase)]
    if phase in ("sft", "rl") and state.get("phase_total"):
        parts[0] += f" {state['phase_step']}/{state['phase_total']}"
    elif phase == "eval" and state.get("eval"):
        parts[0] += f" ({state['eval']})"
    elif phase in ("stopped", "crashed") and state.get("stopped_in"):
        parts[0] += f" in {state['stopped_in']}"
    parts.append(f"step {state.get('step', 0)}/{state.get('total', 0)}")
    if state.get("reward") is not None:
        parts.append(f"reward {state['reward']:.3f}")
    if state.get("accuracy") is not None:
        parts.append(f"acc {state['accuracy']:.2f}")
    elif state.get("loss") is not None:
        parts.append(f"loss {state['loss']:.3f}")
    if phase == "rl" and state.get("groups"):
        used, drawn = state["groups"]
        parts.append(f"trained on {used} of {drawn} groups")
    if state.get("dev_accuracy") is not None:
        parts.append(f"dev {state['dev_accuracy']:.3f}")
    if phase not in ("done", "stopped", "crashed", "interrupted", "eval"):  # eval: not timed
        eta = state.get("eta_seconds")
        parts.append(f"~{duration(eta)} left" if eta is not None else "time left: after a step")
    if now is not None and state.get("updated"):
        parts.append(f"(updated {duration(max(0.0, now - state['updated']))} ago)")
    return ", ".join(parts)


def _terminal_width(stream: TextIO) -> int | None:
    """None where the terminal reports its size (the bars follow it), else a fixed 120 columns:
    a terminal that says 0x0 (some pseudo-terminals) would otherwise get no bars at all."""
    try:
        if os.get_terminal_size(stream.fileno()).columns > 0:
            return None
    except (AttributeError, OSError, ValueError):
        pass
    return 120


def where(state: dict[str, Any] | None) -> str:
    """Where a trial is or stopped, shortly: "RL 2/4, step 5/7"."""
    if not state:
        return "before its first step"
    step = f"step {state.get('step', 0)}/{state.get('total', 0)}"
    if state.get("phase") in ("stopped", "crashed", "done"):
        return f"{state['stopped_in']}, {step}" if state.get("stopped_in") else step
    return f"{describe(state).split(', ')[0]}, {step}"


class StudyProgress:
    """One line per running trial: a tqdm bar on a terminal, plain lines otherwise.

    Plain lines are printed when a trial changes phase or at most every `interval` seconds, so
    a log file of an overnight run reads as a timeline.
    """

    def __init__(self, stream: TextIO | None = None, interval: float = 30.0,
                 tty: bool | None = None):
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.interval = interval
        self._bars: dict[str, Any] = {}
        self._slots: dict[str, int] = {}  # trial -> terminal line of its bar
        self._printed: dict[str, tuple[float, str]] = {}
        self._lock = threading.Lock()

    def __call__(self, trial_id: str, state: dict[str, Any]) -> None:
        with self._lock:
            if state.get("phase") in ("done", "stopped", "crashed"):
                self._finish(trial_id, state)
            elif self.tty:
                self._bar(trial_id, state)
            else:
                last = self._printed.get(trial_id)
                now = time.monotonic()
                if last is None or last[1] != state.get("phase") or now - last[0] >= self.interval:
                    self._printed[trial_id] = (now, state.get("phase"))
                    self._line(f"{trial_id}: {describe(state)}")

    def _bar(self, trial_id: str, state: dict[str, Any]) -> None:
        bar = self._bars.get(trial_id)
        if bar is None:
            slot = min(set(range(len(self._bars) + 1)) - set(self._slots.values()))
            self._slots[trial_id] = slot
            width = _terminal_width(self.stream)
            bar = tqdm(total=state.get("total") or None, desc=trial_id, position=slot,
                       file=self.stream, leave=False, dynamic_ncols=width is None,
                       ncols=width, nrows=None if width is None else 50, unit=describe(state),
                       bar_format="{desc} |{bar:12}| {unit}")
            self._bars[trial_id] = bar
        bar.n = state.get("step", 0)
        bar.unit = describe(state)  # shown through "{unit}": a postfix would start with ", "
        bar.refresh()

    def _finish(self, trial_id: str, state: dict[str, Any]) -> None:
        bar = self._bars.pop(trial_id, None)
        self._slots.pop(trial_id, None)
        if bar is not None:
            bar.close()
        self._printed.pop(trial_id, None)
        self._line(f"{trial_id}: {describe(state)}")

    def _line(self, text: str) -> None:
        if self.tty:
            tqdm.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def write(self, text: str) -> None:
        """A log line that does not tear the bars."""
        with self._lock:
            self._line(text)

    def close(self) -> None:
        with self._lock:
            for bar in self._bars.values():
                bar.close()
            self._bars.clear()
            self._slots.clear()


class TrialProgress:
    """A callable for `run_trial(progress=...)`: the same line for one trial run on its own."""

    def __init__(self, config: TrialConfig, name: str = "trial", stream: TextIO | None = None,
                 tty: bool | None = None):
        self.name = name
        self.tracker = ProgressTracker(config)
        self.display = StudyProgress(stream, tty=tty)

    def __call__(self, event: dict[str, Any]) -> None:
        state = self.tracker.update(event)
        self.display(self.name, state)
        if event.get("phase") == "eval" and event.get("accuracy") is not None:
            self.display.write(f"{self.name}: eval {event['stage']} on {event['split']}: "
                               f"accuracy {event['accuracy']:.3f}")

    def close(self) -> None:
        self.display.close()
