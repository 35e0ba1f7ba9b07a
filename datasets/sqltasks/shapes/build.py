"""One database of the multi-table corpus: which tables of a theme, how they are named, and rows.

`database(theme, index, seed)` picks 3 to 12 of the theme's entities, closed under foreign keys
(every key points inside the set; unrelated tables may sit beside related ones), a naming
style, and the row count of each table. `Database.setup_sql(copy)` renders one copy: row keys,
display names and table sizes are the same in every copy, so a question's literals exist in
each; all other values, foreign keys and NULLs are drawn per copy, so copies give different
answers to the same query.
Everything is a pure function of (theme, index, seed, copy).
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

from sqltasks.database import sql_literal
from sqltasks.shapes.naming import STYLES, column_name, key_name, quote, table_name
from sqltasks.shapes.themes import EntitySpec, Field, themes

COPIES = 2
NULL_RATE = 0.15
FIRST_DAY, LAST_DAY = dt.date(2018, 1, 1), dt.date(2024, 12, 31)
_FIRST_NAMES = (
    "Amara", "Bruno", "Chen", "Dalia", "Emeka", "Farah", "Goran", "Hana", "Ines", "Jonas",
    "Keiko", "Luca", "Mireille", "Nadia", "Omar", "Priya", "Quentin", "Rosa", "Soren", "Tanvi",
    "Ulla", "Viktor", "Wanjiru", "Ximena", "Yusuf", "Zofia",
)
_LAST_NAMES = (
    "Abara", "Berg", "Castillo", "Dubois", "Eriksen", "Fontaine", "Gupta", "Haddad", "Ito",
    "Jovanovic", "Kowalski", "Lindqvist", "Mensah", "Novak", "Okafor", "Petrov", "Quispe",
    "Rahman", "Silva", "Tanaka", "Ueda", "Varga", "Weber", "Yilmaz", "Zhou",
)
_CITIES = (
    "Porto", "Gdansk", "Osaka", "Curitiba", "Mombasa", "Leeds", "Tampere", "Graz", "Cork",
    "Valparaiso", "Da Nang", "Kumasi", "Bergen", "Tartu", "Brno",
)
_SYLLABLES = (
    "ka", "lo", "mi", "ra", "ne", "to", "vi", "sa", "du", "be", "ro", "li", "ta", "mo", "ze",
    "ha", "fi", "no", "el", "an", "or", "ve", "ca", "pe", "jo", "ri", "su", "gu", "dra", "pol",
)
SQL_TYPES = {
    "person": "VARCHAR", "label": "VARCHAR", "cat": "VARCHAR", "city": "VARCHAR",
    "email": "VARCHAR", "int": "INTEGER", "money": "DECIMAL(12, 2)", "date": "DATE",
    "bool": "BOOLEAN", "ref": "INTEGER",
}
IDENTITY_KINDS = ("person", "label")
"""Kinds whose values are the same in every copy: what questions name rows by."""
MAX_TABLES = 12
@dataclass(frozen=True)
class Column:
    field: Field
    name: str
    sql_type: str


@dataclass(frozen=True)
class Table:
    entity: EntitySpec
    name: str
    key: str
    columns: tuple[Column, ...]
    rows: int

    @property
    def display(self) -> Column:
        """The column questions name a row by (a person's name or a label, else the first)."""
        field = self.entity.display
        return next((c for c in self.columns if c.field == field), self.attributes[0])

    @property
    def attributes(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.field.kind != "ref")

    @property
    def references(self) -> tuple[Column, ...]:
        return tuple(c for c in self.columns if c.field.kind == "ref")


@dataclass(frozen=True)
class Database:
    theme: str
    index: int
    seed: int
    style: str
    tables: tuple[Table, ...]

    @property
    def name(self) -> str:
        return f"{self.theme}-{self.index:02d}"

    def table(self, singular: str) -> Table:
        return next(t for t in self.tables if t.entity.singular == singular)

    def setup_sql(self, copy: int = 0) -> str:
        return _render(self, copy)

    def setups(self) -> tuple[str, ...]:
        return tuple(self.setup_sql(c) for c in range(COPIES))


def _closure(chosen: set[str], by_name: dict[str, EntitySpec]) -> set[str]:
    """`chosen` plus every entity its foreign keys need."""
    todo, out = list(chosen), set(chosen)
    while todo:
        for ref in by_name[todo.pop()].refs:
            if ref.arg not in out:
                out.add(ref.arg)
                todo.append(ref.arg)
    return out


def _pick_entities(entities: tuple[EntitySpec, ...], rng: random.Random) -> list[EntitySpec]:
    by_name = {e.singular: e for e in entities}
    target = rng.randint(3, min(MAX_TABLES, len(entities)))
    order = list(entities)
    rng.shuffle(order)
    chosen: set[str] = set()
    for entity in order:
        grown = _closure(chosen | {entity.singular}, by_name)
        if len(grown) <= MAX_TABLES and (len(chosen) < target or len(grown) == len(chosen)):
            chosen = grown
    return [e for e in entities if e.singular in chosen]  # the theme's order: parents first


TERSE_RATE = 0.4
"""Share of eligible attributes whose column keeps only its head noun (`insurance_plan` -> `plan`,
`full_name` -> `name`): real schemas name columns more tersely than people ask, so a question's
words must be matched against the schema, not copied into the query."""
_HEADS = frozenset((
    "name", "title", "year", "price", "rate", "wage", "cost", "fee", "total", "number", "class",
    "tier", "plan", "code", "percent", "premium", "length", "count", "center", "area", "part",
    "charge", "size", "goals",
))


def terse_words(field: Field, entity: EntitySpec) -> str | None:
    """The head noun an attribute's column may be named by alone, where that is unambiguous in
    its table (`home_goals` beside `away_goals` keeps its full name)."""
    head = field.words.split("_")[-1]
    if field.kind == "ref" or "_" not in field.words or head not in _HEADS:
        return None
    heads = [f.words.split("_")[-1] for f in entity.fields if f.kind != "ref"]
    return head if heads.count(head) == 1 and head != entity.singular else None


def _columns(entity: EntitySpec, style: str, rng: random.Random) -> tuple[Column, ...]:
    out: list[Column] = []
    used = {key_name(style, entity.singular).lower()}
    for field in entity.fields:
        ref, terse = field.kind == "ref", terse_words(field, entity)
        # the terse name if drawn, else the full one; if that collides (an abbreviation), the
        # full words spelt out
        tries = [(terse, style)] if terse and rng.random() < TERSE_RATE else []
        for words, how in [*tries, (field.words, style), (field.words, "snake_plural")]:
            name = column_name(how, words, reference=ref)
            if name.lower() not in used:
                break
        used.add(name.lower())
        out.append(Column(field, name, SQL_TYPES[field.kind]))
    return tuple(out)


@cache
def database(theme_name: str, index: int, seed: int = 0) -> Database:
    theme = themes()[theme_name]
    rng = random.Random(f"sqltasks-shapes/{seed}/{theme_name}/{index}")
    entities = _pick_entities(theme.entities, rng)
    style = STYLES[(index + rng.randrange(len(STYLES))) % len(STYLES)]
    terse = random.Random(f"sqltasks-shapes/{seed}/{theme_name}/{index}/terse")
    tables = []
    for entity in entities:
        rows = rng.randint(15, 45) if entity.junction else rng.randint(6, 24)
        tables.append(Table(entity, table_name(style, entity.singular, entity.plural),
                            key_name(style, entity.singular), _columns(entity, style, terse),
                            rows))
    return Database(theme_name, index, seed, style, tuple(tables))


# ---------------------------------------------------------------------- rows
def _label(rng: random.Random, suffix: str) -> str:
    word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3)))
    return f"{word.capitalize()} {suffix}" if suffix else word.capitalize()


