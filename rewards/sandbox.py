"""A locked-down DuckDB that runs untrusted queries and returns a verdict, never raising.

One in-memory DuckDB instance per worker process holds many task databases, each in its own
schema. Before any untrusted text runs, the instance is configured in a fixed order and then
locked: no external access (files, network, COPY, ATTACH, INSTALL/LOAD, replacement scans), no
spilling to disk, one thread, a memory limit and a statement time limit (DuckDB's
`max_execution_time`, or a watchdog that interrupts the query where that setting is missing).
Each query must pass the sqlglot gate and DuckDB's own statement parser (exactly one SELECT),
runs inside a transaction that is always rolled back, and may return at most `max_rows` rows.
The process-level guards (address-space cap, kill timeout) live in `rewards.worker` and
`rewards.pool`.
"""

from __future__ import annotations

import contextlib
import enum
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import duckdb

from rewards import gate
from rewards.config import SandboxLimits
from rewards.task import database_key


class Outcome(enum.StrEnum):
    OK = "ok"
    SYNTAX = "syntax"
    UNKNOWN_TABLE = "unknown_table"
    REFUSED = "refused"
    ERROR = "error"
    TIMEOUT = "timeout"
    MEMORY = "memory"
    TOO_LARGE = "too_large"


UNSAFE = frozenset(
    {Outcome.REFUSED, Outcome.UNKNOWN_TABLE, Outcome.TIMEOUT, Outcome.MEMORY, Outcome.TOO_LARGE}
)
"""Outcomes that zero a prediction's total whatever the weights: the sandbox refused the text
(including any name outside the schema) or had to stop it."""


@dataclass(frozen=True)
class QueryResult:
    outcome: Outcome
    rows: list[tuple[Any, ...]] = field(default_factory=list)
    columns: tuple[str, ...] = ()
    error: str = ""
    elapsed_s: float = 0.0


class SandboxBroken(RuntimeError):
    """DuckDB invalidated the instance (a fatal error); the worker must start afresh."""


@dataclass(frozen=True)
class Database:
    """A task database loaded into the sandbox."""

    key: str
    tables: frozenset[str]
    columns: dict[str, frozenset[str]] = field(default_factory=dict, compare=False)
    """Each table's (and view's) column names, lower case: what schema linking checks against."""


def _locking_statements(limits: SandboxLimits, native_time_limit: bool) -> list[str]:
    """Settings in the order that works: temp directory first, external access, then the lock."""
    time_limit = [f"SET max_execution_time={int(limits.timeout_s * 1000)}"]
    return [
        "SET temp_directory=''",
        f"SET memory_limit='{limits.memory_limit_mb}MB'",
        "SET threads=1",
        *(time_limit if native_time_limit else []),
        "SET autoinstall_known_extensions=false",
        "SET autoload_known_extensions=false",
        "SET allow_community_extensions=false",
        "SET python_enable_replacements=false",
        "SET enable_external_access=false",
        "SET lock_configuration=true",
    ]


class Watchdog:
    """Interrupts a query that outlives its budget, for DuckDB builds without
    `max_execution_time`. It polls instead of waiting on a condition, so arming it costs two
    attribute writes and no thread hand-off on the hot path."""

    POLL_S = 0.05

    def __init__(self) -> None:
        self._connection: duckdb.DuckDBPyConnection | None = None
        self._deadline: float | None = None
        self._thread = threading.Thread(target=self._run, name="sql-watchdog", daemon=True)
        self._thread.start()

    def arm(self, connection: duckdb.DuckDBPyConnection, seconds: float) -> None:
        self._connection = connection
        self._deadline = time.monotonic() + seconds

    def disarm(self) -> None:
        self._deadline = None

    def _run(self) -> None:
        while True:
            time.sleep(self.POLL_S)
            deadline, connection = self._deadline, self._connection
            if deadline is not None and connection is not None and time.monotonic() > deadline:
                self._deadline = None
                connection.interrupt()


def _has_setting(connection: duckdb.DuckDBPyConnection, name: str) -> bool:
    found = connection.execute("SELECT count(*) FROM duckdb_settings() WHERE name = $1", [name])
    return found.fetchone()[0] > 0


