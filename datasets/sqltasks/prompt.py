"""Prompts for Gemma: a completion prompt for base models and the chat template for -it models.

The schema is shown as compact one-line CREATE TABLE statements (no rows), the question, and the
dialect. The base prompt ends in an opening ```sql fence, so that a base model continues with the
query and, usually, a closing fence; `rewards.extract_sql` reads what it writes. The chat
prompt follows Gemma's turn format and asks for one fenced query.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Literal

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from rewards import Task

Style = Literal["base", "chat"]
INSTRUCTION = "Answer with one DuckDB SELECT query."


@lru_cache(maxsize=4096)
def schema_lines(setup_sql: str) -> str:
    """The CREATE TABLE statements of a setup script, one line each, without the rows."""
    lines = []
    for statement in _create_statements(setup_sql):
        try:
            tree = sqlglot.parse_one(statement, read="duckdb")
        except SqlglotError:
            lines.append(" ".join(statement.split()))
            continue
        if isinstance(tree, exp.Create) and tree.kind == "TABLE":
            lines.append(tree.sql(dialect="duckdb") + ";")
    return "\n".join(lines)


def _create_statements(setup_sql: str) -> list[str]:
    """CREATE TABLE statements only: parsing the INSERTs would cost far more than the DDL."""
    out = []
    for statement in _split(setup_sql):
        if statement.lstrip()[:12].upper().startswith("CREATE"):
            out.append(statement)
    return out


def _split(script: str) -> list[str]:
    statements, start, quote = [], 0, None
    for i, ch in enumerate(script):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == ";":
            statements.append(script[start:i])
            start = i + 1
    if script[start:].strip():
        statements.append(script[start:])
    return statements


def render_prompt(task: Task, style: Style = "base", bos: bool = False) -> str:
    """The prompt text for `task`; set `bos` when the tokenizer will not add <bos> itself."""
    schema = schema_lines(task.setup_sql)
    if style == "base":
        text = (
            f"-- DuckDB schema\n{schema}\n"
            f"-- Question: {task.question}\n"
            f"-- {INSTRUCTION}\n```sql\n"
        )
    elif style == "chat":
        user = (
            f"Database schema (DuckDB):\n{schema}\n\n"
            f"Question: {task.question}\n\n"
            f"{INSTRUCTION} Reply with only the query in a ```sql code block."
        )
        text = f"<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n"
    else:
        raise ValueError(f"unknown prompt style {style!r}; expected 'base' or 'chat'")
    return ("<bos>" + text) if bos else text


STOP_SEQUENCES: dict[str, tuple[str, ...]] = {
    "base": ("```", "\n\n", ";"),
    "chat": ("<end_of_turn>",),
}
"""Where sampling can stop for each style; extraction copes without them too."""
