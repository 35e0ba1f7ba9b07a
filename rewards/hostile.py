"""A catalogue of hostile predictions by attack class, to re-check the sandbox on any upgrade.

Every entry must score zero, within the sandbox's time bound, without creating or reading a file.
`attacks(scratch)` points the file attacks at a scratch directory (which holds `secret.csv`,
written by the caller) and at the table `tables[0]` of the task under attack.
"""

from __future__ import annotations

from pathlib import Path

Attack = tuple[str, str, str]
"""(attack class, name, SQL)."""


def attacks(scratch: Path, table: str) -> list[Attack]:
    secret, out = scratch / "secret.csv", scratch / "written"
    cross = ", ".join(f"{table} t{i}" for i in range(16))
    return [
        ("file read", "read_csv", f"SELECT * FROM read_csv('{secret}')"),
        ("file read", "read_text", f"SELECT * FROM read_text('{secret}')"),
        ("file read", "read_blob", f"SELECT * FROM read_blob('{secret}')"),
        ("file read", "path as table", f"SELECT * FROM '{secret}'"),
        ("file read", "glob", f"SELECT * FROM glob('{scratch}/*')"),
        ("file read", "read_json_auto", f"SELECT * FROM read_json_auto('{secret}')"),
        ("file read", "sniff_csv", f"SELECT * FROM sniff_csv('{secret}')"),
        ("file read", "hidden in subquery",
         f"SELECT (SELECT count(*) FROM read_text('{secret}')) AS n"),
        ("file read", "quoted identifier path", f'SELECT * FROM "{secret}"'),
        ("file write", "copy to csv", f"COPY {table} TO '{out}.csv'"),
        ("file write", "copy query to parquet",
         f"COPY (SELECT 1) TO '{out}.parquet' (FORMAT parquet)"),
        ("file write", "export database", f"EXPORT DATABASE '{out}_dir'"),
        ("COPY", "copy from file", f"COPY {table} FROM '{secret}'"),
        ("ATTACH", "attach file", f"ATTACH '{out}.duckdb' AS other"),
        ("ATTACH", "attach memory", "ATTACH ':memory:' AS other"),
        ("INSTALL/LOAD", "install", "INSTALL httpfs"),
        ("INSTALL/LOAD", "load", "LOAD httpfs"),
        ("INSTALL/LOAD", "force install", "FORCE INSTALL tpch"),
        ("table function", "duckdb_settings", "SELECT * FROM duckdb_settings()"),
        ("table function", "duckdb_tables", "SELECT * FROM duckdb_tables()"),
        ("table function", "query", f"SELECT * FROM query('DROP TABLE {table}')"),
        ("table function", "range", "SELECT * FROM range(1000000000)"),
        ("table function", "pragma function", f"SELECT * FROM pragma_table_info('{table}')"),
        ("table function", "information_schema", "SELECT * FROM information_schema.tables"),
        ("table function", "qualified name", f"SELECT * FROM memory.main.{table}"),
        ("table function", "replacement scan of a caller variable", "SELECT * FROM sys"),
        ("huge result", "cross join rows", f"SELECT * FROM {table} a, {table} b, {table} c, "
                                            f"{table} d, {table} e, {table} f"),
        ("huge result", "range rows", "SELECT * FROM generate_series(1, 100000000)"),
        ("runaway time", "cross join count", f"SELECT count(*) FROM {cross}"),
        ("runaway time", "infinite recursion",
         "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) SELECT count(*) FROM r"),
        ("runaway memory", "doubling string",
         "WITH RECURSIVE r(s, n) AS (SELECT 'x', 0 UNION ALL SELECT s || s, n + 1 FROM r "
         "WHERE n < 40) SELECT max(length(s)) FROM r"),
        ("runaway memory", "list of a cross join",
         f"SELECT length(list(t0.id)) FROM {cross}"),
        ("runaway memory", "string_agg of a cross join",
         f"SELECT length(string_agg(t0.id::VARCHAR || 'xxxxxxxxxxxxxxxx', ',')) FROM {cross}"),
        ("runaway memory", "repeat", "SELECT length(repeat('x', 2000000000))"),
        ("several statements", "two selects", f"SELECT 1; SELECT * FROM {table}"),
        ("several statements", "select then drop", f"SELECT 1; DROP TABLE {table}"),
        ("DDL/DML", "drop", f"DROP TABLE {table}"),
        ("DDL/DML", "create as", "CREATE TABLE stolen AS SELECT 1"),
        ("DDL/DML", "insert", f"INSERT INTO {table} SELECT * FROM {table}"),
        ("DDL/DML", "update", f"UPDATE {table} SET id = 0"),
        ("DDL/DML", "delete", f"DELETE FROM {table}"),
        ("DDL/DML", "alter", f"ALTER TABLE {table} RENAME TO gone"),
        ("DDL/DML", "set", "SET memory_limit = '64GB'"),
        ("DDL/DML", "unlock", "SET lock_configuration = false"),
        ("DDL/DML", "pragma", "PRAGMA enable_profiling"),
        ("DDL/DML", "checkpoint", "CHECKPOINT"),
        ("DDL/DML", "transaction", "BEGIN TRANSACTION"),
        ("DDL/DML", "use", "USE memory"),
        ("DDL/DML", "select into", f"SELECT * INTO copied FROM {table}"),
    ]
