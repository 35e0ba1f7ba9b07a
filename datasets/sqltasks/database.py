"""Seeded databases for the generated corpus: identifiers per schema variant, rows per copy.

`schema(blueprint, variant)` fixes every identifier of one variant (variant 0 uses the primary
spellings, variant 1 the alternative ones, variant 2 mixes them and reorders columns).
`instance(blueprint, variant, copy, seed)` draws the rows of one independently seeded copy and
renders them as a DuckDB setup script. About 15 % of parents get no children so that anti-joins
have something to find. Everything is a pure function of its arguments.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

from sqltasks.domains import Blueprint, Column

VARIANTS = 3
COPIES = 3
_SYLLABLES = (
    "ka", "lo", "mi", "ra", "ne", "to", "vi", "sa", "du", "be", "ro", "li", "ta", "mo", "ze",
    "ha", "qu", "fi", "no", "el", "an", "or", "is", "um", "ve", "ca", "pe", "jo", "ri", "su",
)
_CODE_WORDS = ("code", "reference", "ticket", "number", "batch")


@dataclass(frozen=True)
class Schema:
    """Identifiers and question phrases of one variant of one domain."""

    domain: str
    variant: int
    names: dict[str, str]
    """Role -> identifier: P, C, p_name, p_cat, p_num, p_amt, c_name, fk, c_cat, c_num, c_amt,
    c_date."""
    phrases: dict[str, str]
    parent_columns: tuple[str, ...]
    """Column roles of the parent table in declaration order."""
    child_columns: tuple[str, ...]


@dataclass(frozen=True)
class Instance:
    """One seeded copy of a database: its rows and its setup script."""

    parents: tuple[dict[str, Any], ...]
    children: tuple[dict[str, Any], ...]
    setup_sql: str


def _spell(column: Column, variant: int) -> str:
    return column.names[0] if variant == 0 else column.names[1]


@cache
def schema(blueprint: Blueprint, variant: int) -> Schema:
    p, c = blueprint.parent, blueprint.child
    table_variant = 1 if variant == 1 else 0
    column_variant = 0 if variant == 0 else 1
    names = {
        "P": p.tables[table_variant],
        "C": c.tables[table_variant],
        "p_name": _spell(p.name, column_variant),
        "p_cat": _spell(p.category, column_variant),
        "p_num": _spell(p.number, column_variant),
        "p_amt": _spell(p.amount, column_variant),
        "c_name": _spell(c.name, column_variant),
        "fk": p.singular.replace(" ", "_") + "_id",
        "c_cat": _spell(c.category, column_variant),
        "c_num": _spell(c.number, column_variant),
        "c_amt": _spell(c.amount, column_variant),
        "c_date": _spell(blueprint.date, column_variant),
    }
    phrases = {
        "P1": p.singular, "Ps": p.plural, "C1": c.singular, "Cs": c.plural,
        "p_name_": p.name.phrase, "p_cat_": p.category.phrase, "p_num_": p.number.phrase,
        "p_amt_": p.amount.phrase, "c_name_": c.name.phrase, "c_cat_": c.category.phrase,
        "c_num_": c.number.phrase, "c_amt_": c.amount.phrase, "c_date_": blueprint.date.phrase,
    }
    parent_columns = ("id", "p_name", "p_cat", "p_num", "p_amt")
    child_columns = ("id", "c_name", "fk", "c_cat", "c_num", "c_amt", "c_date")
    if variant == 2:
        parent_columns = ("id", "p_cat", "p_amt", "p_name", "p_num")
        child_columns = ("id", "c_date", "c_amt", "c_cat", "c_name", "c_num", "fk")
    return Schema(blueprint.domain, variant, names, phrases, parent_columns, child_columns)


def _names(rng: random.Random, count: int, phrase: str, prefix: str) -> list[str]:
    """Unique display names: codes for code-like columns, invented words otherwise."""
    if any(word in phrase for word in _CODE_WORDS):
        numbers = rng.sample(range(1000, 9999), count)
        return [f"{prefix.upper()}-{n}" for n in numbers]
    seen: set[str] = set()
    out = []
    while len(out) < count:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()
        if rng.random() < 0.4:
            word += " " + "".join(rng.choice(_SYLLABLES) for _ in range(2)).capitalize()
        if word not in seen:
            seen.add(word)
            out.append(word)
    return out


def _integer(rng: random.Random, column: Column) -> int:
    return rng.randint(int(column.low), int(column.high))


def _amount(rng: random.Random, column: Column) -> float:
    return round(rng.uniform(column.low, column.high), 2)


def sql_literal(value: Any) -> str:
    """A value as a DuckDB literal in a generated setup script (amounts to the cent)."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, dt.date):
        return f"DATE '{value.isoformat()}'"
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


