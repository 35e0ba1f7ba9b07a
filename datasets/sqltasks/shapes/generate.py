"""Generate and verify the multi-table corpus; `python -m sqltasks.shapes.generate` rewrites it.

Per theme, `DATABASES[split]` databases are drawn (`build.database`), every candidate question
of each (`questions.candidates`) is executed on every copy, and a candidate is kept only if its
gold query runs on all copies and, on the first (the one the prompt shows), returns 1 to
`MAX_ROWS` rows that are not all NULL and not a lone zero. At most `PER_TIER` questions of each
tier are kept per database (more joins than others), so no database or template dominates. The
file stores questions and gold queries; rows are rebuilt from the seed.
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import duckdb

from sqltasks.generate import DATA_DIR, Record, read, run_cli
from sqltasks.shapes.build import COPIES, Database, database
from sqltasks.shapes.questions import Candidate, candidates
from sqltasks.shapes.themes import themes

MAX_ROWS = 60
PER_TIER: defaultdict[str, int] = defaultdict(lambda: 3, join=6)
"""Questions kept per tier and database. Joins get twice the share: questions on a real schema
need them most, and a model trained on three per database joined nothing right on databases it
never saw (docs/transfer.md)."""
DATABASES = {"train": 14, "dev": 8, "test": 8}
"""Databases drawn per theme of each split."""


def corpus_path(seed: int) -> Path:
    return DATA_DIR / f"multitable-seed{seed}.jsonl"


def _run(connection: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[Any, ...]] | None:
    try:
        return connection.execute(sql).fetchall()
    except duckdb.Error:
        return None


def nontrivial(rows: list[tuple[Any, ...]] | None) -> bool:
    """An answer worth asking for: some rows, not too many, not all NULL, not a lone 0."""
    if not rows or len(rows) > MAX_ROWS:
        return False
    if all(v is None for row in rows for v in row):
        return False
    return not (len(rows) == 1 and len(rows[0]) == 1 and rows[0][0] in (0, 0.0))


def _round_robin(pool: list[Candidate], rng: random.Random) -> list[Candidate]:
    """Candidates shuffled within each template, then taken one template at a time, so that
    rare shapes (junctions, self-joins, two hops) are not crowded out by common ones."""
    by_key: dict[str, list[Candidate]] = {}
    for candidate in pool:
        by_key.setdefault(candidate.key, []).append(candidate)
    queues = [by_key[k] for k in sorted(by_key)]
    for queue in queues:
        rng.shuffle(queue)
    rng.shuffle(queues)
    out: list[Candidate] = []
    while any(queues):
        for queue in queues:
            if queue:
                out.append(queue.pop())
    return out


def generate_database(db: Database) -> Iterator[Record]:
    """The verified questions of one database, in a fixed order."""
    rng = random.Random(f"sqltasks-shapes-questions/{db.seed}/{db.name}")
    pool = _round_robin(candidates(db, rng), rng)
    connections = []
    for copy in range(COPIES):
        connection = duckdb.connect(":memory:")
        connection.execute(db.setup_sql(copy))
        connection.execute("SET enable_external_access=false")
        connections.append(connection)
    try:
        kept: Counter[str] = Counter()
        seen: set[str] = set()
        split = themes()[db.theme].split
        for candidate in pool:
            if kept[candidate.tier] >= PER_TIER[candidate.tier] or candidate.gold_sql in seen:
                continue
            seen.add(candidate.gold_sql)
            results = [_run(c, candidate.gold_sql) for c in connections]
            if any(r is None for r in results) or not nontrivial(results[0]):
                continue
            yield Record(
                id=f"{db.name}-{candidate.key}-{kept[candidate.tier]}",
                domain=db.theme, variant=db.index, split=split, tier=candidate.tier,
                template=candidate.key, question=candidate.question,
                gold_sql=candidate.gold_sql, near_misses=(),
            )
            kept[candidate.tier] += 1
    finally:
        for connection in connections:
            connection.close()


def databases(seed: int = 0) -> list[Database]:
    return [database(name, index, seed) for name, theme in themes().items()
            for index in range(DATABASES[theme.split])]


def generate(seed: int = 0) -> list[Record]:
    return [record for db in databases(seed) for record in generate_database(db)]


def load_records(seed: int = 0) -> list[Record]:
    path = corpus_path(seed)
    return read(path) if path.exists() else generate(seed)


def main(argv: list[str] | None = None) -> int:
    return run_cli(argv, __doc__, generate, corpus_path,
                   lambda seed: f" over {len(databases(seed))} databases")


if __name__ == "__main__":
    raise SystemExit(main())
