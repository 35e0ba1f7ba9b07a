"""Tasks from a user's own databases and questions, every gold query checked where it runs.

A gold query is kept only when it runs on its database and returns rows (an empty answer
cannot tell a right query from a wrong one); every other one is reported with its reason and
error, never silently dropped. Gold queries written for SQLite (the default on a SQLite file)
are checked against SQLite's own answer and translated to DuckDB with sqlglot; one whose
translation disagrees is reported as such.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import duckdb
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from rewards import Task
from sqltasks.loaders import LoadReport, agreeing_gold, locked_duckdb, transpile_candidates
from sqltasks.sources.databases import OpenDatabase, open_database
from sqltasks.sources.duckdb_dump import ROW_LIMIT
from sqltasks.sources.questions import Question, read_questions
from sqltasks.sources.split import SplitBy, assign_splits
from sqltasks.tiers import classify_tier

Dialect = Literal["auto", "duckdb", "sqlite"]


def _is_select(sql: str, dialect: str) -> bool:
    try:
        tree = sqlglot.parse_one(sql, read=dialect)
    except SqlglotError:
        return False
    return isinstance(tree, exp.Query)


def _run(connection: duckdb.DuckDBPyConnection, sql: str) -> tuple[list | None, str]:
    try:
        return connection.execute(sql).fetchall(), ""
    except duckdb.Error as error:
        return None, str(error).splitlines()[0]


def _duckdb_gold(question: Question, database: OpenDatabase,
                 connection: duckdb.DuckDBPyConnection, dialect: str
                 ) -> tuple[str | None, str, str]:
    """(the DuckDB gold, reason, error): the gold as written, or its DuckDB translation."""
    if not _is_select(question.gold_sql, dialect):
        return None, "not a query", ""
    candidates = ([question.gold_sql] if dialect == "duckdb"
                  else transpile_candidates(question.gold_sql, database.schema or {}))
    if not candidates:
        return None, "does not transpile", ""
    error = ""
    for candidate in candidates:
        rows, error = _run(connection, candidate)
        if rows is None:
            continue
        if not rows:
            return None, "empty gold result", ""
        return candidate, "", ""
    return None, "gold fails in DuckDB", error


def _gold(question: Question, database: OpenDatabase, connection: duckdb.DuckDBPyConnection,
          dialect: Dialect) -> tuple[str | None, str, str]:
    written_in = dialect if dialect != "auto" else (
        "sqlite" if database.kind == "sqlite" else "duckdb")
    if written_in == "sqlite" and database.sqlite is not None:
        gold, reason = agreeing_gold(question.gold_sql, database.sqlite, connection,
                                     database.schema or {})
        return gold, reason, ""
    return _duckdb_gold(question, database, connection, written_in)


def load_database_tasks(
    databases: Sequence[str | Path], questions: str | Path, *, dialect: Dialect = "auto",
    seed: int = 0, dev: float = 0.2, test: float = 0.2, split_by: SplitBy = "question",
    max_rows: int = ROW_LIMIT, name: str = "user", report: LoadReport | None = None,
) -> list[Task]:
    """Every kept question of the source as a task, its `split` set (see `split.py`)."""
    report = report if report is not None else LoadReport()
    opened: dict[str, OpenDatabase] = {}
    try:
        for path in databases:
            database = open_database(path, max_rows)
            if database.name in opened:
                raise ValueError(f"two databases are named {database.name!r}: database names "
                                 "are file names without their suffix and must differ")
            opened[database.name] = database
        records = read_questions(questions, tuple(opened))
        splits = assign_splits(records, seed, dev, test, split_by)
        connections = {n: locked_duckdb(d.setup_sql) for n, d in opened.items()}
        try:
            return list(_tasks(records, splits, opened, connections, dialect, name, report))
        finally:
            for connection in connections.values():
                if connection is not None:
                    connection.close()
    finally:
        for database in opened.values():
            database.close()


def _tasks(records, splits, opened, connections, dialect, name, report):
    for record in records:
        report.seen += 1
        database, connection = opened[record.database], connections[record.database]
        if connection is None:
            report.drop("database fails in the sandbox", record.id, record.database,
                        record.question)
            continue
        gold, reason, error = _gold(record, database, connection, dialect)
        if gold is None:
            report.drop(reason, record.id, record.database, record.question, error)
            continue
        report.kept += 1
        report.transpiled += gold != record.gold_sql
        yield Task(
            setup_sql=database.setup_sql, question=record.question, gold_sql=gold,
            id=record.id, domain=record.database, tier=record.tier or classify_tier(gold),
            split=splits[record.id],
            meta={"source": name, "database": str(database.path),
                  "original_sql": record.gold_sql},
        )
