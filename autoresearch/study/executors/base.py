"""What every executor is: it runs one trial, to the end, and returns its result; the runner
calls it from its worker threads, one thread per concurrent trial.

`LocalExecutor` (`executors.local`) runs trials in this process against one server, sharing one
pool of scoring workers. `KubernetesExecutor` (`executors.kubernetes`) runs each as a Job in the
cluster. Either
way a trial's directory is fixed when it is queued, and running a trial whose directory already
holds a record resumes it (or returns its final result at once): running a trial again never
trains it twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from autoresearch.rl.config import TrialConfig
from autoresearch.rl.trial import TrialResult


class TrialStopped(RuntimeError):
    """A trial ended early because the study asked it to stop (it did not fail): on request,
    or pruned. An executor that runs trials elsewhere stops them there too."""


StepSink = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class TrialJob:
    id: str
    config: TrialConfig
    directory: Path


class Executor(Protocol):
    def run(self, job: TrialJob, on_step: StepSink) -> TrialResult:
        """Run (or re-attach to, or resume) the trial; raise if it crashed. `on_step` gets every
        step entry (`type` "step") and may get evaluation events (`eval_start`, `eval`); an
        `eval` during training feeds pruning. When `on_step` raises, the trial ends there with
        that exception."""
        ...

    def close(self) -> None: ...


RESULT_PREFIX = "autoresearch-result "
"""The `trial` command's last log line: this prefix, then the result as JSON."""


def result_line(result: TrialResult) -> str:
    def brief(summary: dict[str, Any] | None) -> dict[str, Any] | None:
        return None if summary is None else {k: v for k, v in summary.items() if k != "samples"}

    payload = {"dev": brief(result.dev), "test": brief(result.test), "steps": result.steps,
               "tokens": result.tokens, "wall_seconds": result.wall_seconds,
               "checkpoint": result.checkpoint}
    return RESULT_PREFIX + json.dumps(payload, separators=(",", ":"))


def parse_result_line(log_text: str, directory: Path) -> TrialResult | None:
    """The result from the last result line of a trial's log, if there is one."""
    for line in reversed(log_text.splitlines()):
        line = line.strip()
        if line.startswith(RESULT_PREFIX):
            data = json.loads(line[len(RESULT_PREFIX):])
            return TrialResult(directory, data.get("dev"), data.get("test"), data["steps"],
                               data["tokens"], data["wall_seconds"], data.get("checkpoint"))
    return None
