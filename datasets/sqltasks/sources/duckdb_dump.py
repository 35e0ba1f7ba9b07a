"""Copy a user's DuckDB database (a file, or one a SQL script built) into a setup script.

The sandbox rebuilds every task database from a script in its own locked instance, so a user's
database becomes DDL (as the user declared it, keys included: the prompt shows them) and
INSERTs. Values travel as their text form and are cast back by the column's type on insert;
every table is then compared with the original, so a value whose text form does not survive
the trip is an error naming its table, never a silently different database.
"""

from __future__ import annotations

import duckdb

ROW_LIMIT = 100_000
"""Rows a database may hold in all: the sandbox keeps task databases in memory."""
_BATCH = 500


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _literal(value: str | None) -> str:
    return "NULL" if value is None else "'" + value.replace("'", "''") + "'"


class DumpError(ValueError):
    """A database that cannot become a task database; the message says why and what to do."""


def _tables(connection: duckdb.DuckDBPyConnection) -> list[tuple[str, str, str]]:
    rows = connection.execute(
        "SELECT schema_name, table_name, sql FROM duckdb_tables() "
        "WHERE database_name = current_database() AND NOT internal AND NOT temporary "
        "ORDER BY table_oid").fetchall()
    outside = sorted(f"{schema}.{table}" for schema, table, _ in rows if schema != "main")
    if outside:
        raise DumpError(f"tables outside the main schema are not supported: {outside[:5]}; "
                        "move them to `main` (task databases have one namespace)")
    return rows


def _views(connection: duckdb.DuckDBPyConnection) -> list[str]:
    return [sql for (sql,) in connection.execute(
        "SELECT sql FROM duckdb_views() WHERE database_name = current_database() "
        "AND NOT internal AND NOT temporary AND schema_name = 'main' ORDER BY view_oid"
        ).fetchall()]


def _fingerprint(connection: duckdb.DuckDBPyConnection, table: str) -> tuple[int, str]:
    """Row count and a hash of the rows' text forms, independent of row order."""
    count, digest = connection.execute(
        f"SELECT count(*), md5(coalesce(string_agg(r, chr(31) ORDER BY r), '')) FROM "
        f"(SELECT CAST(t AS VARCHAR) AS r FROM {_quote(table)} AS t)").fetchone()
    return int(count), str(digest)


def dump(connection: duckdb.DuckDBPyConnection, max_rows: int = ROW_LIMIT,
         name: str = "database") -> str:
    """The setup script that rebuilds `connection`'s main schema (tables, rows, views)."""
    tables = _tables(connection)
    if not tables:
        raise DumpError(f"{name} has no tables")
    total = sum(connection.execute(f"SELECT count(*) FROM {_quote(t)}").fetchone()[0]
                for _, t, _ in tables)
    if total > max_rows:
        raise DumpError(f"{name} holds {total} rows, over the limit of {max_rows}: task "
                        "databases live in the sandbox's memory; keep a sample of the large "
                        "tables (golds are re-run on what is kept) or raise max_rows")
    parts = []
    for _, table, ddl in tables:
        parts.append(ddl.rstrip().rstrip(";") + ";")
        columns = [c for (c,) in connection.execute(
            "SELECT column_name FROM duckdb_columns() WHERE database_name = current_database() "
            "AND schema_name = 'main' AND table_name = $1 ORDER BY column_index",
            [table]).fetchall()]
        as_text = ", ".join(f"CAST({_quote(c)} AS VARCHAR)" for c in columns)
        cursor = connection.execute(f"SELECT {as_text} FROM {_quote(table)}")
        while batch := cursor.fetchmany(_BATCH):
            values = ", ".join("(" + ", ".join(_literal(v) for v in row) + ")" for row in batch)
            parts.append(f"INSERT INTO {_quote(table)} VALUES {values};")
    parts.extend(sql.rstrip().rstrip(";") + ";" for sql in _views(connection))
    script = "\n".join(parts)
    _check_round_trip(connection, script, [t for _, t, _ in tables], name)
    return script


def _check_round_trip(original: duckdb.DuckDBPyConnection, script: str, tables: list[str],
                      name: str) -> None:
    copy = duckdb.connect(":memory:")
    try:
        try:
            copy.execute(script)
        except duckdb.Error as error:
            raise DumpError(f"{name} could not be rebuilt from its copy: {error}") from error
        for table in tables:
            if _fingerprint(copy, table) != _fingerprint(original, table):
                raise DumpError(f"{name}: table {table!r} holds values whose text form does "
                                "not read back the same (cast them to a plain type)")
    finally:
        copy.close()
