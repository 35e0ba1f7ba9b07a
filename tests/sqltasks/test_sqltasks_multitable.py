"""The multi-table corpus: reproducible from its seed, many shapes and naming styles, every gold
query verified by execution, splits disjoint by theme."""

from __future__ import annotations

from collections import Counter

import duckdb
import pytest

from sqltasks import TIERS, load_corpus
from sqltasks.generate import read
from sqltasks.shapes.build import COPIES, database, terse_words
from sqltasks.shapes.generate import (
    corpus_path,
    databases,
    generate_database,
    nontrivial,
)
from sqltasks.shapes.naming import STYLES, column_name, quote
from sqltasks.shapes.themes import themes


@pytest.fixture(scope="module")
def shipped():
    return read(corpus_path(0))


def test_the_shipped_file_is_what_the_generator_writes_for_its_seed(shipped):
    for theme, index in (("clinic", 0), ("farm", 3), ("hr_company", 7)):
        db = database(theme, index, 0)
        assert list(generate_database(db)) == [
            r for r in shipped if r.domain == theme and r.variant == index
        ]
    assert corpus_path(0).stat().st_size < 3_000_000


def test_databases_have_many_shapes_and_naming_styles():
    dbs = databases(0)
    assert len(dbs) >= 100
    sizes = Counter(len(db.tables) for db in dbs)
    assert min(sizes) >= 3 and max(sizes) <= 12 and max(sizes) >= 10
    assert len(sizes) >= 6, f"too few distinct table counts: {sorted(sizes)}"
    assert {db.style for db in dbs} == set(STYLES)
    junctions = sum(any(t.entity.junction for t in db.tables) for db in dbs)
    self_refs = sum(any(c.field.arg == t.entity.singular for t in db.tables
                        for c in t.references) for db in dbs)
    assert junctions >= 30 and self_refs >= 30
    columns = [len(t.columns) + 1 for db in dbs for t in db.tables]
    assert min(columns) >= 3 and max(columns) >= 8
    # Memorising names does not pay: the same theme appears under many spellings.
    spellings = {db.table(db.tables[0].entity.singular).name for db in dbs
                 if db.theme == "retail"}
    assert len(spellings) >= 3


def test_some_columns_are_named_by_their_head_noun_alone_where_that_is_unambiguous():
    eligible = terse = 0
    for db in databases(0):
        for table in db.tables:
            for column in table.attributes:
                head = terse_words(column.field, table.entity)
                if head is None:
                    continue
                eligible += 1
                if column.name == column_name(db.style, head):
                    terse += 1
                    others = [c.field.words.split("_")[-1] for c in table.attributes
                              if c is not column]
                    assert head not in others, (db.name, table.name, column.name)
    # `full_name` -> `name`, `insurance_plan` -> `plan`: the question's words are not the name
    assert eligible >= 500 and 0.25 <= terse / eligible <= 0.55, (terse, eligible)


def test_every_copy_loads_with_its_keys_and_some_nulls():
    db = next(d for d in databases(0) if any(c.field.nullable for t in d.tables
                                             for c in t.columns))
    nulls = 0
    for copy in range(COPIES):
        with duckdb.connect(":memory:") as connection:
            connection.execute(db.setup_sql(copy))
            for table in db.tables:
                for column in table.columns:
                    if column.field.nullable:
                        nulls += connection.execute(
                            f"SELECT COUNT(*) FROM {quote(table.name)} "
                            f"WHERE {quote(column.name)} IS NULL").fetchone()[0]
            keys = connection.execute(
                "SELECT COUNT(*) FROM duckdb_constraints() WHERE constraint_type = 'FOREIGN KEY'"
            ).fetchone()[0]
            assert keys == sum(len(t.references) for t in db.tables)
    assert nulls > 0
    assert db.setup_sql(0) != db.setup_sql(1)


def test_every_gold_query_executes_on_every_copy_and_answers_something(shipped):
    by_db: dict[tuple[str, int], list] = {}
    for record in shipped:
        by_db.setdefault((record.domain, record.variant), []).append(record)
    for (theme, index), records in by_db.items():
        db = database(theme, index, 0)
        for copy in range(COPIES):
            with duckdb.connect(":memory:") as connection:
                connection.execute(db.setup_sql(copy))
                for record in records:
                    rows = connection.execute(record.gold_sql).fetchall()
                    if copy == 0:
                        assert nontrivial(rows), (record.id, rows)


def test_splits_are_disjoint_by_theme_and_cover_every_tier():
    splits = {s: load_corpus(s, corpus="multitable") for s in ("train", "dev", "test")}
    themes_of = {s: {t.domain for t in tasks} for s, tasks in splits.items()}
    assert not themes_of["train"] & (themes_of["dev"] | themes_of["test"])
    assert not themes_of["dev"] & themes_of["test"]
    assert len(splits["train"]) >= 1500 and len(splits["dev"]) >= 200
    for tasks in splits.values():
        assert set(Counter(t.tier for t in tasks)) == set(TIERS)
        assert all(len(t.setups) == COPIES for t in tasks)
    templates = Counter(t.meta["template"] for t in splits["train"])
    for shape in ("junction", "self_join", "join_two_hops", "without_children", "top_per_group"):
        assert templates[shape] > 0, shape
    # Joins in the shapes real questions take: rows listed with their parent's name, by a
    # self-reference, counted through a junction, and filtered or grouped two hops away; and
    # more of them than of any other tier.
    for shape in ("join_list_parent", "self_join_list", "junction_count", "join_average_per_parent",
                  "join_two_hops_list", "join_two_hops_count_per"):
        assert templates[shape] >= 5, shape
    tiers = Counter(t.tier for t in splits["train"])
    assert tiers["join"] >= 1.5 * max(n for tier, n in tiers.items() if tier != "join")
    # The forms people ask on real databases: everything counted, minima, date ranges, negated
    # flags, groups by a key's id.
    for shape in ("count_all", "extreme", "extreme_date", "count_month", "count_flag",
                  "filter_date_range", "filter_flag_not", "having_count_key", "average_per_key"):
        assert templates[shape] >= 15, shape
    golds = [t.gold_sql for t in splits["train"]]
    assert sum("MIN(" in g for g in golds) >= 15 and sum("DATE '" in g for g in golds) >= 50
    # The questions name things in words: no question spells a table's identifier.
    sample = splits["dev"][:100]
    assert sum("_" in t.question for t in sample) <= 5


def test_themes_parse_and_every_reference_resolves():
    parsed = themes()
    assert {t.split for t in parsed.values()} == {"train", "dev", "test"}
    for theme in parsed.values():
        names = {e.singular for e in theme.entities}
        assert all(r.arg in names for e in theme.entities for r in e.refs)