class Sandbox:
    """Holds the locked instance and a bounded cache of task databases."""

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self._connection = duckdb.connect(":memory:")
        native_limit = _has_setting(self._connection, "max_execution_time")
        for statement in _locking_statements(self.limits, native_limit):
            self._connection.execute(statement)
        self._databases: OrderedDict[str, Database] = OrderedDict()
        self._cursors: dict[str, duckdb.DuckDBPyConnection] = {}
        self._watchdog = None if native_limit else Watchdog()

    def load(self, setup_sql: str, pinned: frozenset[str] = frozenset()) -> Database:
        """Create (or reuse) the database that `setup_sql` describes. Trusted input.

        Databases named in `pinned` (those of the task being scored) are never evicted."""
        key = database_key(setup_sql)
        database = self._databases.get(key)
        if database is not None:
            self._databases.move_to_end(key)
            return database
        while len(self._databases) >= self.limits.cached_databases and self._evict_oldest(pinned):
            pass
        connection = self._connection
        connection.execute(f"DROP SCHEMA IF EXISTS {key} CASCADE")
        connection.execute(f"CREATE SCHEMA {key}")
        connection.execute(f"SET search_path = '{key}'")
        try:
            connection.execute(setup_sql)
        except duckdb.Error:
            connection.execute(f"DROP SCHEMA IF EXISTS {key} CASCADE")
            raise
        names = connection.execute(
            "SELECT table_name FROM duckdb_tables() WHERE schema_name = $1 "
            "UNION SELECT view_name FROM duckdb_views() WHERE schema_name = $1",
            [key],
        ).fetchall()
        columns: dict[str, set[str]] = {}
        for table, column in connection.execute(
                "SELECT table_name, column_name FROM duckdb_columns() WHERE schema_name = $1",
                [key]).fetchall():
            columns.setdefault(table.lower(), set()).add(column.lower())
        cursor = connection.cursor()  # its own session: search_path set once, no switching
        cursor.execute(f"SET search_path = '{key}'")
        database = Database(key, frozenset(name for (name,) in names),
                            {table: frozenset(cols) for table, cols in columns.items()})
        self._databases[key] = database
        self._cursors[key] = cursor
        cap = self.limits.memory_limit_mb * 1024 * 1024 * self.limits.cache_memory_fraction
        while self._memory_in_use() > cap and self._evict_oldest(pinned | {key}):
            pass
        return database

    def _evict_oldest(self, pinned: frozenset[str]) -> bool:
        """Drop the least recently used database not in `pinned`; False when there is none."""
        old = next((k for k in self._databases if k not in pinned), None)
        if old is None:
            return False
        del self._databases[old]
        self._cursors.pop(old).close()
        self._connection.execute(f"DROP SCHEMA IF EXISTS {old} CASCADE")
        return True

    def _memory_in_use(self) -> int:
        """Bytes DuckDB holds; cached databases must leave room for queries."""
        used = self._connection.execute("SELECT sum(memory_usage_bytes) FROM duckdb_memory()")
        return int(used.fetchone()[0] or 0)

    def run(self, database: Database, sql: str) -> QueryResult:
        """Run untrusted `sql` on `database` for at most `timeout_s`; returns a verdict and
        never raises a DuckDB error."""
        started = time.monotonic()
        verdict = gate.check(sql, database.tables, self.limits.max_sql_chars)
        connection = self._cursors[database.key]
        try:
            statements = connection.extract_statements(sql)
        except duckdb.Error as error:
            if verdict.verdict is gate.Verdict.OK:
                return QueryResult(Outcome.SYNTAX, error=_first_line(error))
            statements = None
        if statements is not None and (
            len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT
        ):
            return QueryResult(Outcome.REFUSED, error="not exactly one SELECT statement")
        if verdict.verdict is not gate.Verdict.OK:
            return QueryResult(Outcome(verdict.verdict.value), error=verdict.reason)
        budget = self.limits.timeout_s
        connection.execute("BEGIN TRANSACTION")
        if self._watchdog is not None:
            self._watchdog.arm(connection, budget)
        try:
            cursor = connection.execute(sql)
            rows = cursor.fetchmany(self.limits.max_rows + 1)
            columns = tuple(d[0] for d in cursor.description or ())
        except duckdb.FatalException as error:
            raise SandboxBroken(_first_line(error)) from error
        except duckdb.InterruptException:
            return QueryResult(Outcome.TIMEOUT, error=f"query ran past {budget:.2f}s")
        except (duckdb.OutOfMemoryException, MemoryError) as error:
            return QueryResult(Outcome.MEMORY, error=_first_line(error))
        except duckdb.Error as error:
            message = _first_line(error)
            outcome = Outcome.TIMEOUT if "maximum execution time" in message else Outcome.ERROR
            return QueryResult(outcome, error=message)
        finally:
            if self._watchdog is not None:
                self._watchdog.disarm()
            with contextlib.suppress(duckdb.Error):
                connection.execute("ROLLBACK")
        elapsed = time.monotonic() - started
        if len(rows) > self.limits.max_rows:
            return QueryResult(
                Outcome.TOO_LARGE, error=f"more than {self.limits.max_rows} rows", elapsed_s=elapsed
            )
        return QueryResult(Outcome.OK, rows=rows, columns=columns, elapsed_s=elapsed)

    def close(self) -> None:
        self._connection.close()


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:500]