_TYPES = {
    "id": "INTEGER", "p_name": "VARCHAR", "p_cat": "VARCHAR", "p_num": "INTEGER",
    "p_amt": "DECIMAL(10,2)", "c_name": "VARCHAR", "c_cat": "VARCHAR", "c_num": "INTEGER",
    "c_amt": "DECIMAL(10,2)", "c_date": "DATE",
}


def _create(table: str, roles: tuple[str, ...], names: dict[str, str]) -> str:
    """Plain DDL: no key constraints, whose indexes would cost DuckDB megabytes per table."""
    columns = []
    for role in roles:
        ident = "id" if role == "id" else names[role]
        kind = "INTEGER" if role == "fk" else _TYPES[role]
        columns.append(f"{ident} {kind}")
    return f"CREATE TABLE {table} ({', '.join(columns)});"


def _insert(table: str, roles: tuple[str, ...], rows: tuple[dict[str, Any], ...]) -> str:
    values = ", ".join("(" + ", ".join(sql_literal(r[role]) for role in roles) + ")" for r in rows)
    return f"INSERT INTO {table} VALUES {values};"


@lru_cache(maxsize=1024)
def instance(blueprint: Blueprint, variant: int, copy: int, seed: int) -> Instance:
    """The rows of copy `copy` of variant `variant`, drawn from their own seeded generator."""
    rng = random.Random(f"sqltasks/{seed}/{blueprint.domain}/{variant}/{copy}")
    s = schema(blueprint, variant)
    p, c = blueprint.parent, blueprint.child
    n_parents, n_children = rng.randint(10, 16), rng.randint(40, 70)
    parent_names = _names(rng, n_parents, p.name.phrase, s.names["P"][:2])
    parents = tuple(
        {
            "id": i + 1,
            "p_name": parent_names[i],
            "p_cat": rng.choice(p.category.values),
            "p_num": _integer(rng, p.number),
            "p_amt": _amount(rng, p.amount),
        }
        for i in range(n_parents)
    )
    childless = set(rng.sample(range(1, n_parents + 1), max(1, round(0.15 * n_parents))))
    owners = [i for i in range(1, n_parents + 1) if i not in childless]
    child_names = _names(rng, n_children, c.name.phrase, s.names["C"][:2])
    start = dt.date(2021, 1, 1)
    days = sorted(rng.sample(range(3 * 365), n_children))
    rng.shuffle(days)
    children = tuple(
        {
            "id": i + 1,
            "c_name": child_names[i],
            "fk": rng.choice(owners),
            "c_cat": rng.choice(c.category.values),
            "c_num": _integer(rng, c.number),
            "c_amt": _amount(rng, c.amount),
            "c_date": start + dt.timedelta(days=days[i]),
        }
        for i in range(n_children)
    )
    setup = "\n".join(
        [
            _create(s.names["P"], s.parent_columns, s.names),
            _create(s.names["C"], s.child_columns, s.names),
            _insert(s.names["P"], s.parent_columns, parents),
            _insert(s.names["C"], s.child_columns, children),
        ]
    )
    return Instance(parents, children, setup)