def _person(rng: random.Random) -> str:
    return f"{rng.choice(_FIRST_NAMES)} {rng.choice(_LAST_NAMES)}"


def _range(arg: str) -> tuple[float, float]:
    low, _, high = arg.partition("-")
    return float(low), float(high)


def _value(field: Field, rng: random.Random) -> Any:
    kind = field.kind
    if kind == "cat":
        return rng.choice(field.arg.split("|"))
    if kind == "int":
        low, high = _range(field.arg)
        return rng.randint(int(low), int(high))
    if kind == "money":
        low, high = _range(field.arg)
        return round(rng.uniform(low, high), 2)
    if kind == "date":
        return FIRST_DAY + dt.timedelta(days=rng.randrange((LAST_DAY - FIRST_DAY).days))
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "city":
        return rng.choice(_CITIES)
    if kind == "email":
        return f"{_label(rng, '').lower()}{rng.randint(1, 99)}@example.org"
    raise ValueError(f"no value generator for kind {kind!r}")


@lru_cache(maxsize=256)
def identities(db: Database, table: str) -> tuple[str | None, ...]:
    """The display values of a table's rows: the same in every copy."""
    t = next(x for x in db.tables if x.name == table)
    field = t.entity.display
    if field is None:
        return (None,) * t.rows
    rng = random.Random(f"sqltasks-shapes/{db.seed}/{db.name}/{table}/identity")
    values: list[str] = []
    while len(values) < t.rows:
        value = _person(rng) if field.kind == "person" else _label(rng, field.arg)
        if value not in values or len(values) > 200:
            values.append(value)
    return tuple(values)


