"""Small task sources in the layouts users bring: the bookshop as DuckDB and SQLite files,
and Spider and BIRD directories, built from the example bookshop script."""

from __future__ import annotations

import json
import sqlite3
from decimal import Decimal
from pathlib import Path

import duckdb

REPO_ROOT = Path(__file__).resolve().parents[2]
BOOKSHOP = REPO_ROOT / "datasets" / "examples" / "bookshop"
BOOKSHOP_SQL = BOOKSHOP / "bookshop.sql"
BOOKSHOP_QUESTIONS = BOOKSHOP / "questions.jsonl"


def bookshop_duckdb(path: Path) -> Path:
    """The bookshop as a DuckDB file."""
    connection = duckdb.connect(str(path))
    connection.execute(BOOKSHOP_SQL.read_text())
    connection.close()
    return path


def bookshop_sqlite(path: Path) -> Path:
    """The bookshop as a SQLite file (types as SQLite declares them)."""
    source = duckdb.connect(":memory:")
    source.execute(BOOKSHOP_SQL.read_text())
    lite = sqlite3.connect(path)
    for (table,) in source.execute("SELECT table_name FROM duckdb_tables() ORDER BY table_oid"
                                   ).fetchall():
        columns = source.execute(
            "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = $1 "
            "ORDER BY column_index", [table]).fetchall()
        kinds = {"INTEGER": "INTEGER", "VARCHAR": "TEXT", "DATE": "TEXT"}
        ddl = ", ".join(f"{c} {kinds.get(t, 'REAL')}" for c, t in columns)
        lite.execute(f"CREATE TABLE {table} ({ddl})")
        rows = source.execute(f"SELECT * FROM {table}").fetchall()
        marks = ", ".join("?" for _ in columns)
        lite.executemany(f"INSERT INTO {table} VALUES ({marks})",
                         [tuple(_sqlite_value(v) for v in row) for row in rows])
    lite.commit()
    lite.close()
    source.close()
    return path


def _sqlite_value(value: object) -> object:
    if value is None or isinstance(value, int | float | str):
        return value
    if isinstance(value, Decimal):
        return float(value)
    return str(value)  # dates as ISO text, as SQLite keeps them


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


SPIDER_TRAIN = [
    ("shop_a", "How many authors are from Norway?",
     "SELECT count(*) FROM authors WHERE country = 'Norway'"),
    ("shop_a", "List poetry book titles.", "SELECT title FROM books WHERE genre = 'poetry'"),
    ("shop_b", "How many orders were cancelled?",
     "SELECT count(*) FROM orders WHERE status = 'cancelled'"),
    ("shop_b", "Average price of mystery books?",
     "SELECT avg(list_price) FROM books WHERE genre = 'mystery'"),
    ("shop_c", "Number of books per genre.", "SELECT genre, count(*) FROM books GROUP BY genre"),
    ("shop_c", "Names of authors with a book.",
     "SELECT DISTINCT full_name FROM authors AS a JOIN books AS b ON a.author_id = b.author_id"),
]
SPIDER_DEV = [
    ("shop_d", "Titles of books after 2020.",
     "SELECT title FROM books WHERE published_year > 2020"),
    ("shop_d", "Most expensive price.", "SELECT max(list_price) FROM books"),
    ("shop_d", "Customers in Oslo.", "SELECT first_name FROM customers WHERE city LIKE 'oslo'"),
]


def spider_layout(root: Path, bird: bool = False) -> Path:
    """A Spider (or BIRD) directory: question files and one SQLite file per database."""
    root.mkdir(parents=True, exist_ok=True)
    gold = "SQL" if bird else "query"
    for split, records in (("train", SPIDER_TRAIN), ("dev", SPIDER_DEV)):
        directory = root / (f"{split}_databases" if bird else "database")
        for db_id in sorted({r[0] for r in records}):
            (directory / db_id).mkdir(parents=True, exist_ok=True)
            target = directory / db_id / f"{db_id}.sqlite"
            if not target.exists():
                bookshop_sqlite(target)
        rows = [{"db_id": db, "question": q, gold: sql,
                 **({"evidence": "poetry is a genre"} if bird else {})}
                for db, q, sql in records]
        name = f"{split}.json" if bird or split == "dev" else "train_spider.json"
        (root / name).write_text(json.dumps(rows))
    return root
