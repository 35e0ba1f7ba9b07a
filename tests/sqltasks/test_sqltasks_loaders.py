"""Public-corpus loaders keep exactly the tasks whose gold means the same in DuckDB."""

import json
import sqlite3

import duckdb
import pytest

from sqltasks import LoadReport, classify_tier, load_bird, load_gretel, load_spider

ROWS = [(1, "Alice", "NL", 34, 3.5), (2, "Bob", "NL", 27, 1.25), (3, "Carl", "FR", 41, 2.0)]
# gold -> kept? (the reason in comments)
GOLDS = {
    "SELECT name FROM singer WHERE country = 'NL'": True,
    "SELECT count(*) FROM singer": True,
    "SELECT country, avg(age) FROM singer GROUP BY country ORDER BY country": True,
    "SELECT age / 2 FROM singer WHERE id = 1": True,  # integer division, fixed by typed transpile
    "SELECT name FROM singer WHERE name LIKE 'b%'": False,  # LIKE is case-insensitive in SQLite
    'SELECT name FROM singer WHERE country = "FR"': False,  # double-quoted string literal
    "SELECT name FROM singer WHERE age > 100": False,  # empty result
    "SELECT nothing FROM singer": False,  # fails in SQLite
    "UPDATE singer SET age = 1": False,  # not a query
}


def _sqlite(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    connection = sqlite3.connect(path)
    connection.execute(
        "CREATE TABLE singer (id INTEGER PRIMARY KEY, name TEXT, country TEXT, age INT, "
        "rating REAL)"
    )
    connection.executemany("INSERT INTO singer VALUES (?, ?, ?, ?, ?)", ROWS)
    connection.commit()
    connection.close()


def _kept_originals(tasks):
    return {t.meta["original_sql"] for t in tasks}


def test_spider_layout(tmp_path):
    _sqlite(tmp_path / "database" / "concert" / "concert.sqlite")
    records = [{"db_id": "concert", "query": q, "question": f"q{i}"} for i, q in enumerate(GOLDS)]
    records.append({"db_id": "missing_db", "query": "SELECT 1", "question": "q"})
    (tmp_path / "dev.json").write_text(json.dumps(records))
    report = LoadReport()
    tasks = load_spider(tmp_path, "dev", report=report)
    assert _kept_originals(tasks) == {q for q, keep in GOLDS.items() if keep}
    assert report.seen == len(records) and report.kept == len(tasks)
    assert report.dropped["database missing or too large"] == 1
    task = tasks[0]
    assert task.domain == "concert" and task.split == "dev" and task.id == "spider-dev-0"
    assert "CREATE TABLE" in task.setup_sql


def test_bird_layout_appends_the_evidence(tmp_path):
    _sqlite(tmp_path / "dev_databases" / "music" / "music.sqlite")
    records = [
        {"question_id": 0, "db_id": "music", "question": "Who is from NL?",
         "evidence": "country code NL", "SQL": "SELECT name FROM singer WHERE country = 'NL'",
         "difficulty": "simple"},
        {"question_id": 1, "db_id": "music", "question": "Names with b?", "evidence": "",
         "SQL": "SELECT name FROM singer WHERE name LIKE 'b%'", "difficulty": "moderate"},
    ]
    (tmp_path / "dev.json").write_text(json.dumps(records))
    tasks = load_bird(tmp_path, "dev")
    assert len(tasks) == 1
    assert tasks[0].question == "Who is from NL? Hint: country code NL"
    assert tasks[0].meta["difficulty"] == "simple"


GRETEL = [
    {"id": 1, "domain": "music", "sql_complexity": "basic SQL", "sql_prompt": "Who is Dutch?",
     "sql_context": "CREATE TABLE s (id INT, name VARCHAR(20), country TEXT); "
                    "INSERT INTO s VALUES (1, 'A', 'NL'), (2, 'B', 'FR');",
     "sql": "SELECT name FROM s WHERE country = 'NL';"},
    {"id": 2, "domain": "music", "sql_complexity": "basic SQL", "sql_prompt": "No rows",
     "sql_context": "CREATE TABLE s (id INT);", "sql": "SELECT * FROM s;"},
    {"id": 3, "domain": "music", "sql_complexity": "basic SQL", "sql_prompt": "Insert one",
     "sql_context": "CREATE TABLE s (id INT); INSERT INTO s VALUES (1);",
     "sql": "INSERT INTO s VALUES (2);"},
    {"id": 4, "domain": "music", "sql_complexity": "aggregation", "sql_prompt": "Average?",
     "sql_context": "CREATE TABLE s (id INT, v INT); INSERT INTO s VALUES (1, 3), (2, 4);",
     "sql": "SELECT AVG(v) FROM s;"},
]


@pytest.mark.parametrize("suffix", ["jsonl", "snappy.parquet"])
def test_gretel_layout(tmp_path, suffix):
    path = tmp_path / f"synthetic_text_to_sql_test.{suffix}"
    if suffix == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in GRETEL))
    else:
        source = tmp_path / "records.json"
        source.write_text(json.dumps(GRETEL))
        duckdb.execute(f"COPY (SELECT * FROM read_json_auto('{source}')) TO '{path}' "
                       "(FORMAT parquet, COMPRESSION snappy)")
    report = LoadReport()
    tasks = load_gretel(tmp_path, "test", report=report)
    assert [t.question for t in tasks] == ["Who is Dutch?", "Average?"]
    assert report.dropped["context has no rows"] == 1 and report.dropped["not a query"] == 1
    assert tasks[0].tier == "filter" and tasks[1].tier == "aggregate"


@pytest.mark.parametrize(
    ("sql", "tier"),
    [
        ("SELECT a FROM t WHERE b > 1", "filter"),
        ("SELECT max(a) FROM t", "aggregate"),
        ("SELECT b, count(*) FROM t GROUP BY b HAVING count(*) > 1", "group_having"),
        ("SELECT t.a FROM t JOIN u ON t.id = u.id", "join"),
        ("SELECT a FROM t WHERE a > (SELECT avg(a) FROM t)", "subquery"),
        ("SELECT a, rank() OVER (ORDER BY a) FROM t", "window"),
    ],
)
def test_public_tasks_get_the_same_tier_names(sql, tier):
    assert classify_tier(sql) == tier
