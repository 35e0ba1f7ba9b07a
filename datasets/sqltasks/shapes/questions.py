"""Question templates over a database's schema graph: each names things in words, never by
identifier, so answering needs the schema.

Every template looks at one database (its tables, keys and the rows of copy 0, where literals
come from) and yields candidates: (tier, template key, question, gold SQL). Joins follow the
declared foreign keys, junction tables give many-to-many joins, self-references give self-joins;
filters use values that occur in the data. `generate` verifies each candidate by execution.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sqltasks.shapes.build import Column, Database, Table, rows
from sqltasks.shapes.naming import quote


@dataclass(frozen=True)
class Candidate:
    tier: str
    key: str
    question: str
    gold_sql: str


def _s(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _plural(phrase: str) -> str:
    return phrase if phrase.endswith("s") else phrase + "s"


def _words(table: Table) -> tuple[str, str]:
    e = table.entity
    return e.singular.replace("_", " "), e.plural.replace("_", " ")


def _col(alias: str, column: Column | str) -> str:
    name = column if isinstance(column, str) else column.name
    return f"{alias}.{quote(name)}" if alias else quote(name)


def _values(db: Database, table: Table, column: Column) -> list[Any]:
    return [r[column.name] for r in rows(db, table, 0) if r[column.name] is not None]


def _date_phrase(column: Column) -> str:
    """`opened_on` reads as "opened date" in a question."""
    phrase = column.field.phrase
    return phrase[:-3] + " date" if phrase.endswith(" on") else phrase


def _named(table: Table) -> bool:
    """Rows of this table have a name (a person's or a label) that questions can list."""
    return table.entity.display is not None


def _kind(table: Table, *kinds: str) -> list[Column]:
    return [c for c in table.attributes if c.field.kind in kinds and c != table.display]


def _role(reference: Column, parent: Table) -> str:
    singular, _ = _words(parent)
    words = reference.field.phrase
    return singular if words == singular else f"{words} {singular}"


Template = Callable[[Database, Table, random.Random], Iterator[Candidate]]


# -------------------------------------------------------------- single table
def _value(v: str, rng: random.Random) -> str:
    """A literal as people write it in a question: quoted or not."""
    return _s(v) if rng.random() < 0.5 else v


def _projection(t: Table, rng: random.Random, alias: str = "") -> tuple[str, str]:
    """What a listing question asks for and its SELECT list: usually the rows' names,
    sometimes their ids, or both."""
    show, roll = t.display.field.phrase, rng.random()
    name, key = _col(alias, t.display), _col(alias, t.key)
    if roll < 0.6:
        return f"Give their {show}.", name
    if roll < 0.8:
        return "Give their ids.", key
    return f"Give their ids and {_plural(show)}.", f"{key}, {name}"


def filters(db: Database, t: Table, rng: random.Random) -> Iterator[Candidate]:
    if not _named(t):
        return
    singular, plural = _words(t)
    name = quote(t.name)

    def listing(key: str, forms: list[str], where: str) -> Candidate:
        ask, columns = _projection(t, rng)
        return Candidate("filter", key, f"{rng.choice(forms)} {ask}",
                         f"SELECT {columns} FROM {name} WHERE {where}")

    for c in _kind(t, "cat", "city"):
        v, p = rng.choice(_values(db, t, c)), c.field.phrase
        w = _value(v, rng)
        yield listing("filter_category", [f"Which {plural} have {p} {w}?",
                                          f"List the {plural} whose {p} is {w}.",
                                          f"Find every {singular} with {p} {w}.",
                                          f"Which {plural} are {v}?",
                                          f"List the {v} {plural}."],
                      f"{quote(c.name)} = {_s(v)}")
    for c in _kind(t, "int", "money"):
        x = statistics.median(_values(db, t, c))
        x = round(x) if c.field.kind == "int" else round(float(x), 1)
        p = c.field.phrase
        yield listing("filter_number", [f"Which {plural} have a {p} above {x}?",
                                        f"List the {plural} with {p} greater than {x}.",
                                        f"Find the {plural} whose {p} exceeds {x}."],
                      f"{quote(c.name)} > {x}")
    for c in [c for c in t.attributes if c.field.nullable]:
        p = c.field.phrase
        yield listing("filter_null", [f"Which {plural} have no {p} recorded?",
                                      f"List the {plural} whose {p} is missing.",
                                      f"Find the {plural} with an unknown {p}."],
                      f"{quote(c.name)} IS NULL")
    for c in _kind(t, "date"):
        year, p = rng.choice(_values(db, t, c)).year, _date_phrase(c)
        yield listing("filter_year", [f"Which {plural} have a {p} in {year}?",
                                      f"List the {plural} whose {p} falls in {year}."],
                      f"EXTRACT(YEAR FROM {quote(c.name)}) = {year}")
        side, than, bound = (("after", "later", f">= DATE '{year + 1}-01-01'")
                             if rng.random() < 0.5 else
                             ("before", "earlier", f"< DATE '{year}-01-01'"))
        yield listing("filter_date_range", [f"Which {plural} have a {p} {side} {year}?",
                                            f"List the {plural} whose {p} is {than} than {year}."],
                      f"{quote(c.name)} {bound}")
    for c in _kind(t, "bool"):
        p = c.field.phrase
        yield listing("filter_flag", [f"Which {plural} are marked {p}?",
                                      f"List the {plural} that are {p}.",
                                      f"Find the {plural} flagged {p}."],
                      quote(c.name))
        yield listing("filter_flag_not", [f"Which {plural} are not {p}?",
                                          f"List the {plural} that are not marked {p}."],
                      f"NOT {quote(c.name)}")


MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")


def aggregates(db: Database, t: Table, rng: random.Random) -> Iterator[Candidate]:
    singular, plural = _words(t)
    name = quote(t.name)
    if not t.entity.junction:
        yield Candidate("aggregate", "count_all",
                        rng.choice([f"How many {plural} are there?",
                                    f"What is the number of {plural}?",
                                    f"How many {plural} does the database hold?"]),
                        f"SELECT COUNT(*) FROM {name}")
    for n in _kind(t, "int", "money"):
        col, p = quote(n.name), n.field.phrase
        low = rng.random() < 0.5
        yield Candidate("aggregate", "extreme",
                        rng.choice([f"What is the {'lowest' if low else 'highest'} {p} of any "
                                    f"{singular}?",
                                    f"What is the {'smallest' if low else 'largest'} {p} among "
                                    f"all {plural}?"]),
                        f"SELECT {'MIN' if low else 'MAX'}({col}) FROM {name}")
    for d in _kind(t, "date"):
        early = rng.random() < 0.5
        yield Candidate("aggregate", "extreme_date",
                        f"What is the {'earliest' if early else 'latest'} {_date_phrase(d)} of "
                        f"any {singular}?",
                        f"SELECT {'MIN' if early else 'MAX'}({quote(d.name)}) FROM {name}")
        day = rng.choice(_values(db, t, d))
        start = day.replace(day=1)
        end = (start.replace(year=start.year + 1, month=1) if start.month == 12
               else start.replace(month=start.month + 1))
        yield Candidate("aggregate", "count_month",
                        f"How many {plural} have a {_date_phrase(d)} in {MONTHS[start.month - 1]} "
                        f"{start.year}?",
                        f"SELECT COUNT(*) FROM {name} WHERE {quote(d.name)} >= DATE '{start}' "
                        f"AND {quote(d.name)} < DATE '{end}'")
    for c in _kind(t, "bool"):
        negated = rng.random() < 0.5
        yield Candidate("aggregate", "count_flag",
                        f"How many {plural} are {'not ' if negated else ''}{c.field.phrase}?",
                        f"SELECT COUNT(*) FROM {name} WHERE "
                        f"{'NOT ' if negated else ''}{quote(c.name)}")
    for c in [c for c in t.attributes if c.field.nullable]:
        yield Candidate("aggregate", "count_null",
                        f"How many {plural} have no {c.field.phrase} recorded?",
                        f"SELECT COUNT(*) FROM {name} WHERE {quote(c.name)} IS NULL")
    for c in _kind(t, "cat", "city"):
        v = rng.choice(_values(db, t, c))
        w, p = _value(v, rng), c.field.phrase
        yield Candidate("aggregate", "count_where",
                        rng.choice([f"How many {plural} have {p} {w}?",
                                    f"Count the {plural} whose {p} is {w}.",
                                    f"What is the number of {plural} with {p} {w}?"]),
                        f"SELECT COUNT(*) FROM {name} WHERE {quote(c.name)} = {_s(v)}")
        for n in _kind(t, "int", "money"):
            yield Candidate("aggregate", "max_where",
                            f"What is the highest {n.field.phrase} among {plural} with "
                            f"{c.field.phrase} {_s(v)}?",
                            f"SELECT MAX({quote(n.name)}) FROM {name} "
                            f"WHERE {quote(c.name)} = {_s(v)}")
    for n in _kind(t, "int", "money"):
        yield Candidate("aggregate", "average",
                        f"What is the average {n.field.phrase} of all {plural}?",
                        f"SELECT AVG({quote(n.name)}) FROM {name}")
        for d in _kind(t, "date"):
            year = rng.choice(_values(db, t, d)).year
            yield Candidate("aggregate", "sum_year",
                            f"What is the total {n.field.phrase} of {plural} whose "
                            f"{_date_phrase(d)} is in {year}?",
                            f"SELECT SUM({quote(n.name)}) FROM {name} "
                            f"WHERE EXTRACT(YEAR FROM {quote(d.name)}) = {year}")


def groups(db: Database, t: Table, rng: random.Random) -> Iterator[Candidate]:
    singular, plural = _words(t)
    name = quote(t.name)
    for c in _kind(t, "cat", "city"):
        col = quote(c.name)
        yield Candidate("group_having", "count_per",
                        f"How many {plural} are there for each {c.field.phrase}?",
                        f"SELECT {col}, COUNT(*) FROM {name} GROUP BY {col}")
        k = rng.choice((1, 2, 3))
        yield Candidate("group_having", "having_count",
                        f"Which {c.field.phrase} values occur in more than {k} {plural}?",
                        f"SELECT {col} FROM {name} GROUP BY {col} HAVING COUNT(*) > {k}")
        for n in _kind(t, "int", "money"):
            yield Candidate("group_having", "average_per",
                            f"What is the average {n.field.phrase} of {plural} for each "
                            f"{c.field.phrase}?",
                            f"SELECT {col}, AVG({quote(n.name)}) FROM {name} GROUP BY {col}")


def groups_by_key(db: Database, t: Table, rng: random.Random) -> Iterator[Candidate]:
    """Per-parent counts and averages by the foreign key alone ("for each vehicle id")."""
    _, plural = _words(t)
    name = quote(t.name)
    for ref in t.references:
        parent = db.table(ref.field.arg)
        if parent is t:
            continue
        role, key = _role(ref, parent), quote(ref.name)
        k = rng.choice((1, 2))
        yield Candidate("group_having", "having_count_key",
                        f"Which {role} ids have more than {k} {plural}?",
                        f"SELECT {key} FROM {name} WHERE {key} IS NOT NULL GROUP BY {key} "
                        f"HAVING COUNT(*) > {k}")
        for n in _kind(t, "int", "money"):
            yield Candidate("group_having", "average_per_key",
                            f"What is the average {n.field.phrase} of {plural} for each {role} "
                            f"id? Skip {plural} without one.",
                            f"SELECT {key}, AVG({quote(n.name)}) FROM {name} WHERE {key} IS NOT "
                            f"NULL GROUP BY {key}")


def subqueries(db: Database, t: Table, rng: random.Random) -> Iterator[Candidate]:
    if not _named(t):
        return
    singular, plural = _words(t)
    name, show = quote(t.name), quote(t.display.name)
    for n in _kind(t, "int", "money"):
        col = quote(n.name)
        yield Candidate("subquery", "above_average",
                        f"Which {plural} have a {n.field.phrase} above the average over all "
                        f"{plural}? Give their {t.display.field.phrase}.",
                        f"SELECT {show} FROM {name} WHERE {col} > (SELECT AVG({col}) FROM {name})")
        yield Candidate("subquery", "argmax",
                        f"Which {singular} has the highest {n.field.phrase}? Give its "
                        f"{t.display.field.phrase}.",
                        f"SELECT {show} FROM {name} WHERE {col} = (SELECT MAX({col}) FROM {name})")


def windows(db: Database, t: Table, rng: random.Random) -> Iterator[Candidate]:
    if not _named(t):
        return
    singular, plural = _words(t)
    name, show = quote(t.name), quote(t.display.name)
    for n in _kind(t, "int", "money"):
        col = quote(n.name)
        yield Candidate("window", "rank",
                        f"Rank the {plural} by {n.field.phrase}, highest first (ties share a "
                        f"rank): give each one's {t.display.field.phrase} and rank.",
                        f"SELECT {show}, RANK() OVER (ORDER BY {col} DESC) FROM {name} "
                        f"WHERE {col} IS NOT NULL")
        for c in _kind(t, "cat", "city"):
            cat = quote(c.name)
            yield Candidate("window", "top_per_group",
                            f"For each {c.field.phrase}, which {singular} has the highest "
                            f"{n.field.phrase}? Give the {c.field.phrase} and its "
                            f"{t.display.field.phrase}.",
                            f"SELECT {cat}, {show} FROM (SELECT {cat}, {show}, RANK() OVER "
                            f"(PARTITION BY {cat} ORDER BY {col} DESC) AS position FROM {name} "
                            f"WHERE {col} IS NOT NULL) AS ranked WHERE position = 1")


# --------------------------------------------------------- along foreign keys
def joins(db: Database, t: Table, rng: random.Random) -> Iterator[Candidate]:
    """Child `t` joined to each table its keys reference (self-references: a self-join): rows
    listed beside their parent's name, filtered, counted and summed by parent, and the same one
    hop further, the shapes questions on real schemas take."""
    singular, plural = _words(t)
    show = t.display
    for ref in t.references:
        parent = db.table(ref.field.arg)
        p_singular, p_plural = _words(parent)
        role = _role(ref, parent)
        names = [v for v in _values(db, parent, parent.display) if isinstance(v, str)]
        on = f"c.{quote(ref.name)} = p.{quote(parent.key)}"
        frm = f"FROM {quote(t.name)} AS c JOIN {quote(parent.name)} AS p ON {on}"
        if parent is t:
            if names and _named(t):
                v = rng.choice(names)
                yield Candidate("join", "self_join",
                                f"Which {plural} have the {ref.field.phrase} {_s(v)}? Give "
                                f"their {show.field.phrase}.",
                                f"SELECT {_col('c', show)} {frm} WHERE {_col('p', show)} = {_s(v)}")
                yield Candidate("join", "self_join_list",
                                f"List each {singular} with the {show.field.phrase} of its "
                                f"{ref.field.phrase}.",
                                f"SELECT {_col('c', show)}, {_col('p', show)} {frm}")
            continue
        if t.entity.junction:
            yield from _junction(db, t, ref, rng)
            continue
        if not _named(parent):
            continue
        if names and _named(t):
            v = rng.choice(names)
            ask, listed = _projection(t, rng, "c")
            question = rng.choice([f"Which {plural} have {_value(v, rng)} as their {role}? {ask}",
                                   f"List the {plural} of the {role} {_value(v, rng)}. {ask}",
                                   None])
            if question is None:
                question = (f"List the {_plural(show.field.phrase)} of {plural} whose {role} is "
                            f"{_s(v)}.")
                listed = _col("c", show)
            yield Candidate("join", "join_filter_parent", question,
                            f"SELECT {listed} {frm} "
                            f"WHERE {_col('p', parent.display)} = {_s(v)}")
            yield Candidate("join", "join_list_parent",
                            rng.choice([f"List each {singular}'s {show.field.phrase} with the "
                                        f"{parent.display.field.phrase} of its {role}.",
                                        f"Give every {singular}'s {show.field.phrase} and its "
                                        f"{role}'s {parent.display.field.phrase}."]),
                            f"SELECT {_col('c', show)}, {_col('p', parent.display)} {frm}")
        yield Candidate("join", "join_count_per_parent",
                        f"For each {role} that has {plural}, how many {plural} does it have? "
                        f"Give the {role}'s {parent.display.field.phrase} and the count.",
                        f"SELECT {_col('p', parent.display)}, COUNT(*) {frm} "
                        f"GROUP BY p.{quote(parent.key)}, {_col('p', parent.display)}")
        for c in _kind(parent, "cat", "city") if _named(t) else ():
            v = rng.choice(_values(db, parent, c))
            yield Candidate("join", "join_parent_attribute",
                            f"List the {_plural(show.field.phrase)} of {plural} whose {role} has "
                            f"{c.field.phrase} {_s(v)}.",
                            f"SELECT {_col('c', show)} {frm} WHERE {_col('p', c)} = {_s(v)}")
        for n in _kind(t, "money", "int"):
            key, word, fn = (("join_sum_per_parent", "total", "SUM") if rng.random() < 0.5
                             else ("join_average_per_parent", "average", "AVG"))
            yield Candidate("join", key,
                            f"What is the {word} {n.field.phrase} of {plural} per {role}? Give "
                            f"the {role}'s {parent.display.field.phrase} and the {word}.",
                            f"SELECT {_col('p', parent.display)}, {fn}({_col('c', n)}) {frm} "
                            f"GROUP BY p.{quote(parent.key)}, {_col('p', parent.display)}")
        yield Candidate("subquery", "without_children",
                        f"Which {p_plural} have no {plural}? Give their "
                        f"{parent.display.field.phrase}.",
                        f"SELECT {quote(parent.display.name)} FROM {quote(parent.name)} "
                        f"WHERE {quote(parent.key)} NOT IN (SELECT {quote(ref.name)} FROM "
                        f"{quote(t.name)} WHERE {quote(ref.name)} IS NOT NULL)")
        for grand_ref in parent.references:
            grand = db.table(grand_ref.field.arg)
            if grand is parent or grand is t:
                continue
            grand_names = [v for v in _values(db, grand, grand.display) if isinstance(v, str)]
            if not grand_names:
                continue
            v = rng.choice(grand_names)
            grand_role = _role(grand_ref, grand)
            hops = (f"{frm} JOIN {quote(grand.name)} AS g ON "
                    f"p.{quote(grand_ref.name)} = g.{quote(grand.key)}")
            yield Candidate("join", "join_two_hops",
                            f"How many {plural} belong to a {role} whose {grand_role} is {_s(v)}?",
                            f"SELECT COUNT(*) {hops} WHERE {_col('g', grand.display)} = {_s(v)}")
            if _named(t):
                yield Candidate("join", "join_two_hops_list",
                                f"List the {_plural(show.field.phrase)} of {plural} whose "
                                f"{role}'s {grand_role} is {_s(v)}.",
                                f"SELECT {_col('c', show)} {hops} "
                                f"WHERE {_col('g', grand.display)} = {_s(v)}")
            yield Candidate("join", "join_two_hops_count_per",
                            f"How many {plural} does each {grand_role} have through its "
                            f"{_plural(role)}? Give the {grand_role}'s "
                            f"{grand.display.field.phrase} and the count.",
                            f"SELECT {_col('g', grand.display)}, COUNT(*) {hops} "
                            f"GROUP BY g.{quote(grand.key)}, {_col('g', grand.display)}")


def _junction(db: Database, j: Table, ref: Column, rng: random.Random) -> Iterator[Candidate]:
    """The many-to-many question: one side named, the other side listed."""
    other = next((r for r in j.references if r != ref), None)
    if other is None:
        return
    a, b = db.table(ref.field.arg), db.table(other.field.arg)
    names = [v for v in _values(db, b, b.display) if isinstance(v, str)]
    if not names or a is b or not _named(a):
        return
    _, a_plural = _words(a)
    j_singular, j_plural = _words(j)
    v = rng.choice(names)
    yield Candidate("join", "junction",
                    f"List the {_plural(a.display.field.phrase)} of {a_plural} that have a "
                    f"{j_singular} with the {_role(other, b)} {_s(v)}.",
                    f"SELECT DISTINCT {_col('a', a.display)} FROM {quote(a.name)} AS a "
                    f"JOIN {quote(j.name)} AS j ON j.{quote(ref.name)} = a.{quote(a.key)} "
                    f"JOIN {quote(b.name)} AS b ON j.{quote(other.name)} = b.{quote(b.key)} "
                    f"WHERE {_col('b', b.display)} = {_s(v)}")
    b_role = _role(other, b)
    yield Candidate("join", "junction_count",
                    f"How many {j_plural} does each {b_role} appear in? Give the {b_role}'s "
                    f"{b.display.field.phrase} and the count.",
                    f"SELECT {_col('b', b.display)}, COUNT(*) FROM {quote(j.name)} AS j "
                    f"JOIN {quote(b.name)} AS b ON j.{quote(other.name)} = b.{quote(b.key)} "
                    f"GROUP BY b.{quote(b.key)}, {_col('b', b.display)}")


SINGLE_TABLE: tuple[Template, ...] = (filters, aggregates, groups, groups_by_key, subqueries,
                                      windows)


def candidates(db: Database, rng: random.Random) -> list[Candidate]:
    """Every candidate question on `db`, in a fixed order for a given generator state."""
    out: list[Candidate] = []
    for table in db.tables:
        if not table.entity.junction:
            for template in SINGLE_TABLE:
                out.extend(template(db, table, rng))
        out.extend(joins(db, table, rng))
    return out
