"""What a trial actually wrote: its evaluation samples, re-scored part by part, with the rows
its SQL returns next to the gold's.

The trial record keeps a few greedy samples of each evaluation (task, completion, extracted
SQL, verdict). `inspect_samples` re-scores them under the trial's own `RewardConfig` in the
scoring sandbox to recover every reward component, and runs the predicted and the gold query
on the task's first database in a locked `Sandbox` (same gate, time and memory limits as
scoring) to show what each returned.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoresearch.rl.config import TrialConfig
from autoresearch.rl.record import CONFIG_FILE, TrialRecord
from autoresearch.rl.tasks import split_tasks
from rewards import RewardPool, Task
from rewards.sandbox import Sandbox


@dataclass
class SampleView:
    task_id: str
    question: str
    completion: str
    sql: str | None
    gold_sql: str
    correct: bool
    outcome: str
    total: float
    components: dict[str, float]
    weights: dict[str, float]
    prediction_result: dict[str, Any]
    gold_result: dict[str, Any]


def _run(sandbox: Sandbox, task: Task, sql: str | None) -> dict[str, Any]:
    if not sql:
        return {"outcome": "no_sql", "error": "no SQL in the completion", "columns": (),
                "rows": []}
    database = sandbox.load(task.setup_sql)
    result = sandbox.run(database, sql)
    return {"outcome": str(result.outcome), "error": result.error, "columns": result.columns,
            "rows": result.rows}


def find_tasks(config: TrialConfig, split: str, ids: list[str]) -> dict[str, Task]:
    wanted = set(ids)
    return {t.id: t for t in split_tasks(config, split) if t.id in wanted}


def inspect_samples(directory: str | Path, split: str = "dev", stage: str = "final",
                    limit: int = 8) -> list[SampleView]:
    """The recorded samples of one evaluation of a trial, re-scored and run against the gold."""
    directory = Path(directory)
    config = TrialConfig.from_file(directory / CONFIG_FILE)
    evals = [e for e in TrialRecord(directory).of_type("eval")
             if e.get("split") == split and e.get("stage") == stage]
    if not evals:
        return []
    samples = (evals[-1].get("samples") or [])[:limit]
    tasks = find_tasks(config, split, [s["task"] for s in samples])
    samples = [s for s in samples if s["task"] in tasks]
    with RewardPool(workers=1, config=config.reward) as pool:
        scores = pool.score_many([(s["completion"], tasks[s["task"]]) for s in samples],
                                 config.reward)
    weights = config.reward.weights.model_dump()
    sandbox = Sandbox()
    try:
        views = []
        for sample, score in zip(samples, scores):
            task = tasks[sample["task"]]
            views.append(SampleView(
                task.id, task.question, sample["completion"], score.sql, task.gold_sql,
                score.correct, score.outcome, score.total, score.components.as_dict(), weights,
                _run(sandbox, task, score.sql), _run(sandbox, task, task.gold_sql)))
        return views
    finally:
        sandbox.close()
