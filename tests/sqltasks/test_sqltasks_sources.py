"""A user's own databases and questions, and Spider/BIRD layouts, as task sources: every
database form loads as the same rows, every gold that cannot serve is reported with its
reason, SQLite golds are translated and checked against SQLite, and splits are stable."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import duckdb
import pytest

from sqltasks import TaskSource, source_report, source_tasks
from sqltasks.loaders import LoadReport
from sqltasks.sources import DumpError, QuestionsError, load_database_tasks, open_database
from sqltasks.sources.questions import Question
from sqltasks.sources.split import assign_splits
from tests.sqltasks.source_fixtures import (
    BOOKSHOP_QUESTIONS,
    BOOKSHOP_SQL,
    bookshop_duckdb,
    bookshop_sqlite,
    spider_layout,
    write_jsonl,
)

TABLES = ("authors", "books", "customers", "orders", "order_items", "reviews")


def _rows(setup_sql: str) -> dict[str, list[tuple]]:
    connection = duckdb.connect(":memory:")
    connection.execute(setup_sql)
    return {t: sorted(connection.execute(f"SELECT * FROM {t}").fetchall(), key=repr)
            for t in TABLES}


def test_a_duckdb_file_and_a_sql_script_load_as_the_same_rows_with_their_keys(tmp_path):
    from_file = open_database(bookshop_duckdb(tmp_path / "shop.duckdb"))
    from_script = open_database(BOOKSHOP_SQL)
    assert (from_file.kind, from_script.kind) == ("duckdb", "sql")
    assert _rows(from_file.setup_sql) == _rows(from_script.setup_sql)
    assert sum(map(len, _rows(from_file.setup_sql).values())) == 11 + 44 + 34 + 80 + 161 + 90
    assert "PRIMARY KEY" in from_file.setup_sql and "REFERENCES authors" in from_file.setup_sql


def test_a_sql_script_may_read_files_beside_it(tmp_path):
    (tmp_path / "cities.csv").write_text("city,country\nOslo,Norway\nLagos,Nigeria\n")
    (tmp_path / "cities.sql").write_text(
        "CREATE TABLE cities AS SELECT * FROM read_csv('cities.csv');")
    database = open_database(tmp_path / "cities.sql")
    assert "INSERT INTO \"cities\"" in database.setup_sql
    assert "read_csv" not in database.setup_sql  # copied rows, never re-run in the sandbox


def test_databases_that_cannot_serve_are_refused_with_the_reason(tmp_path):
    big = tmp_path / "big.sql"
    big.write_text("CREATE TABLE t AS SELECT range AS i FROM range(50);")
    with pytest.raises(DumpError, match="50 rows, over the limit of 10"):
        open_database(big, max_rows=10)
    schema = tmp_path / "schemas.sql"
    schema.write_text("CREATE SCHEMA sales; CREATE TABLE sales.t (i INTEGER);")
    with pytest.raises(DumpError, match="outside the main schema"):
        open_database(schema)
    broken = tmp_path / "broken.sql"
    broken.write_text("CREATE TABLE t (i INTEGER); INSERT INTO t VALUES ('x');")
    with pytest.raises(DumpError, match="the script .* fails"):
        open_database(broken)
    with pytest.raises(DumpError, match="no file"):
        open_database(tmp_path / "missing.duckdb")


def test_every_gold_that_cannot_serve_is_reported_with_its_reason(tmp_path):
    questions = write_jsonl(tmp_path / "q.jsonl", [
        {"question": "Authors from Norway?", "sql": "SELECT count(*) FROM authors "
                                                    "WHERE country = 'Norway'"},
        {"question": "Bad column", "sql": "SELECT colour FROM books"},
        {"question": "Nobody", "sql": "SELECT * FROM authors WHERE born_year > 3000"},
        {"question": "Not a query", "sql": "DELETE FROM books"},
    ])
    report = LoadReport()
    tasks = load_database_tasks([BOOKSHOP_SQL], questions, report=report)
    assert [t.question for t in tasks] == ["Authors from Norway?"]
    assert (report.seen, report.kept) == (4, 1)
    reasons = {p["question"]: (p["reason"], p["error"]) for p in report.problems}
    assert reasons["Bad column"][0] == "gold fails in DuckDB"
    assert "colour" in reasons["Bad column"][1]
    assert reasons["Nobody"][0] == "empty gold result"
    assert reasons["Not a query"][0] == "not a query"
    assert "1 of 4 questions kept; dropped 3" in report.summary()


def test_sqlite_golds_are_checked_against_sqlite_and_translated(tmp_path):
    database = bookshop_sqlite(tmp_path / "shop.sqlite")
    questions = write_jsonl(tmp_path / "q.jsonl", [
        # SQLite's integer division and string concatenation: translated, same answer
        {"question": "Books per ten", "sql": "SELECT count(*) / 10 FROM books"},
        {"question": "Names", "sql": "SELECT first_name || ' ' || last_name FROM customers "
                                     "WHERE city = 'Oslo'"},
        # LIKE ignores case in SQLite but not in DuckDB: caught, not silently changed
        {"question": "Oslo by LIKE", "sql": "SELECT first_name FROM customers "
                                            "WHERE city LIKE 'oslo'"},
    ])
    report = LoadReport()
    tasks = load_database_tasks([database], questions, report=report)
    kept = {t.question: t for t in tasks}
    assert set(kept) == {"Books per ten", "Names"}
    assert report.transpiled >= 1 and "translated from SQLite" in report.summary()
    assert kept["Books per ten"].meta["original_sql"] == "SELECT count(*) / 10 FROM books"
    assert report.problems[0]["reason"] == "different result in DuckDB"


def test_several_databases_in_one_source_and_clear_errors_for_bad_records(tmp_path):
    shop = bookshop_duckdb(tmp_path / "shop.duckdb")
    cities = tmp_path / "cities.sql"
    cities.write_text("CREATE TABLE cities (name VARCHAR, people INTEGER);"
                      "INSERT INTO cities VALUES ('Oslo', 700000), ('Lagos', 15000000);")
    questions = tmp_path / "q.csv"
    questions.write_text("question,sql,db,tier\n"
                         "Biggest city?,SELECT name FROM cities ORDER BY people DESC LIMIT 1,"
                         "cities,filter\n"
                         "How many books?,SELECT count(*) FROM books,shop,\n")
    tasks = {t.domain: t for t in load_database_tasks([shop, cities], questions)}
    assert set(tasks) == {"shop", "cities"}
    assert tasks["cities"].tier == "filter" and tasks["shop"].tier == "aggregate"
    assert "books" not in tasks["cities"].setup_sql
    questions.write_text("question,sql,db\nHow many books?,SELECT count(*) FROM books,store\n")
    with pytest.raises(QuestionsError, match=r"q.csv:2: database 'store' is not one of"):
        load_database_tasks([shop, cities], questions)
    bad = write_jsonl(tmp_path / "bad.jsonl", [{"question": "no gold"}])
    with pytest.raises(QuestionsError, match="bad.jsonl:1: a record needs"):
        load_database_tasks([shop], bad)


def test_splits_are_seeded_stable_and_respect_a_named_split():
    questions = [Question(f"q{i}", "?", "SELECT 1", "db") for i in range(40)]
    first = assign_splits(questions, seed=0, dev=0.2, test=0.2)
    assert first == assign_splits(list(reversed(questions)), seed=0, dev=0.2, test=0.2)
    assert sorted(first.values()).count("test") == 8
    assert first != assign_splits(questions, seed=1, dev=0.2, test=0.2)
    # a question added or removed elsewhere moves no other question between splits
    fewer = assign_splits(questions[1:], seed=0, dev=0.2, test=0.2)
    moved = [q for q in fewer if fewer[q] != first[q]]
    assert len(moved) <= 2
    named = [Question("fixed", "?", "SELECT 1", "db", split="test"), *questions]
    assert assign_splits(named, seed=0, dev=0.2, test=0.2)["fixed"] == "test"
    by_db = [Question(f"q{i}", "?", "SELECT 1", f"db{i % 5}") for i in range(40)]
    split = assign_splits(by_db, seed=0, dev=0.2, test=0.2, by="database")
    for db in {q.database for q in by_db}:
        assert len({split[q.id] for q in by_db if q.database == db}) == 1


def test_the_example_source_loads_whole_and_reloads_when_a_file_changes(tmp_path):
    source = TaskSource(kind="database", path=str(BOOKSHOP_QUESTIONS),
                        databases=(str(BOOKSHOP_SQL),))
    splits = {s: source_tasks(source, s) for s in ("train", "dev", "test")}
    assert sum(map(len, splits.values())) == 36 == source_report(source).kept
    assert not {t.id for t in splits["dev"]} & {t.id for t in splits["test"]}
    copy = tmp_path / "q.jsonl"
    copy.write_text(BOOKSHOP_QUESTIONS.read_text())
    edited = TaskSource(kind="database", path=str(copy), databases=(str(BOOKSHOP_SQL),))
    assert len(source_tasks(edited, "all")) == 36
    copy.write_text("\n".join(copy.read_text().splitlines()[:30]) + "\n")
    assert len(source_tasks(edited, "all")) == 30


def test_spider_and_bird_layouts_split_dev_from_train_databases(tmp_path):
    root = spider_layout(tmp_path / "spider")
    source = TaskSource(kind="spider", path=str(root), dev_fraction=0.34)
    train, dev, test = (source_tasks(source, s) for s in ("train", "dev", "test"))
    assert {t.domain for t in test} == {"shop_d"}  # the benchmark's dev set is the test split
    assert dev and train and not {t.domain for t in dev} & {t.domain for t in train}
    report = source_report(source)
    assert report.seen == 9 and report.dropped["different result in DuckDB"] == 1  # LIKE
    bird = TaskSource(kind="bird", path=str(spider_layout(tmp_path / "bird", bird=True)),
                      dev_fraction=0.34)
    assert all(t.question.endswith("Hint: poetry is a genre")
               for t in source_tasks(bird, "all"))


def test_a_sqlite_file_is_found_by_its_contents_not_its_name(tmp_path):
    path = bookshop_sqlite(tmp_path / "shop.db")
    assert open_database(path).kind == "sqlite"
    lite = sqlite3.connect(path)
    assert lite.execute("SELECT count(*) FROM books").fetchone() == (44,)
    lite.close()
    assert Path(BOOKSHOP_SQL).exists()