@lru_cache(maxsize=4096)
def rows(db: Database, table: Table, copy: int) -> tuple[dict[str, Any], ...]:
    """The rows of one table in one copy, keyed by column name (primary key included); cached,
    because every question template reads the first copy's values. Read-only."""
    rng = random.Random(f"sqltasks-shapes/{db.seed}/{db.name}/{table.name}/{copy}")
    sizes = {t.entity.singular: t.rows for t in db.tables}
    names = identities(db, table.name)
    out = []
    for i in range(table.rows):
        row: dict[str, Any] = {table.key: i + 1}
        for column in table.columns:
            field = column.field
            if field.kind == "ref":
                if field.arg == table.entity.singular:  # self-reference: an earlier row
                    value = rng.randint(1, i) if i and rng.random() > 0.25 else None
                else:
                    value = rng.randint(1, sizes[field.arg])
                    if field.nullable and rng.random() < NULL_RATE:
                        value = None
            elif field.kind in IDENTITY_KINDS and field == table.entity.display:
                value = names[i]
            elif field.kind in IDENTITY_KINDS:
                value = _person(rng) if field.kind == "person" else _label(rng, field.arg)
            else:
                value = _value(field, rng)
                if field.nullable and rng.random() < NULL_RATE:
                    value = None
            row[column.name] = value
        out.append(row)
    return tuple(out)


def create_statement(db: Database, table: Table) -> str:
    parts = [f"{quote(table.key)} INTEGER PRIMARY KEY"]
    for column in table.columns:
        spec = f"{quote(column.name)} {column.sql_type}"
        field = column.field
        if field.kind == "ref":
            target = db.table(field.arg)
            spec += f" REFERENCES {quote(target.name)}({quote(target.key)})"
        if not field.nullable and field.kind != "ref" or (field.kind == "ref" and not
                                                          field.nullable and field.arg !=
                                                          table.entity.singular):
            spec += " NOT NULL"
        parts.append(spec)
    return f"CREATE TABLE {quote(table.name)} ({', '.join(parts)});"


@lru_cache(maxsize=512)
def _render(db: Database, copy: int) -> str:
    statements = []
    for table in db.tables:
        statements.append(create_statement(db, table))
        data = rows(db, table, copy)
        columns = ", ".join(quote(c) for c in data[0])
        tuples = ["(" + ", ".join(sql_literal(v) for v in row.values()) + ")" for row in data]
        # DuckDB checks a self-reference against the rows before the statement: one row each.
        self_referencing = any(c.field.arg == table.entity.singular for c in table.references)
        for chunk in ([[t] for t in tuples] if self_referencing else [tuples]):
            values = ",\n  ".join(chunk)
            statements.append(f"INSERT INTO {quote(table.name)} ({columns}) VALUES\n  {values};")
    return "\n".join(statements) + "\n"
