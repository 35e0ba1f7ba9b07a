"""Facts about a query read from its parse tree, never from its text."""

from __future__ import annotations

from functools import lru_cache

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError


def parse(sql: str, dialect: str = "duckdb") -> exp.Expression | None:
    """The parse tree of `sql` (a fresh one each call, safe to change), or None when it does
    not parse, nesting too deep for the parser included (untrusted text may try)."""
    try:
        return sqlglot.parse_one(sql, read=dialect)
    except (SqlglotError, ValueError, RecursionError):
        return None


@lru_cache(maxsize=65536)
def has_top_level_order_by(sql: str, dialect: str = "duckdb") -> bool:
    """True when the outermost query sorts its rows, which makes row order part of the answer.

    ORDER BY inside a window, a subquery or a CTE does not count, nor does LIMIT alone.
    """
    tree = parse(sql, dialect)
    while isinstance(tree, exp.Subquery | exp.Paren):
        tree = tree.this
    return tree is not None and tree.args.get("order") is not None
