"""Snapping a query's string values onto the data: the value half of `rewards.snap`.

A question says "urgent tickets" or "the Enterprise plan"; the column holds `'urgent'` and
`'enterprise'`. A model that writes `Priority = 'Urgent'` has the right query and an empty
answer. Value retrieval steps of text-to-SQL pipelines (CHESS, Talaei et al., 2024, among
others) look the question's values up in the database; this is its narrow, after-the-fact form:
parse the query (sqlglot, DuckDB dialect) and, for each comparison of a column with a string
(`=`, `<>`, `IN`), replace a string the column does not hold with the one value it does hold
that is equal up to case, spaces, hyphens and underscores (`fold`). Nothing else is changed: a
string with no such twin, or with more than one, stays as written, so a question about a value
that is absent still gets its empty answer.

It reads only the query, the schema and the values of the user's own database (through
`values`, which the caller backs with trusted queries), never the gold, so it is fair at
inference. It is not a reward: a training reward must see what the model wrote.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence

from sqlglot import exp

from rewards.schema_linking import Schema
from rewards.sqlinfo import parse

Values = Callable[[str, str], Sequence[str] | None]
"""(table, column) -> the distinct strings the column holds, or None when it holds no strings
(or too many to look through)."""


def fold(value: str) -> str:
    """What two spellings of one value share: case, spaces, hyphens and underscores dropped."""
    return re.sub(r"[\s_\-]+", "", value.casefold())


def snap_values(sql: str, schema: Schema, values: Values) -> str | None:
    """`sql` with the strings its columns lack replaced by their twins in the data; None when
    the query does not parse or nothing was replaced (the caller then keeps `sql`)."""
    if not schema:
        return None
    tree = parse(sql)
    if tree is None:
        return None
    refs = _table_refs(tree, schema)
    changed = False
    for column, literal in _compared_strings(tree):
        table = _table_of(column, refs, schema)
        if table is None:
            continue
        held = values(table, column.name.lower())
        if not held or literal.this in held:
            continue
        twins = sorted({v for v in held if fold(v) == fold(literal.this)})
        if len(twins) == 1:
            literal.set("this", twins[0])
            changed = True
    return tree.sql(dialect="duckdb") if changed else None


def _table_refs(tree: exp.Expression, schema: Schema) -> dict[str, str]:
    """How the query refers to each schema table it reads (alias or name) -> the table."""
    refs: dict[str, str] = {}
    for table in tree.find_all(exp.Table):
        name = table.name.lower()
        if name in schema and not table.args.get("db"):
            refs[(table.alias or name).lower()] = name
    return refs


def _compared_strings(tree: exp.Expression) -> Iterator[tuple[exp.Column, exp.Literal]]:
    """Every (column, string) pair the query compares with =, <> or IN."""
    for node in tree.find_all(exp.EQ, exp.NEQ, exp.In):
        if isinstance(node, exp.In):
            if isinstance(node.this, exp.Column):
                for item in node.expressions:
                    if isinstance(item, exp.Literal) and item.is_string:
                        yield node.this, item
            continue
        for a, b in ((node.this, node.expression), (node.expression, node.this)):
            if isinstance(a, exp.Column) and isinstance(b, exp.Literal) and b.is_string:
                yield a, b


def _table_of(column: exp.Column, refs: dict[str, str], schema: Schema) -> str | None:
    """The schema table a column reference reads: its qualifier's, or the one table the query
    reads that has a column of that name; None when that is not clear."""
    name = column.name.lower()
    if column.table:
        table = refs.get(column.table.lower())
        return table if table is not None and name in schema[table] else None
    owners = {t for t in refs.values() if name in schema[t]}
    return owners.pop() if len(owners) == 1 else None
