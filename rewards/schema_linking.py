"""Schema linking: does a query name the database's real tables and columns, and the tables and
joins the gold query needs?

A model that has not learned to read the schema invents names (`sales_revenue`, `track_id_id`)
or joins the wrong tables; execution match alone gives such a query nothing and says nothing
about why. This component gives graded credit from the two parses (sqlglot, DuckDB dialect):

    existence   share of the prediction's table and column names that exist in the database
                (its own CTE names and select aliases are not the schema's, so they are left out)
    tables      F1 of the prediction's tables against the gold's
    joins       F1 of its join pairs (column = column across two tables, in ON or WHERE, with
                aliases resolved) against the gold's; 1 when neither joins

    credit = existence * (tables + joins) / 2, in [0, 1]; 0 when the prediction does not parse.

It is trusted code on untrusted text: it only parses, never executes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from sqlglot import exp

from rewards.sqlinfo import parse

Schema = Mapping[str, frozenset[str]]
"""Table name -> its column names, lower case."""

JoinPair = frozenset[tuple[str, str]]


@dataclass(frozen=True)
class References:
    """What one query names."""

    tables: frozenset[str]
    columns: frozenset[tuple[str | None, str]]
    """(table it resolves to, or None when unqualified, column name)."""
    joins: frozenset[JoinPair]
    local_names: frozenset[str]
    """Names the query defines itself: CTEs, table and select aliases."""


@lru_cache(maxsize=4096)
def references(sql: str) -> References | None:
    """The tables, columns and join pairs `sql` names (lower case); None if it does not parse.
    Cached: a task's gold query is parsed once per worker, not once per prediction."""
    tree = parse(sql)
    if tree is None:
        return None
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    aliases: dict[str, str] = {}
    tables = set()
    for table in tree.find_all(exp.Table):
        name = table.name.lower()
        if not name or name in ctes:
            continue
        tables.add(name)
        aliases[(table.alias or name).lower()] = name
    select_aliases = {a.alias.lower() for a in tree.find_all(exp.Alias) if a.alias}
    columns = set()
    for column in tree.find_all(exp.Column):
        name = column.name.lower()
        if not name or name == "*":
            continue
        qualifier = column.table.lower() if column.table else None
        columns.add((aliases.get(qualifier, qualifier) if qualifier else None, name))
    joins = set()
    for eq in tree.find_all(exp.EQ):
        left, right = eq.left, eq.right
        if isinstance(left, exp.Column) and isinstance(right, exp.Column):
            a = (aliases.get(left.table.lower(), left.table.lower()), left.name.lower())
            b = (aliases.get(right.table.lower(), right.table.lower()), right.name.lower())
            if a[0] and b[0] and a[0] != b[0]:
                joins.add(frozenset((a, b)))
    local = frozenset(ctes | set(aliases) - set(aliases.values()) | select_aliases)
    return References(frozenset(tables), frozenset(columns), frozenset(joins), local)


def _f1(predicted: frozenset, gold: frozenset) -> float:
    if not predicted and not gold:
        return 1.0
    if not predicted or not gold:
        return 0.0
    hits = len(predicted & gold)
    return 2 * hits / (len(predicted) + len(gold))


def existence(refs: References, schema: Schema) -> float:
    """Share of the names `refs` uses that the schema has (its own local names aside)."""
    known_tables = set(schema)
    all_columns = set().union(*schema.values()) if schema else set()
    checks = [name in known_tables for name in refs.tables]
    for table, column in refs.columns:
        if column in refs.local_names and table is None:
            continue
        if table is not None and table in schema:
            checks.append(column in schema[table])
        elif table is not None and table in refs.local_names:
            continue  # a CTE's or subquery's column: not the schema's to check
        else:
            checks.append(column in all_columns)
    return sum(checks) / len(checks) if checks else 1.0


def schema_credit(sql: str, gold_sql: str, schema: Schema) -> float:
    """The schema-linking component for `sql` (see the module docstring)."""
    predicted, gold = references(sql), references(gold_sql)
    if predicted is None or gold is None:
        return 0.0
    return existence(predicted, schema) * (
        _f1(predicted.tables, gold.tables) + _f1(predicted.joins, gold.joins)) / 2
