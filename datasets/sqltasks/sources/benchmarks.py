"""Spider and BIRD in their published layouts, split for a study.

A study needs a dev split to decide on and a test split to read once. The benchmark's own dev
set is what papers report, so it is the test split here; dev is carved out of the benchmark's
train set by whole databases (seeded), as the benchmarks keep their dev databases out of train.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from rewards import Task
from sqltasks.loaders import LoadReport, load_bird, load_spider
from sqltasks.sources.duckdb_dump import ROW_LIMIT
from sqltasks.sources.questions import Question
from sqltasks.sources.split import assign_splits

Benchmark = Literal["spider", "bird"]


def _load(kind: Benchmark, root: Path, split: str, max_rows: int, report: LoadReport
          ) -> list[Task]:
    loader = load_spider if kind == "spider" else load_bird
    return loader(root, split, max_rows=max_rows, report=report)


def load_benchmark_tasks(kind: Benchmark, root: str | Path, *, seed: int = 0, dev: float = 0.1,
                         max_rows: int = ROW_LIMIT, report: LoadReport | None = None
                         ) -> list[Task]:
    """The benchmark's train set (less the dev databases) as train, its dev set as test."""
    root = Path(root)
    report = report if report is not None else LoadReport()
    train = _load(kind, root, "train", max_rows, report)
    if kind == "spider" and (root / "train_others.json").exists():
        train += _load(kind, root, "train_others", max_rows, report)
    benchmark_dev = _load(kind, root, "dev", max_rows, report)
    as_questions = [Question(t.id, t.question, t.gold_sql, t.domain) for t in train]
    splits = assign_splits(as_questions, seed, dev, 0.0, by="database")
    return ([_with_split(t, splits[t.id]) for t in train]
            + [_with_split(t, "test") for t in benchmark_dev])


def _with_split(task: Task, split: str) -> Task:
    return Task(setup_sql=task.setup_sql, question=task.question, gold_sql=task.gold_sql,
                extra_setups=task.extra_setups, id=task.id, domain=task.domain, tier=task.tier,
                split=split, meta=task.meta)
