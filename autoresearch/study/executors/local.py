"""`LocalExecutor`: runs trials in this process against one server, sharing one pool of
scoring workers."""

from __future__ import annotations

from typing import Any

from autoresearch.rl.trial import TrialResult, run_trial
from autoresearch.study.executors.base import StepSink, TrialJob
from rewards import RewardPool


class LocalExecutor:
    def __init__(self, server_url: str, api_key: str | None, pool: RewardPool):
        self.server_url = server_url
        self.api_key = api_key
        self.pool = pool

    def run(self, job: TrialJob, on_step: StepSink) -> TrialResult:
        def progress(event: dict[str, Any]) -> None:
            if event.get("type") in ("step", "eval_start", "eval"):
                on_step(event)  # steps are journaled; evals feed pruning and the progress line

        return run_trial(job.config, job.directory, self.server_url, self.api_key, progress,
                         self.pool)

    def close(self) -> None:
        pass
