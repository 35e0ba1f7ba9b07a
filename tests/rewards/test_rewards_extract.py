"""Pulling SQL out of what chat and base models write."""

import pytest

from rewards import extract, extract_sql


@pytest.mark.parametrize(
    ("completion", "sql"),
    [
        ("```sql\nSELECT a FROM t;\n```\nThis lists a.", "SELECT a FROM t"),
        ("Here is the query:\n```sql\nSELECT a\nFROM t\n```", "SELECT a\nFROM t"),
        ("```\nSELECT 1\n```", "SELECT 1"),
        ("SELECT a FROM t WHERE b = 'x;y';\nQuestion: next one", "SELECT a FROM t WHERE b = 'x;y'"),
        ("SELECT a FROM t\n```\n\nQuestion: how many?", "SELECT a FROM t"),
        ("SELECT a FROM t\n\nThe query selects a.", "SELECT a FROM t"),
        ("SQL: SELECT COUNT(*) FROM t", "SELECT COUNT(*) FROM t"),
        ("<think>use t</think>```sql\nSELECT 2\n```", "SELECT 2"),
        ("WITH s AS (SELECT 1 AS x) SELECT x FROM s;", "WITH s AS (SELECT 1 AS x) SELECT x FROM s"),
        ("The answer is select a from t", "select a from t"),
        ("```sql\nSELECT a FROM t", "SELECT a FROM t"),
    ],
)
def test_extracts_the_query(completion, sql):
    assert extract_sql(completion) == sql


def test_several_statements_stay_together_so_the_sandbox_refuses_them():
    assert extract_sql("SELECT 1; DROP TABLE t;") == "SELECT 1; DROP TABLE t"
    fenced = "```sql\nSELECT 1;\nCOPY t TO 'x.csv';\n```"
    assert extract_sql(fenced) == "SELECT 1;\nCOPY t TO 'x.csv'"


@pytest.mark.parametrize(
    "completion",
    [
        "CREATE TABLE stolen AS SELECT 1",
        "INSERT INTO t SELECT * FROM t",
        "Sure:\nCOPY (SELECT 1) TO 'x.csv'",
        "UPDATE t SET a = (SELECT 1)",
    ],
)
def test_a_statement_that_is_not_a_query_is_kept_whole(completion):
    sql = extract_sql(completion)
    assert sql is not None and not sql.upper().startswith("SELECT")


def test_prose_that_merely_starts_like_sql_does_not_hide_the_fenced_query():
    assert extract_sql("Update: here it is\n```sql\nSELECT 1\n```") == "SELECT 1"
    assert extract_sql("Use the shops table.\n```sql\nSELECT 1\n```") == "SELECT 1"


def test_no_query_gives_none():
    assert extract_sql("I do not know.") is None
    assert extract_sql("") is None
    assert extract_sql("```sql\n```") is None


def test_well_formed_means_nothing_before_the_query():
    assert extract("SELECT 1").well_formed
    assert extract("```sql\nSELECT 1\n```\nblah").well_formed
    assert not extract("Sure! SELECT 1").well_formed
    assert not extract("Here:\n```sql\nSELECT 1\n```").well_formed
