"""The hand-written transfer split: every gold query executes and answers something, the split
is tiered like the corpus, every database has a second copy of redrawn values that the loader
scores on, and none of its databases shares a schema with a corpus database or with a
well-known public sample database."""

from __future__ import annotations

from collections import Counter

import duckdb
import pytest

from sqltasks import TIERS, load_corpus
from sqltasks.shapes.generate import databases, nontrivial
from sqltasks.transfer import redraw
from sqltasks.transfer.split import DATABASES, copy_sql, load_transfer, setup_sql

PUBLIC_SAMPLE_TABLES = {
    # Chinook, Northwind, Sakila, AdventureWorks, Pagila, the classic "employees" sample.
    "album", "artist", "track", "playlisttrack", "invoiceline", "mediatype",
    "shippers", "territories", "employeeterritories", "order details", "categories",
    "film", "film_actor", "film_category", "inventory", "rental", "language",
    "salesorderheader", "salesorderdetail", "productmodel", "dept_emp", "dept_manager",
    "titles", "salaries",
}


def _tables(setup: str) -> dict[str, frozenset[str]]:
    """Table name -> its column names, lower-cased, as DuckDB sees them."""
    with duckdb.connect(":memory:") as connection:
        connection.execute(setup)
        rows = connection.execute(
            "SELECT table_name, column_name FROM information_schema.columns").fetchall()
    out: dict[str, set[str]] = {}
    for table, column in rows:
        out.setdefault(table.lower(), set()).add(column.lower())
    return {t: frozenset(c) for t, c in out.items()}


@pytest.fixture(scope="module")
def tasks():
    return load_transfer()


def test_three_databases_and_150_questions_tiered_like_the_corpus(tasks):
    assert len(tasks) >= 150
    per_db = Counter(t.domain for t in tasks)
    assert set(per_db) == set(DATABASES) and len(DATABASES) >= 3
    assert min(per_db.values()) >= 45
    assert set(Counter(t.tier for t in tasks)) == set(TIERS)
    assert len({t.id for t in tasks}) == len(tasks)
    assert all(t.split == "transfer" for t in tasks)
    assert load_corpus("transfer") == list(tasks)
    assert load_corpus("transfer", corpus="multitable") == list(tasks)


def test_every_gold_query_executes_and_answers_something(tasks):
    connections = {}
    try:
        for task in tasks:
            if task.domain not in connections:
                connections[task.domain] = duckdb.connect(":memory:")
                connections[task.domain].execute(task.setup_sql)
            rows = connections[task.domain].execute(task.gold_sql).fetchall()
            assert nontrivial(rows), (task.id, task.question, rows)
    finally:
        for connection in connections.values():
            connection.close()


def test_every_database_has_a_second_copy_of_redrawn_values_that_scoring_reads(tasks):
    """The copies are what `redraw` writes; they keep the schema and every key valid (DuckDB
    checks the keys as it loads them), differ in their rows and in most gold answers, and a
    gold answers something on them too."""
    for name in DATABASES:
        assert copy_sql(name) == redraw.redraw(setup_sql(name), redraw.SEED), name
        assert _tables(copy_sql(name)) == _tables(setup_sql(name))
    differing = 0
    with duckdb.connect(":memory:") as first, duckdb.connect(":memory:") as second:
        for name in DATABASES:
            first.execute(f"CREATE SCHEMA {name}; USE {name}; " + setup_sql(name))
            second.execute(f"CREATE SCHEMA {name}; USE {name}; " + copy_sql(name))
        for task in tasks:
            assert task.extra_setups == (copy_sql(task.domain),)
            for connection in (first, second):
                connection.execute(f"USE {task.domain}")
            one = first.execute(task.gold_sql).fetchall()
            other = second.execute(task.gold_sql).fetchall()
            assert other, (task.id, task.question)
            differing += sorted(map(repr, one)) != sorted(map(repr, other))
    assert differing >= 0.85 * len(tasks)


def test_questions_are_distinct_and_never_in_a_training_corpus(tasks):
    assert len({t.question for t in tasks}) == len(tasks)
    seen = {t.question for corpus in ("twotable", "multitable")
            for t in load_corpus("all", corpus=corpus)}
    assert not seen & {t.question for t in tasks}


def test_no_transfer_database_shares_a_schema_with_the_corpus():
    corpus_tables: set[tuple[str, frozenset[str]]] = set()
    corpus_schemas: list[frozenset[str]] = []
    for db in databases(0):
        tables = _tables(db.setup_sql(0))
        corpus_tables |= set(tables.items())
        corpus_schemas.append(frozenset(tables))
    for task in load_corpus("train")[:: 50] + load_corpus("test")[:: 50]:
        tables = _tables(task.setup_sql)
        corpus_tables |= set(tables.items())
        corpus_schemas.append(frozenset(tables))
    for name in DATABASES:
        tables = _tables(setup_sql(name))
        assert len(tables) >= 6
        assert not set(tables.items()) & corpus_tables, name
        names = frozenset(tables)
        assert all(len(names & schema) <= 2 for schema in corpus_schemas), name


def test_no_public_sample_database_is_in_the_corpus_or_the_transfer_split():
    names: set[str] = set()
    for db in databases(0):
        names |= set(_tables(db.setup_sql(0)))
    for name in DATABASES:
        names |= set(_tables(setup_sql(name)))
    assert not names & PUBLIC_SAMPLE_TABLES
