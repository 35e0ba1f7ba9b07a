"""Task sources a user brings: their own databases and questions, or Spider/BIRD files.

    source = TaskSource(kind="database", path="questions.jsonl", databases=("shop.duckdb",))
    dev = source_tasks(source, "dev")          # list[rewards.Task], gold checked
    source_report(source).summary()            # what was kept, dropped and why

Relative paths are read from the working directory. A source is loaded once per process and
content (`source_digest`) and reloaded when its files change.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from rewards import Task
from sqltasks.loaders import LoadReport
from sqltasks.sources.benchmarks import load_benchmark_tasks
from sqltasks.sources.databases import open_database
from sqltasks.sources.duckdb_dump import ROW_LIMIT, DumpError
from sqltasks.sources.questions import SPLIT_NAMES, QuestionsError
from sqltasks.sources.user import Dialect, load_database_tasks

SourceKind = Literal["database", "spider", "bird"]


@dataclass(frozen=True)
class TaskSource:
    """Where tasks come from. `database`: `path` is the questions file (JSONL or CSV) and
    `databases` the DuckDB, SQLite or SQL-script files; `spider`/`bird`: `path` is the
    benchmark's root directory in its published layout."""

    kind: SourceKind
    path: str
    databases: tuple[str, ...] = ()
    dialect: Dialect = "auto"
    split_seed: int = 0
    dev_fraction: float = 0.2
    test_fraction: float = 0.2
    split_by: Literal["question", "database"] = "question"
    max_rows: int = ROW_LIMIT

    def __post_init__(self) -> None:
        if self.kind == "database" and not self.databases:
            raise ValueError("a database source names its database files (`databases`)")
        if self.kind != "database" and self.databases:
            raise ValueError(f"a {self.kind} source finds its databases under `path`")


def _digest_file(digest, path: Path, content: bool) -> None:
    stat = path.stat()
    digest.update(f"{path.name}\0{stat.st_size}\0".encode())
    if content:
        digest.update(path.read_bytes())
    else:
        digest.update(str(stat.st_mtime_ns).encode())


def source_digest(source: TaskSource) -> str:
    """A hash of what the tasks are made of: every file's content for a user's source; for a
    benchmark the question files' content and each database file's size and modification
    time (hashing BIRD's gigabytes of databases on every load would cost minutes)."""
    digest = hashlib.sha256(repr(source).encode())
    if source.kind == "database":
        for name in (source.path, *source.databases):
            path = Path(name)
            if path.is_file():
                _digest_file(digest, path, content=True)
        return digest.hexdigest()[:16]
    root = Path(source.path)
    for path in sorted(root.rglob("*")) if root.is_dir() else ():
        if path.is_file():
            digest.update(str(path.relative_to(root)).encode())
            _digest_file(digest, path, content=path.suffix == ".json")
    return digest.hexdigest()[:16]


_LOADING = threading.Lock()
"""Trials run in threads: one loads a source, the others wait for its tasks."""


def _load_once(source: TaskSource) -> tuple[tuple[Task, ...], LoadReport]:
    with _LOADING:
        return _load(source, source_digest(source))


@lru_cache(maxsize=4)
def _load(source: TaskSource, digest: str) -> tuple[tuple[Task, ...], LoadReport]:  # noqa: ARG001
    report = LoadReport()
    if source.kind == "database":
        tasks = load_database_tasks(
            source.databases, source.path, dialect=source.dialect, seed=source.split_seed,
            dev=source.dev_fraction, test=source.test_fraction, split_by=source.split_by,
            max_rows=source.max_rows, name=Path(source.path).stem, report=report)
    else:
        tasks = load_benchmark_tasks(source.kind, source.path, seed=source.split_seed,
                                     dev=source.dev_fraction, max_rows=source.max_rows,
                                     report=report)
    return tuple(tasks), report


def source_tasks(source: TaskSource, split: str) -> list[Task]:
    """The kept tasks of one split (`train`, `dev`, `test`) or of `all`."""
    if split != "all" and split not in SPLIT_NAMES:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLIT_NAMES} or 'all'")
    tasks, _ = _load_once(source)
    return [t for t in tasks if split == "all" or t.split == split]


def source_report(source: TaskSource) -> LoadReport:
    """What loading the source kept and dropped (each dropped gold with its reason)."""
    return _load_once(source)[1]


__all__ = ["DumpError", "QuestionsError", "TaskSource", "load_database_tasks",
           "load_benchmark_tasks", "open_database", "source_digest", "source_report",
           "source_tasks"]
