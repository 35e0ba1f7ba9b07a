"""Loaders for public text-to-SQL corpora from local files, kept only where DuckDB agrees.

Spider, BIRD and Gretel's synthetic_text_to_sql ship SQLite-flavoured gold queries. Each loader
reads a corpus in its published layout, rebuilds the database as a DuckDB setup script,
transpiles the gold with sqlglot (plain first, then with schema types, which fixes integer
division), and keeps a task only if the DuckDB gold runs and returns the same non-empty result
as the original gold does in SQLite. Everything else is counted in a `LoadReport` by reason:
sqlglot's SQLite to DuckDB translation is not semantics-preserving (case-sensitive LIKE,
double-quoted strings, casts, bare GROUP BY columns), so silent differences must be caught here.

Layouts:
- Spider: `<root>/{dev.json,train_spider.json}` and `<root>/database/<db_id>/<db_id>.sqlite`.
- BIRD: `<root>/{dev,train}.json` and `<root>/{dev,train}_databases/<db_id>/<db_id>.sqlite`;
  the question gets the `evidence` hint appended.
- Gretel: `<root>/synthetic_text_to_sql_{train,test}.snappy.parquet` (or a `.jsonl` with the
  same fields); each record's `sql_context` is its database.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError
from sqlglot.optimizer.annotate_types import annotate_types
from sqlglot.optimizer.qualify import qualify

from rewards import Task, execution_match, has_top_level_order_by
from sqltasks.sqlite_import import open_read_only, schema_of, setup_script
from sqltasks.tiers import classify_tier

QUERY_TIMEOUT_S = 10.0


@dataclass
class LoadReport:
    """How many records a loader saw and kept, why it dropped the rest, and which they were."""

    seen: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)
    transpiled: int = 0
    """Kept gold queries that were rewritten from SQLite's dialect into DuckDB's."""
    problems: list[dict[str, str]] = field(default_factory=list)
    """One entry per dropped record: its id, database, question, reason and error."""

    def drop(self, reason: str, ident: str, database: str, question: str,
             error: str = "") -> None:
        self.dropped[reason] += 1
        self.problems.append({"id": ident, "database": database, "question": question,
                              "reason": reason, "error": error[:300]})

    def as_dict(self) -> dict[str, Any]:
        return {"seen": self.seen, "kept": self.kept, "dropped": dict(self.dropped),
                "transpiled": self.transpiled, "problems": self.problems}

    def summary(self) -> str:
        """One line a user reads: kept, dropped by reason, translated."""
        reasons = ", ".join(f"{n} {reason}" for reason, n in self.dropped.most_common())
        dropped = f"; dropped {self.seen - self.kept} ({reasons})" if self.dropped else ""
        moved = f"; {self.transpiled} translated from SQLite" if self.transpiled else ""
        return f"{self.kept} of {self.seen} questions kept{dropped}{moved}"


def _sqlite_rows(connection: sqlite3.Connection, sql: str) -> list[tuple[Any, ...]] | None:
    deadline = time.monotonic() + QUERY_TIMEOUT_S
    connection.set_progress_handler(lambda: int(time.monotonic() > deadline), 10_000)
    try:
        return connection.execute(sql).fetchall()
    except (sqlite3.Error, OverflowError):
        return None
    finally:
        connection.set_progress_handler(None, 0)


def locked_duckdb(setup: str) -> duckdb.DuckDBPyConnection | None:
    connection = duckdb.connect(":memory:")
    try:
        connection.execute(setup)
        connection.execute(f"SET max_execution_time={int(QUERY_TIMEOUT_S * 1000)}")
        connection.execute("SET enable_external_access=false")
        connection.execute("SET lock_configuration=true")
    except duckdb.Error:
        connection.close()
        return None
    return connection


def duckdb_rows(connection: duckdb.DuckDBPyConnection, sql: str) -> list[tuple] | None:
    try:
        return connection.execute(sql).fetchall()
    except duckdb.Error:
        return None


def transpile_candidates(sql: str, schema: dict[str, dict[str, str]]) -> list[str]:
    """DuckDB renderings of a SQLite query: plain, then type-aware (qualified and annotated)."""
    candidates = []
    try:
        candidates.append(sqlglot.transpile(sql, read="sqlite", write="duckdb")[0])
    except SqlglotError:
        return []
    try:
        tree = qualify(sqlglot.parse_one(sql, read="sqlite"), schema=schema, dialect="sqlite")
        typed = annotate_types(tree, schema=schema).sql(dialect="duckdb")
        if typed not in candidates:
            candidates.append(typed)
    except (SqlglotError, KeyError, ValueError, AttributeError):
        pass
    return candidates


def _is_query(sql: str) -> bool:
    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
    except SqlglotError:
        return False
    return isinstance(tree, exp.Select | exp.SetOperation)


def agreeing_gold(
    gold: str,
    sqlite_connection: sqlite3.Connection,
    duck: duckdb.DuckDBPyConnection,
    schema: dict[str, dict[str, str]],
) -> tuple[str | None, str]:
    """The DuckDB gold that reproduces SQLite's result, or None and the reason it fails."""
    if not _is_query(gold):
        return None, "not a query"
    expected = _sqlite_rows(sqlite_connection, gold)
    if expected is None:
        return None, "gold fails in SQLite"
    if not expected:
        return None, "empty gold result"
    candidates = transpile_candidates(gold, schema)
    if not candidates:
        return None, "does not transpile"
    reason = "fails in DuckDB"
    for candidate in candidates:
        rows = duckdb_rows(duck, candidate)
        if rows is None:
            continue
        ordered = has_top_level_order_by(candidate)
        if execution_match(rows, expected, ordered=ordered, column_mode="strict"):
            return candidate, ""
        reason = "different result in DuckDB"
    return None, reason


