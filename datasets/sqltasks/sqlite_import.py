"""Copy a SQLite database into a DuckDB setup script (DDL and INSERTs), for the public corpora.

Column types follow SQLite's affinity rules. Values that do not fit their column's affinity
(SQLite stores them anyway) become NULL; the loaders re-run every gold query on both engines, so
a task whose answer depends on such a value is dropped rather than silently changed.
"""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any


def duckdb_type(declared: str) -> str:
    """DuckDB type for a SQLite declared type (SQLite affinity rules, section 3.1)."""
    t = declared.upper()
    if "INT" in t:
        return "BIGINT"
    if any(word in t for word in ("CHAR", "CLOB", "TEXT")) or "BLOB" in t or not t:
        return "VARCHAR"
    if any(word in t for word in ("REAL", "FLOA", "DOUB", "NUMERIC", "DECIMAL")):
        return "DOUBLE"
    return "VARCHAR"


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _literal(value: Any, kind: str) -> str:
    if value is None:
        return "NULL"
    if kind == "BIGINT":
        if isinstance(value, bool | int):
            return str(int(value))
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        try:
            return str(int(str(value).strip()))
        except ValueError:
            return "NULL"
    if kind == "DOUBLE":
        try:
            number = float(value)
        except (TypeError, ValueError):
            return "NULL"
        return repr(number) if math.isfinite(number) else "NULL"
    if isinstance(value, bytes):
        value = value.hex()
    return "'" + str(value).replace("'", "''") + "'"


def tables_of(connection: sqlite3.Connection) -> dict[str, list[tuple[str, str]]]:
    """Table -> [(column, DuckDB type)] for every user table."""
    names = [
        row[0]
        for row in connection.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
            "ORDER BY rowid"
        )
    ]
    return {
        name: [(c[1], duckdb_type(c[2] or "")) for c in connection.execute(
            f"PRAGMA table_info({_quote(name)})"
        )]
        for name in names
    }


def schema_of(connection: sqlite3.Connection) -> dict[str, dict[str, str]]:
    """Table -> {column: DuckDB type}: the schema sqlglot qualifies a SQLite gold against."""
    return {t: dict(cols) for t, cols in tables_of(connection).items()}


def setup_script(connection: sqlite3.Connection, max_rows: int = 100_000) -> str | None:
    """The DuckDB script that rebuilds the database, or None when it has over `max_rows` rows."""
    tables = tables_of(connection)
    total = 0
    parts = []
    for name, columns in tables.items():
        ddl = ", ".join(f"{_quote(col)} {kind}" for col, kind in columns)
        parts.append(f"CREATE TABLE {_quote(name)} ({ddl});")
        rows = connection.execute(f"SELECT * FROM {_quote(name)}").fetchall()
        total += len(rows)
        if total > max_rows:
            return None
        kinds = [kind for _, kind in columns]
        for start in range(0, len(rows), 500):
            chunk = rows[start : start + 500]
            values = ", ".join(
                "(" + ", ".join(_literal(v, k) for v, k in zip(row, kinds, strict=True)) + ")"
                for row in chunk
            )
            parts.append(f"INSERT INTO {_quote(name)} VALUES {values};")
    return "\n".join(parts)


def open_read_only(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)
