"""Open a user's database, whatever it is stored as, as a DuckDB setup script.

Three forms: a DuckDB file, a SQLite file (copied with SQLite's type affinity, see
`sqltasks.sqlite_import`), and a SQL script run in a fresh DuckDB (it may read files next to
it: it is the user's own, trusted input; what it builds is copied, not re-run). The file's
first bytes decide, not its name.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

import duckdb

from sqltasks.sources.duckdb_dump import ROW_LIMIT, DumpError, dump
from sqltasks.sqlite_import import open_read_only, schema_of, setup_script

SQLITE_MAGIC = b"SQLite format 3\x00"


@dataclass
class OpenDatabase:
    """A user database: its DuckDB setup script, and for a SQLite file the file itself (gold
    queries written for SQLite are checked against SQLite's own answer)."""

    name: str
    path: Path
    setup_sql: str
    kind: str
    sqlite: sqlite3.Connection | None = None
    schema: dict[str, dict[str, str]] | None = None

    def close(self) -> None:
        if self.sqlite is not None:
            self.sqlite.close()


def kind_of(path: Path) -> str:
    """`sqlite`, `duckdb` or `sql`, from the file's contents."""
    with path.open("rb") as handle:
        head = handle.read(16)
    if head.startswith(SQLITE_MAGIC):
        return "sqlite"
    if head[8:12] == b"DUCK":
        return "duckdb"
    return "sql"


def open_database(path: str | Path, max_rows: int = ROW_LIMIT, name: str | None = None
                  ) -> OpenDatabase:
    """The database at `path` as a setup script; `DumpError` says why one cannot be used."""
    path = Path(path)
    name = name or path.stem
    if not path.is_file():
        raise DumpError(f"database {name}: no file at {path}")
    kind = kind_of(path)
    if kind == "sqlite":
        lite = open_read_only(path)
        script = setup_script(lite, max_rows)
        if script is None:
            lite.close()
            raise DumpError(f"database {name} holds over {max_rows} rows: keep a sample of the "
                            "large tables or raise max_rows")
        return OpenDatabase(name, path, script, kind, lite, schema_of(lite))
    if kind == "duckdb":
        connection = duckdb.connect(str(path), read_only=True)
    else:
        connection = duckdb.connect(":memory:")
        try:
            # Files the script names are read from beside it (not from the process's working
            # directory, which trials in other threads share).
            folder = str(path.resolve().parent).replace("'", "''")
            connection.execute(f"SET file_search_path = '{folder}'")
            connection.execute(path.read_text(encoding="utf-8"))
        except (duckdb.Error, UnicodeDecodeError) as error:
            connection.close()
            raise DumpError(f"database {name}: the script {path} fails: {error}") from error
    try:
        return OpenDatabase(name, path, dump(connection, max_rows, f"database {name}"), kind)
    finally:
        connection.close()
