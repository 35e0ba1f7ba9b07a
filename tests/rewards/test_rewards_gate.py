"""The static gate admits one query over the schema's tables and nothing else."""

import pytest

from rewards.gate import Verdict, check

TABLES = {"t", "u"}


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT a FROM t",
        "FROM t SELECT a",
        "SELECT a FROM t UNION ALL SELECT a FROM u",
        "WITH s AS (SELECT a FROM t) SELECT * FROM s",
        "SELECT a, RANK() OVER (ORDER BY a) FROM T QUALIFY a > 1",
        "(SELECT a FROM t)",
        "SELECT 1",
    ],
)
def test_admits_plain_queries(sql):
    assert check(sql, TABLES).verdict is Verdict.OK


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1; SELECT 2",
        "DROP TABLE t",
        "COPY t TO 'x.csv'",
        "ATTACH 'x.db' AS x",
        "INSTALL httpfs",
        "LOAD httpfs",
        "PRAGMA version",
        "SET threads = 8",
        "DESCRIBE t",
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM '/etc/passwd'",
        "SELECT * FROM glob('/*')",
        "SELECT * FROM range(10)",
        "SELECT * FROM main.t",
        "SELECT * FROM information_schema.tables",
        "SELECT * FROM duckdb_settings()",
        "SELECT (SELECT count(*) FROM read_text('/etc/hostname'))",
        "SELECT repeat('x', 1000000000)",
        "SELECT lpad('x', 1000000000, 'y')",
        "SELECT getenv('HOME')",
        "SELECT unnest(range(100))",
        "SELECT a INTO v FROM t",
        "SELECT " + "1 + " * 5000 + "1",
    ],
)
def test_refuses_everything_else(sql):
    assert check(sql, TABLES).verdict is Verdict.REFUSED


def test_syntax_errors_and_unknown_tables_have_their_own_verdicts():
    assert check("SELEC a FROM t", TABLES).verdict is Verdict.SYNTAX
    assert check("SELECT a FROM v", TABLES).verdict is Verdict.UNKNOWN_TABLE
