"""Pull one SQL query out of a model completion.

Handles what chat models write (prose, ```sql fences, <think> blocks) and what a base model
writes after a prompt that ends in an opening fence or "SQL:" (the query, then a closing fence,
a blank line, a ';' and whatever it rambles on with). Text after a terminator is dropped unless
it is itself another SQL statement: several statements are kept together so that the sandbox
refuses them rather than silently scoring the first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL | re.IGNORECASE)
_FENCE_OPEN = re.compile(r"```[ \t]*(?:sql|duckdb|sqlite|postgresql|mysql)?[ \t]*\n?", re.I)
_SQL_LINE_START = re.compile(r"^[ \t]*(WITH|SELECT|FROM)\b", re.IGNORECASE | re.MULTILINE)
_SQL_INLINE = re.compile(r"\bSELECT\b", re.IGNORECASE)
_OTHER_STATEMENT_START = re.compile(
    r"^[ \t]*(CREATE\s+(OR\s+REPLACE\s+)?(TEMP\w*\s+)?(TABLE|VIEW|SCHEMA|MACRO|SEQUENCE|INDEX|TYPE|"
    r"FUNCTION)\b|INSERT\s+(OR\s+\w+\s+)?INTO\b|UPDATE\s+\w+\s+SET\b|DELETE\s+FROM\b|"
    r"DROP\s+\w+\b|ALTER\s+TABLE\b|COPY\s+[\w(]|ATTACH\s|DETACH\s|(FORCE\s+)?INSTALL\s+\w|"
    r"LOAD\s+\w|PRAGMA\s|EXPORT\s+DATABASE\b|IMPORT\s+DATABASE\b|TRUNCATE\s|CHECKPOINT\b|"
    r"VACUUM\b|SET\s+\w+\s*(=|TO\b)|CALL\s+\w+\s*\(|BEGIN\s+TRANSACTION\b|USE\s+\w+\s*;?\s*$)",
    re.IGNORECASE | re.MULTILINE,
)
_STATEMENT_WORD = re.compile(
    r"(WITH|SELECT|FROM|INSERT|UPDATE|DELETE|DROP|CREATE|ALTER|COPY|ATTACH|DETACH|INSTALL|LOAD|"
    r"PRAGMA|SET|RESET|EXPORT|IMPORT|CALL|DESCRIBE|SUMMARIZE|SHOW|USE|VACUUM|CHECKPOINT|BEGIN|"
    r"COMMIT|ROLLBACK|EXPLAIN|TRUNCATE|PIVOT|UNPIVOT|MERGE|REPLACE|GRANT|VALUES)\b",
    re.IGNORECASE,
)
_LEADING_LABEL = re.compile(r"^\s*(SQL|Answer|Query)\s*:\s*", re.IGNORECASE)


@dataclass(frozen=True)
class Extraction:
    """The SQL found in a completion and whether the completion was in the expected shape."""

    sql: str | None
    well_formed: bool
    """True when the SQL starts the completion (or its first fence): no prose before it."""


def extract_sql(completion: str) -> str | None:
    """The SQL in `completion`, without a trailing ';', or None when there is none."""
    return extract(completion).sql


def extract(completion: str) -> Extraction:
    """Find the SQL in a completion; see the module docstring for the rules."""
    text = _THINK.sub("", completion).lstrip()
    text = _LEADING_LABEL.sub("", text, count=1)
    fence = _FENCE_OPEN.search(text)
    start = _sql_start(text)
    if fence and (start is None or fence.start() <= start):
        body = text[fence.end():]
        close = body.find("```")
        body = body[:close] if close >= 0 else body
        sql = _first_statement(body, stop_at_blank_line=close < 0)
        return Extraction(sql, well_formed=fence.start() == 0 and sql is not None)
    if start is None:
        return Extraction(None, well_formed=False)
    body = text[start:]
    close = body.find("```")
    body = body[:close] if close >= 0 else body
    sql = _first_statement(body, stop_at_blank_line=True)
    return Extraction(sql, well_formed=start == 0 and sql is not None)


def _sql_start(text: str) -> int | None:
    """Where the SQL begins: the first line opening a statement (a query or not), else the
    first SELECT. A statement that is not a query is kept whole so the sandbox refuses it,
    rather than scoring a SELECT buried inside it."""
    starts = [m.start(1) for m in (_SQL_LINE_START.search(text),) if m]
    other = _OTHER_STATEMENT_START.search(text)
    if other:
        starts.append(other.start() + len(other.group(0)) - len(other.group(0).lstrip()))
    if starts:
        return min(starts)
    match = _SQL_INLINE.search(text)
    return match.start() if match else None


def _first_statement(body: str, *, stop_at_blank_line: bool) -> str | None:
    """Cut `body` after its statement; keep following statements, drop following prose."""
    if stop_at_blank_line:
        body = re.split(r"\n[ \t]*\n", body.strip(), maxsplit=1)[0]
    end = _statement_end(body)
    if end is not None:
        rest = body[end + 1:].strip()
        sql = body.strip() if rest and _STATEMENT_WORD.match(rest) else body[:end].strip()
    else:
        sql = body.strip()
    sql = sql.rstrip().rstrip(";").rstrip()
    return sql or None


def _statement_end(sql: str) -> int | None:
    """Index of the first ';' outside quotes and comments, or None."""
    quote: str | None = None
    i = 0
    while i < len(sql):
        ch = sql[i]
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif sql.startswith("--", i):
            newline = sql.find("\n", i)
            if newline < 0:
                return None
            i = newline
        elif ch == ";":
            return i
        i += 1
    return None
