"""Assign a difficulty tier to any gold query from its parse tree (used for public corpora)."""

from __future__ import annotations

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError


def classify_tier(sql: str, dialect: str = "duckdb") -> str:
    """The hardest construct the query uses, named as the generated corpus names its tiers."""
    try:
        tree = sqlglot.parse_one(sql, read=dialect)
    except SqlglotError:
        return "unknown"
    if tree.find(exp.Window):
        return "window"
    if any(select is not tree for select in tree.find_all(exp.Select)):
        return "subquery"
    if tree.find(exp.Join):
        return "join"
    if tree.find(exp.Group) or tree.find(exp.Having):
        return "group_having"
    if tree.find(exp.AggFunc):
        return "aggregate"
    return "filter"
