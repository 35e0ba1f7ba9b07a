"""Helpers for the study tests: a synthetic executor and small trial declarations.

`SyntheticExecutor` stands in for real trials where a test is about the study's logic (budgets,
crashes, decisions, dispatch): each trial's per-task verdicts are drawn with a success rate that
is a function of its config (`quality`), independently per (config, seed, task), so two seeds of
one config differ by seed noise only. The end-to-end tests run real trials on a tiny model.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autoresearch.evaluation.stats import wilson
from autoresearch.rl.config import TrialConfig
from autoresearch.rl.record import TrialRecord
from autoresearch.rl.trial import TrialResult
from autoresearch.study.executors.base import TrialJob
from autoresearch.study.space import config_key

TINY_TRIAL = {
    "lora_rank": 4,
    "sft": {"steps": 1, "batch_size": 2},
    "rl": {"steps": 1, "prompts_per_step": 2, "group_size": 2, "max_tokens": 16},
    "eval": {"every": 0, "dev_tasks": 4, "test_tasks": 4, "max_tokens": 16},
    "checkpoint_every": 1,
}


def summary(split: str, verdicts: dict[str, bool]) -> dict[str, Any]:
    acc = wilson(sum(verdicts.values()), len(verdicts))
    return {"split": split, "accuracy": acc.as_dict(), "per_tier": {}, "mean_reward":
            acc.value, "components": {}, "verdicts": verdicts, "samples": []}


def draw(config: TrialConfig, split: str, p: float, tasks: int) -> dict[str, bool]:
    rng = random.Random(f"{config_key(config)}/{config.seed}/{split}")
    return {f"{split}-{i:03d}": rng.random() < p for i in range(tasks)}


class SyntheticExecutor:
    def __init__(self, quality: Callable[[TrialConfig], float], tasks: int = 64,
                 crash_if: Callable[[TrialConfig], bool] | None = None, delay: float = 0.0):
        self.quality = quality
        self.tasks = tasks
        self.crash_if = crash_if
        self.delay = delay
        self.calls: list[str] = []
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()

    def run(self, job: TrialJob, on_step: Callable[[dict[str, Any]], None]) -> TrialResult:
        with self._lock:
            self.calls.append(job.id)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            time.sleep(self.delay)
            if self.crash_if is not None and self.crash_if(job.config):
                raise RuntimeError("loss became NaN at step 3")
            p = self.quality(job.config)
            every, rl_steps = job.config.eval.every, job.config.rl.steps
            subset = job.config.eval.every_tasks or self.tasks
            for step in range(max(2, rl_steps) if every else 2):
                on_step({"type": "step", "phase": "rl", "step": step, "time": time.time(),
                         "reward_mean": p * (step + 1) / 2, "accuracy": p, "tokens": 50})
                if every and (step + 1) % every == 0 and step + 1 < rl_steps:
                    seen = draw(job.config, f"dev-at-{step + 1}", p, subset)
                    on_step({"type": "eval", "stage": f"rl-{step + 1}", "split": "dev",
                             "step": step + 1, "n": subset,
                             "accuracy": sum(seen.values()) / subset})
            ev = job.config.eval
            dev = summary("dev", draw(job.config, "dev", p, self.tasks)) if ev.dev_tasks else None
            test = (summary("test", draw(job.config, "test", p, self.tasks))
                    if ev.test_tasks else None)
            if ev.transfer_tasks:  # read beside test; the final check takes it from the record
                transfer = summary("transfer", draw(job.config, "transfer", p * 0.5,
                                                    ev.transfer_tasks))
                transfer["execute_rate"] = 0.8
                Path(job.directory).mkdir(parents=True, exist_ok=True)
                TrialRecord(Path(job.directory)).append("final", transfer=transfer)
            return TrialResult(Path(job.directory), dev, test,
                               steps=2, tokens=100, wall_seconds=self.delay,
                               checkpoint=f"tinker://{job.id}/weights/final")
        finally:
            with self._lock:
                self.active -= 1

    def close(self) -> None:
        pass


def tiny_trial(model_dir: Path, **overrides: Any) -> dict[str, Any]:
    return {**TINY_TRIAL, "base_model": str(model_dir), "tokenizer": str(model_dir), **overrides}