class _Databases:
    """SQLite databases of a corpus with their DuckDB copies, opened once each."""

    def __init__(self, directory: Path, max_rows: int) -> None:
        self.directory, self.max_rows = directory, max_rows
        self._open: dict[str, tuple | None] = {}

    def get(self, db_id: str):
        if db_id not in self._open:
            path = self.directory / db_id / f"{db_id}.sqlite"
            entry = None
            if path.exists():
                lite = open_read_only(path)
                setup = setup_script(lite, self.max_rows)
                duck = locked_duckdb(setup) if setup is not None else None
                entry = (lite, setup, duck, schema_of(lite)) if duck is not None else None
            self._open[db_id] = entry
        return self._open[db_id]

    def close(self) -> None:
        for entry in self._open.values():
            if entry:
                entry[0].close()
                entry[2].close()


def _from_sqlite_corpus(
    name: str, records: list[dict], databases: _Databases, gold_key: str, split: str,
    question_of, report: LoadReport,
) -> Iterator[Task]:
    try:
        for index, record in enumerate(records):
            report.seen += 1
            ident = f"{name}-{split}-{index}"
            entry = databases.get(record["db_id"])
            if entry is None:
                report.drop("database missing or too large", ident, record["db_id"],
                            question_of(record))
                continue
            lite, setup, duck, schema = entry
            gold, reason = agreeing_gold(record[gold_key], lite, duck, schema)
            if gold is None:
                report.drop(reason, ident, record["db_id"], question_of(record))
                continue
            report.kept += 1
            report.transpiled += gold != record[gold_key]
            yield Task(
                setup_sql=setup,
                question=question_of(record),
                gold_sql=gold,
                id=ident,
                domain=record["db_id"],
                tier=classify_tier(gold),
                split=split,
                meta={"source": name, "original_sql": record[gold_key],
                      "difficulty": record.get("difficulty", "")},
            )
    finally:
        databases.close()


def load_spider(
    root: str | Path, split: str = "dev", max_rows: int = 100_000,
    report: LoadReport | None = None,
) -> list[Task]:
    """Spider 1.0 tasks whose gold agrees between SQLite and DuckDB."""
    root = Path(root)
    files = {"dev": "dev.json", "train": "train_spider.json", "train_others": "train_others.json"}
    records = json.loads((root / files[split]).read_text(encoding="utf-8"))
    return list(_from_sqlite_corpus(
        "spider", records, _Databases(root / "database", max_rows), "query", split,
        lambda r: r["question"], report if report is not None else LoadReport(),
    ))


def load_bird(
    root: str | Path, split: str = "dev", max_rows: int = 100_000,
    report: LoadReport | None = None,
) -> list[Task]:
    """BIRD tasks (question plus evidence) whose gold agrees between SQLite and DuckDB."""
    root = Path(root)
    records = json.loads((root / f"{split}.json").read_text(encoding="utf-8"))

    def question(record: dict) -> str:
        evidence = (record.get("evidence") or "").strip()
        return f"{record['question']} Hint: {evidence}" if evidence else record["question"]

    return list(_from_sqlite_corpus(
        "bird", records, _Databases(root / f"{split}_databases", max_rows), "SQL", split,
        question, report if report is not None else LoadReport(),
    ))


def _gretel_records(path: Path) -> list[dict]:
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    if path.suffix == ".json":
        return json.loads(path.read_text(encoding="utf-8"))
    connection = duckdb.connect(":memory:")
    try:
        cursor = connection.execute("SELECT * FROM read_parquet($1)", [str(path)])
        columns = [d[0] for d in cursor.description]
        return [dict(zip(columns, row, strict=False)) for row in cursor.fetchall()]
    finally:
        connection.close()


def _gretel_path(root: Path, split: str) -> Path:
    if root.is_file():
        return root
    for suffix in (".snappy.parquet", ".parquet", ".jsonl", ".json"):
        path = root / f"synthetic_text_to_sql_{split}{suffix}"
        if path.exists():
            return path
    raise FileNotFoundError(f"no synthetic_text_to_sql_{split}.* under {root}")


def load_gretel(
    root: str | Path, split: str = "test", report: LoadReport | None = None
) -> list[Task]:
    """Gretel synthetic_text_to_sql records whose context holds rows and whose gold agrees."""
    report = report if report is not None else LoadReport()
    tasks = []
    for index, record in enumerate(_gretel_records(_gretel_path(Path(root), split))):
        report.seen += 1
        context, gold = record.get("sql_context") or "", record.get("sql") or ""
        if "insert into" not in context.lower():
            report.dropped["context has no rows"] += 1
            continue
        lite = sqlite3.connect(":memory:")
        try:
            lite.executescript(context)
            setup = ";\n".join(sqlglot.transpile(context, read="sqlite", write="duckdb")) + ";"
        except (sqlite3.Error, SqlglotError):
            report.dropped["context fails"] += 1
            lite.close()
            continue
        duck = locked_duckdb(setup)
        if duck is None:
            report.dropped["context fails in DuckDB"] += 1
            lite.close()
            continue
        try:
            duck_gold, reason = agreeing_gold(gold, lite, duck, schema_of(lite))
        finally:
            lite.close()
            duck.close()
        if duck_gold is None:
            report.dropped[reason] += 1
            continue
        report.kept += 1
        tasks.append(Task(
            setup_sql=setup,
            question=record["sql_prompt"],
            gold_sql=duck_gold,
            id=f"gretel-{split}-{record.get('id', index)}",
            domain=str(record.get("domain", "")),
            tier=classify_tier(duck_gold),
            split=split,
            meta={"source": "gretel", "original_sql": gold,
                  "complexity": record.get("sql_complexity", "")},
        ))
    return tasks
