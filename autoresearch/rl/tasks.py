"""Which tasks a trial trains and is scored on: a generated corpus, or the user's own source.

One function answers for the trial loop, the sample inspector and the caches, so that what a
trial trained on, what it is scored on and what its cache entry is keyed by never disagree.
"""

from __future__ import annotations

from autoresearch.rl.config import TasksConfig, TrialConfig
from rewards import Task
from sqltasks import TaskSource, load_corpus, source_report, source_tasks
from sqltasks.sources import source_digest


def task_source(tasks: TasksConfig) -> TaskSource:
    return TaskSource(
        kind=tasks.source, path=tasks.path, databases=tuple(tasks.databases),
        dialect=tasks.dialect, split_seed=tasks.split_seed, dev_fraction=tasks.dev_fraction,
        test_fraction=tasks.test_fraction, split_by=tasks.split_by, max_rows=tasks.max_rows)


def split_tasks(config: TrialConfig, split: str) -> list[Task]:
    """The tasks of `split` (`train`, `dev`, `test`) for this config."""
    source = config.tasks
    if source is None or (split == "train" and source.train_on == "corpus"):
        return load_corpus(split, config.corpus_seed, corpus=config.corpus)
    return source_tasks(task_source(source), split)


def source_summary(config: TrialConfig) -> dict | None:
    """What loading the user's source kept and dropped, for the trial's record."""
    if config.tasks is None:
        return None
    report = source_report(task_source(config.tasks))
    return {"summary": report.summary(), **report.as_dict()}


def data_digest(config: TrialConfig) -> str | None:
    """A hash of the user's task files (None for the generated corpora, which the code digest
    already covers): a cached result computed on other data is never reused."""
    return None if config.tasks is None else source_digest(task_source(config.tasks))
