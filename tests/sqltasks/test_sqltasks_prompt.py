"""Prompts are compact, dialect-explicit, and a base model's continuation extracts cleanly."""

import duckdb

from rewards import Task, extract_sql
from sqltasks import SchemaView, load_corpus, render_prompt, schema_lines, schema_text
from sqltasks.prompt import _first_rows, _table_of, relevance, sample_rows, table_samples

SETUP = (
    "CREATE TABLE shops (id INTEGER PRIMARY KEY, name VARCHAR);\n"
    "CREATE TABLE sales (id INTEGER, shop_id INTEGER REFERENCES shops(id), amount DECIMAL(10,2));\n"
    "INSERT INTO shops VALUES (1, 'a;b'), (2, 'c');\nINSERT INTO sales VALUES (1, 1, 2.50);"
)
TASK = Task(
    setup_sql=SETUP, question="How many shops are there?", gold_sql="SELECT COUNT(*) FROM shops"
)


def test_schema_is_one_create_table_line_per_table_without_rows():
    lines = schema_lines(SETUP).splitlines()
    assert len(lines) == 2
    assert all(line.startswith("CREATE TABLE") and line.endswith(";") for line in lines)
    assert "INSERT" not in schema_lines(SETUP)


def test_base_prompt_ends_in_an_open_sql_fence():
    prompt = render_prompt(TASK, "base")
    assert prompt.endswith("```sql\n")
    assert "DuckDB" in prompt and TASK.question in prompt
    continuation = "SELECT COUNT(*) FROM shops;\n```\n\n-- Question: How many sales?"
    assert extract_sql(continuation) == TASK.gold_sql


def test_chat_prompt_uses_gemma_turns():
    prompt = render_prompt(TASK, "chat")
    assert prompt.startswith("<start_of_turn>user\n")
    assert prompt.endswith("<end_of_turn>\n<start_of_turn>model\n")
    assert render_prompt(TASK, "chat", bos=True).startswith("<bos><start_of_turn>user\n")
    reply = "```sql\nSELECT COUNT(*) FROM shops\n```<end_of_turn>"
    assert extract_sql(reply) == TASK.gold_sql


def test_corpus_prompts_are_short():
    longest = max(len(render_prompt(t)) for t in load_corpus("test"))
    assert longest < 900  # a few hundred tokens at most for a 270M model on CPU


def test_keys_are_shown_and_comments_in_a_setup_hide_nothing():
    setup = "-- the shop's data; two tables\n" + SETUP
    lines = schema_lines(setup).splitlines()
    assert len(lines) == 2 and "PRIMARY KEY" in lines[0] and "REFERENCES shops" in lines[1]


def test_sample_rows_follow_each_table_and_respect_the_cap():
    task = Task(setup_sql=SETUP, question="Total sales?", gold_sql="SELECT SUM(amount) FROM sales")
    text = schema_text(task, SchemaView(sample_rows=1))
    lines = text.splitlines()
    assert lines[1] == "-- e.g. (1, 'a;b')" and lines[3] == "-- e.g. (1, 1, 2.50)"
    cap = len(lines[0]) + len(lines[1]) + len(lines[2]) + 2 + 5
    capped = schema_text(task, SchemaView(sample_rows=1, max_chars=cap))
    assert capped.splitlines() == lines[:3]  # the second table's rows would pass the cap
    assert len(capped) <= cap


def test_sample_rows_built_once_per_database_match_each_table_built_alone():
    """Every table's rows come from one run of its database's setup in the shared scratch
    database, and they are the rows a database of its own, opened for that table alone, gives,
    quoted identifiers and all (corpus and transfer databases alike)."""
    seen: set[str] = set()
    train = load_corpus("train", 0, corpus="multitable")
    tasks = train[:: max(1, len(train) // 8)] + load_corpus("transfer")
    for task in tasks:
        if task.setup_sql in seen:
            continue
        seen.add(task.setup_sql)
        with duckdb.connect(":memory:") as alone:
            alone.execute(task.setup_sql)
            for line in schema_lines(task.setup_sql).splitlines():
                table = _table_of(line)[0]
                rows = sample_rows(task.setup_sql, table, 2)
                assert rows == table_samples(task.setup_sql, table, 2)
                assert rows == _first_rows(alone, table, 2)
    assert len(seen) >= 8
    assert sample_rows(SETUP, "shops", 2) == ("(1, 'a;b')", "(2, 'c')")


def test_a_long_schema_keeps_the_tables_the_question_names():
    transfer = {t.question: t for t in load_corpus("transfer")}
    task = transfer["Which cities have more than two users?"]
    full = schema_text(task)
    text = schema_text(task, SchemaView(max_chars=700))
    assert len(full) > 700 and len(text) <= 700 + 40
    assert "CREATE TABLE users" in text and "more tables not shown" in text
    junction = transfer["Which tickets are tagged billing? Give their subjects."]
    kept = schema_text(junction, SchemaView(max_chars=900))
    for table in ("Tickets", "Tags", "TicketTags"):
        assert f"CREATE TABLE {table} " in kept
    # Without a cap, or under it, the schema is whole and in its own order.
    assert schema_text(task, SchemaView(max_chars=100_000)) == full == schema_lines(task.setup_sql)


def test_relevance_links_question_words_to_identifiers_in_any_style():
    line = "CREATE TABLE TicketTags (TicketId INT, TagId INT);"
    assert relevance("Which tickets carry the tag 'bug'?", line) == 6.0  # 2 x name + columns
    assert relevance("How many vehicles are there?", line) == 0.0
