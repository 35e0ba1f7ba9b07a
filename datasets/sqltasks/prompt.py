"""Prompts for Gemma: a completion prompt for base models and the chat template for -it models.

The schema is shown as compact one-line CREATE TABLE statements with their keys, the question,
and the dialect. A `SchemaView` adds a few sample rows per table and caps the schema's length;
when a schema is longer than the cap, the tables most related to the question are kept (see
`schema_text`). The base prompt ends in an opening ```sql fence, so that a base model continues
with the query and, usually, a closing fence; `rewards.extract_sql` reads what it writes. The chat
prompt follows Gemma's turn format and asks for one fenced query.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any, Literal

import duckdb
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from rewards import Task
from sqltasks import scratch
from sqltasks.shapes.naming import quote

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
    """Statements of a script, with `--` comments removed (they may hold quotes or `;`)."""
    statements, current, quote, i = [], [], None, 0
    while i < len(script):
        ch = script[i]
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "-" and script.startswith("--", i):
            end = script.find("\n", i)
            i = len(script) if end < 0 else end
            continue
        elif ch == ";":
            statements.append("".join(current))
            current = []
            i += 1
            continue
        current.append(ch)
        i += 1
    if "".join(current).strip():
        statements.append("".join(current))
    return statements


@dataclass(frozen=True)
class SchemaView:
    """How much of a database a prompt shows."""

    sample_rows: int = 0
    """Rows shown under each table (its first rows, values cut to `VALUE_CHARS`)."""
    max_chars: int | None = None
    """Cap on the schema text; past it, the tables least related to the question are left
    out (and their count said), then sample rows stop."""


VALUE_CHARS = 24
_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
_WORD = re.compile(r"[a-z0-9]+")


def _stems(text: str) -> set[str]:
    """Lower-case word stems of identifiers or prose: `TeamLeadId` and "team leads" share
    {team, lead}."""
    words = _WORD.findall(_CAMEL.sub(" ", text).replace("_", " ").lower())
    out = set()
    for word in words:
        if len(word) > 3 and word.endswith("ies"):
            word = word[:-3] + "y"
        elif len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
            word = word[:-1]
        if word not in ("id", "the", "of", "a", "and", "to", "in", "for", "each", "is", "no"):
            out.add(word)
    return out


@lru_cache(maxsize=8192)
def _table_of(line: str) -> tuple[str, frozenset[str], frozenset[str]]:
    """(table name, stems of its name, stems of its columns and referenced tables); cached,
    since ranking and sample rows read the same CREATE lines for every prompt."""
    tree = sqlglot.parse_one(line, read="duckdb")
    table = tree.find(exp.Table)
    name = table.name if table is not None else ""
    columns = " ".join(c.name for c in tree.find_all(exp.ColumnDef))
    refs = " ".join(t.name for t in tree.find_all(exp.Table) if t is not table)
    return name, frozenset(_stems(name)), frozenset(_stems(columns + " " + refs))


def relevance(question: str, line: str) -> float:
    """Schema linking: how much a table's CREATE line shares with the question's words (its
    name counts double)."""
    words = _stems(question)
    _, name, columns = _table_of(line)
    return 2.0 * len(words & name) + len(words & columns)


def sample_rows(setup_sql: str, table: str, k: int) -> tuple[str, ...]:
    """The first `k` rows of `table`, each rendered as a SQL tuple with short values."""
    found = _database_samples(setup_sql, k)
    return found[table] if table in found else table_samples(setup_sql, table, k)


@lru_cache(maxsize=512)
def _database_samples(setup_sql: str, k: int) -> dict[str, tuple[str, ...]]:
    """Every table's `sample_rows` from one run of the database's setup (read-only: cached).

    A prompt shows rows of several tables of one database; building the database once for all
    of them, not once per table, is what keeps an SFT step's prompts from costing seconds on a
    corpus of many databases (`bench/bench_prompts.py`). Built in the process's scratch
    database (`scratch.built`), never a database opened for it: see there why."""
    tables = [_table_of(line)[0] for line in schema_lines(setup_sql).splitlines()]
    with scratch.built(setup_sql) as connection:
        return {table: _first_rows(connection, table, k) for table in tables if table}


def table_samples(setup_sql: str, table: str, k: int) -> tuple[str, ...]:
    """`sample_rows` of one table from a database built for it alone (uncached)."""
    with scratch.built(setup_sql) as connection:
        return _first_rows(connection, table, k)


def _first_rows(connection: duckdb.DuckDBPyConnection, table: str, k: int) -> tuple[str, ...]:
    rows = connection.execute(f"SELECT * FROM {quote(table)} LIMIT {int(k)}").fetchall()
    return tuple("(" + ", ".join(_short(v) for v in row) + ")" for row in rows)


def _short(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Decimal):
        return str(value)
    text = str(value)
    text = text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 3] + "..."
    return "'" + text.replace("'", "''") + "'"


def schema_text(task: Task, view: SchemaView | None = None) -> str:
    """The schema as the prompt shows it.

    Rule, when the CREATE lines alone exceed `max_chars`: rank tables by `relevance` to the
    question, ties broken by being referenced by or referencing a better-ranked table, then by
    schema order; keep them in that rank while they fit (always at least one), show the kept
    ones in schema order and say how many were left out. Sample rows are then added table by
    table, in schema order, while the text stays within the cap.
    """
    view = view or SchemaView()
    lines = schema_lines(task.setup_sql).splitlines()
    budget = view.max_chars
    kept = list(range(len(lines)))
    if budget is not None and len("\n".join(lines)) > budget:
        kept = _most_relevant(task.question, lines, budget)
    blocks = [[lines[i]] for i in kept]
    left_out = len(lines) - len(kept)
    tail = [f"-- ({left_out} more tables not shown)"] if left_out else []

    def text() -> str:
        return "\n".join([line for block in blocks for line in block] + tail)

    if view.sample_rows:
        for block in blocks:
            rows = sample_rows(task.setup_sql, _table_of(block[0])[0], view.sample_rows)
            if not rows:
                continue
            block.append(f"-- e.g. {', '.join(rows)}")
            if budget is not None and len(text()) > budget:
                block.pop()
                break
    return text()


def _most_relevant(question: str, lines: list[str], budget: int) -> list[int]:
    scores = [relevance(question, line) for line in lines]
    info = [_table_of(line) for line in lines]
    order = sorted(range(len(lines)), key=lambda i: (-scores[i], i))
    top = {info[order[0]][0].lower()}

    def linked(i: int) -> bool:
        name, _, _ = info[i]
        return name.lower() in top or any(t in lines[i].lower() for t in top)

    order = [order[0]] + sorted(order[1:], key=lambda i: (-scores[i], not linked(i), i))
    kept, used = [], 0
    for i in order:
        if kept and used + len(lines[i]) + 1 > budget:
            continue
        kept.append(i)
        used += len(lines[i]) + 1
    return sorted(kept)


def render_prompt(task: Task, style: Style = "base", bos: bool = False,
                  view: SchemaView | None = None) -> str:
    """The prompt text for `task`; set `bos` when the tokenizer will not add <bos> itself."""
    schema = schema_text(task, view) if view is not None else schema_lines(task.setup_sql)
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
