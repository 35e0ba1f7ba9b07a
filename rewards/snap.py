"""Snapping a query's names onto the schema: an inference-time repair for guessed identifiers.

A small model that has not seen a database writes the question's words where the schema's names
belong: `Name` where the table has `FullName`, `Customer` for `Customers`, `VIPs` for `IsVip`.
DuckDB then refuses the whole query. Constrained decoding (PICARD, Scholak et al., 2021) keeps
such names from being generated at all; this is its cheap, after-the-fact form: parse the query
(sqlglot, DuckDB dialect) and replace each table or column name the database lacks with the
closest name it has, where one is close enough:

    tables   an unknown table becomes the closest table of the schema;
    columns  an unknown column becomes the closest column of the table it is qualified with,
             or, unqualified, of the tables the query reads; a right name qualified with the
             wrong table of a join moves to the table that has it;
    qualifiers  one the query cannot use (the table's name after it took an alias, a stray
             letter) becomes the reference it most likely means;

names the query defines itself (CTEs, aliases, a subquery's output) are never touched.

Closeness (`closeness`) compares names with case, underscores and quotes ignored: the same name
1.0, the same up to a plural `s` 0.95, one inside the other 0.7 plus up to 0.3 by their length
ratio, otherwise difflib's ratio; below `MIN_CLOSENESS` nothing is replaced. Ties go to the
schema's name that sorts first, so the repair is deterministic. A bare `id` on a known table
becomes that table's own key column (`c.Id` -> `c.CustomerId`).

It reads only the query and the schema of the user's own database, never the gold, so it is
fair at inference. It is not a reward: a training reward must see what the model wrote.
Trusted code on untrusted text: it only parses and prints, never executes.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping

from sqlglot import exp

from rewards.schema_linking import Schema
from rewards.sqlinfo import parse

MIN_CLOSENESS = 0.6


def _bare(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", name.lower())


def _singular(name: str) -> str:
    for suffix in ("ies", "es", "s"):
        if name.endswith(suffix) and len(name) > len(suffix) + 2:
            return name[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return name


def closeness(a: str, b: str) -> float:
    """How alike two names are, in [0, 1] (see the module docstring)."""
    x, y = _bare(a), _bare(b)
    if not x or not y:
        return 0.0
    if x == y:
        return 1.0
    sx, sy = _singular(x), _singular(y)
    if sx == sy:
        return 0.95
    short, long_ = sorted((sx, sy), key=len)
    if len(short) >= 3 and short in long_:
        return 0.7 + 0.3 * len(short) / len(long_)
    return difflib.SequenceMatcher(None, x, y).ratio()


def _best(scored: Iterable[tuple[float, str]]) -> str | None:
    """The name with the highest score, ties to the one that sorts first, if it reaches
    `MIN_CLOSENESS`."""
    ranked = sorted((-score, name) for score, name in scored)
    return ranked[0][1] if ranked and -ranked[0][0] >= MIN_CLOSENESS else None


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to `name`, if any reaches `MIN_CLOSENESS`."""
    return _best((closeness(name, c), c) for c in candidates)


def _own_key(table: str, columns: Iterable[str]) -> str | None:
    """The column a bare `id` most likely means: the table's own `<table>_id` (`veh_id` for
    `vehicle`), the `...id` column whose stem is closest to the table's name."""
    return _best((closeness(_bare(c)[:-2], _singular(_bare(table))), c) for c in columns
                 if _bare(c).endswith("id") and len(_bare(c)) > 2)


def _rename(node: exp.Expression, key: str, name: str) -> None:
    node.set(key, exp.to_identifier(name))


def snap_to_schema(sql: str, schema: Schema) -> str | None:
    """`sql` with the names the schema lacks replaced by its closest ones; None when the query
    does not parse or nothing was replaced (the caller then keeps `sql` as it was)."""
    if not schema:
        return None
    tree = parse(sql)
    if tree is None:
        return None
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    refs, changed = _snap_tables(tree, schema, ctes)
    local = ctes | {s.alias.lower() for s in tree.find_all(exp.Subquery) if s.alias}
    selected = {a.alias.lower() for a in tree.find_all(exp.Alias) if a.alias}
    for column in tree.find_all(exp.Column):
        changed |= _snap_column(column, schema, refs, local, selected)
    return tree.sql(dialect="duckdb") if changed else None


def _snap_tables(tree: exp.Expression, schema: Schema,
                 ctes: set[str]) -> tuple[dict[str, str], bool]:
    """Snap every table the query reads; returns how the query refers to each (its alias, or
    its name) -> the schema's table, and whether anything changed."""
    refs: dict[str, str] = {}
    changed = False
    for table in tree.find_all(exp.Table):
        name = table.name.lower()
        if not name or name in ctes or table.args.get("db"):
            continue
        if name not in schema:
            match = closest(name, schema)
            if match is not None:
                _rename(table, "this", match)
                changed = True
                name = match
        refs[(table.alias or name).lower()] = name
    return refs, changed


def _reference(qualifier: str, refs: Mapping[str, str]) -> str | None:
    """The query's own name for the table `qualifier` means: itself when valid, else the
    reference whose alias or table is closest (`Tickets.Subject` after `FROM Tickets t` means
    `t`; `Customer.Name` after `Customer` became `customers` means `customers`), else the only
    table read; None when it cannot tell."""
    if qualifier in refs:
        return qualifier
    best = _best((max(closeness(qualifier, ref), closeness(qualifier, table)), ref)
                 for ref, table in refs.items())
    return best or (next(iter(refs)) if len(refs) == 1 else None)


def _snap_column(column: exp.Column, schema: Schema, refs: Mapping[str, str],
                 local: set[str], selected: set[str]) -> bool:
    """Snap one column reference in place (see the module docstring); True if it changed."""
    name = column.name.lower()
    if not name or isinstance(column.this, exp.Star):
        return False
    changed = False
    if column.table:
        qualifier = column.table.lower()
        if qualifier in local:
            return False  # a CTE's or a subquery's column: not the schema's
        ref = _reference(qualifier, refs)
        if ref is None or refs[ref] not in schema:
            return False
        if ref != qualifier:
            _rename(column, "table", ref)
            changed = True
        own = schema[refs[ref]]
        if name in own:
            return changed
        match = closest(name, own) or (_own_key(refs[ref], own) if _bare(name) == "id" else None)
        if match is None or closeness(name, match) < 1.0:
            # Right name, wrong table: `t.FullName` where `c`, also read, has it.
            elsewhere = sorted(r for r, t in refs.items() if t in schema and name in schema[t])
            if elsewhere:
                _rename(column, "table", elsewhere[0])
                return True
    else:
        if name in local or name in selected:
            return False
        own = set().union(*(schema[t] for t in refs.values() if t in schema))
        if not own or name in own:
            return False
        match = closest(name, own)
    if match is not None:
        _rename(column, "this", match)
        changed = True
    return changed
