"""One in-memory DuckDB kept open for the life of the process, where a task's database is built
in a schema of its own, read, and dropped.

Why: DuckDB hands the C heap's free memory back to the kernel (glibc `malloc_trim`, which
empties every free chunk of every arena) whenever a database instance starts its threads or is
destroyed, and whenever one of its worker threads has been idle for half a second after a query.
A process that also hosts the training engine keeps exactly that memory warm between steps
(`server.engine.host_memory`), so a prompt built from a database not seen before (a fresh
`duckdb.connect(":memory:")`, opened and closed, its worker woken) made the next forward_backward
fault gigabytes in again (`bench/bench_prompt_heap.py`). One database that stays open, with one
thread and so no workers, trims nothing after it has started; creating and dropping a schema in
it trims nothing either.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
from collections.abc import Iterator

import duckdb

_lock = threading.RLock()
_database: list[duckdb.DuckDBPyConnection] = []
_inherited: list[duckdb.DuckDBPyConnection] = []
_names = itertools.count()


def _forget_after_fork() -> None:
    """A forked child opens a database of its own and a new lock: DuckDB's threads and a lock
    another thread held did not come along. The parent's connection is kept, never used nor
    closed (closing it would run DuckDB's teardown in a process that lacks its state)."""
    global _lock
    _lock = threading.RLock()
    _inherited.extend(_database)
    _database.clear()


os.register_at_fork(after_in_child=_forget_after_fork)


@contextlib.contextmanager
def built(setup_sql: str) -> Iterator[duckdb.DuckDBPyConnection]:
    """A cursor whose search path is a fresh schema where `setup_sql` (trusted: a corpus's own
    setup script) has run; the schema and everything in it are dropped on exit, also when the
    setup fails (its error is raised). One thread builds at a time (a DuckDB connection is not
    shared between threads; a prompt's rows take milliseconds); a build inside a build is
    fine."""
    with _lock:
        if not _database:
            _database.append(duckdb.connect(":memory:", config={"threads": 1}))
        schema = f"scratch_{next(_names)}"
        cursor = _database[0].cursor()
        try:
            cursor.execute(f"CREATE SCHEMA {schema}")
            cursor.execute(f"SET search_path = '{schema}'")
            cursor.execute(setup_sql)
            yield cursor
        finally:
            cursor.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            cursor.close()
