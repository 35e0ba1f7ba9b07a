"""Prompts are compact, dialect-explicit, and a base model's continuation extracts cleanly."""

from rewards import Task, extract_sql
from sqltasks import load_corpus, render_prompt, schema_lines

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
