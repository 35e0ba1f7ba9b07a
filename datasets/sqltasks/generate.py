"""Generate and verify the synthetic corpus; `python -m sqltasks.generate` rewrites the file.

For every domain, schema variant and template, literals are drawn from the first database copy
and the task is kept only if, on all copies, the gold query runs, returns between 1 and
`MAX_ROWS` rows that are not all NULL, the template's `check` holds, and every near miss gives a
different result on at least one copy. Each (domain, variant) has its own random generator, so
generating one domain alone reproduces exactly its part of the full corpus.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from rewards.compare import execution_match
from rewards.sqlinfo import has_top_level_order_by
from sqltasks.database import COPIES, VARIANTS, instance, schema
from sqltasks.domains import BLUEPRINTS, DOMAINS, Blueprint
from sqltasks.templates import TEMPLATES, TIERS, Template

MAX_ROWS = 60
DRAWS_PER_TEMPLATE = 3
DATA_DIR = Path(__file__).resolve().parent / "data"


def corpus_path(seed: int) -> Path:
    return DATA_DIR / f"generated-seed{seed}.jsonl"


@dataclass(frozen=True)
class Record:
    """One generated task as stored: everything except the rows, which the seed rebuilds."""

    id: str
    domain: str
    variant: int
    split: str
    tier: str
    template: str
    question: str
    gold_sql: str
    near_misses: tuple[str, ...]

    def to_json(self) -> str:
        data = dict(self.__dict__)
        data["near_misses"] = list(self.near_misses)
        return json.dumps(data, ensure_ascii=False, sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> Record:
        data = json.loads(line)
        data["near_misses"] = tuple(data["near_misses"])
        return cls(**data)


def _connections(blueprint: Blueprint, variant: int, seed: int) -> list[duckdb.DuckDBPyConnection]:
    connections = []
    for copy in range(COPIES):
        connection = duckdb.connect(":memory:")
        connection.execute(instance(blueprint, variant, copy, seed).setup_sql)
        connection.execute("SET enable_external_access=false")
        connections.append(connection)
    return connections


def _run(connection: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[Any, ...]] | None:
    try:
        return connection.execute(sql).fetchall()
    except duckdb.Error:
        return None


def _verified(
    gold: str, near: list[str], check: str | None, connections: list[duckdb.DuckDBPyConnection]
) -> bool:
    ordered = has_top_level_order_by(gold)
    golds = []
    for connection in connections:
        rows = _run(connection, gold)
        if not rows or len(rows) > MAX_ROWS or all(v is None for row in rows for v in row):
            return False
        if check is not None and _run(connection, check) != [(True,)]:
            return False
        golds.append(rows)
    for miss in near:
        results = [_run(c, miss) for c in connections]
        if all(
            rows is not None and execution_match(rows, g, ordered=ordered, column_mode="perm")
            for rows, g in zip(results, golds, strict=False)
        ):
            return False
    return True


def _fill(text: str, names: dict[str, str], params: dict[str, Any]) -> str:
    return text.format(**names, **params)


def generate_domain(blueprint: Blueprint, seed: int = 0) -> Iterator[Record]:
    """Every verified task of one domain, in a fixed order."""
    for variant in range(VARIANTS):
        s = schema(blueprint, variant)
        names = {**s.names, **s.phrases}
        rng = random.Random(f"sqltasks-templates/{seed}/{blueprint.domain}/{variant}")
        first = instance(blueprint, variant, 0, seed)
        connections = _connections(blueprint, variant, seed)
        try:
            seen: set[str] = set()
            for template in TEMPLATES:
                yield from _instantiate(template, blueprint, variant, names, first, rng, seen,
                                        connections)
        finally:
            for connection in connections:
                connection.close()


def _instantiate(template: Template, blueprint, variant, names, first, rng, seen, connections):
    draws = DRAWS_PER_TEMPLATE if template.params else 1
    kept = 0
    for _ in range(draws):
        params = template.params(first, rng) if template.params else {}
        gold = _fill(template.gold, names, params)
        question = _fill(rng.choice(template.questions), names, params)
        if gold in seen:
            continue
        seen.add(gold)
        near = [_fill(n, names, params) for n in template.near]
        check = _fill(template.check, names, params) if template.check else None
        if not _verified(gold, near, check, connections):
            continue
        yield Record(
            id=f"{blueprint.domain}-v{variant}-{template.key}-{kept}",
            domain=blueprint.domain,
            variant=variant,
            split=blueprint.split,
            tier=template.tier,
            template=template.key,
            question=question,
            gold_sql=gold,
            near_misses=tuple(near),
        )
        kept += 1


def generate(seed: int = 0, domains: Iterable[str] | None = None) -> list[Record]:
    chosen = [DOMAINS[d] for d in domains] if domains is not None else list(BLUEPRINTS)
    return [record for blueprint in chosen for record in generate_domain(blueprint, seed)]


def write(records: list[Record], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(r.to_json() + "\n" for r in records), encoding="utf-8")


def read(path: Path) -> list[Record]:
    return [Record.from_json(line) for line in path.read_text(encoding="utf-8").splitlines()]


def statistics(records: Iterable[Record]) -> str:
    """A tier-by-split table of task counts, as the dataset card shows it."""
    counts = Counter((r.tier, r.split) for r in records)
    splits = ("train", "dev", "test")
    lines = ["| tier | " + " | ".join(splits) + " | total |", "|---|---|---|---|---|"]
    for tier in (*TIERS, "total"):
        row = [
            sum(v for (t, s), v in counts.items() if s == split and tier in (t, "total"))
            for split in splits
        ]
        lines.append(f"| {tier} | " + " | ".join(map(str, row)) + f" | {sum(row)} |")
    return "\n".join(lines)


def run_cli(argv: list[str] | None, doc: str, make: Callable[[int], list[Record]],
            path_for: Callable[[int], Path], extent: Callable[[int], str] = lambda seed: "") -> int:
    """The command line of a corpus generator: generate for `--seed`, write, print the table.
    `extent` adds what the count covers (" over 144 databases")."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    records = make(args.seed)
    out = args.out or path_for(args.seed)
    write(records, out)
    print(f"wrote {len(records)} tasks{extent(args.seed)} to {out}", file=sys.stderr)
    print(statistics(records))
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(argv, __doc__, generate, corpus_path)


if __name__ == "__main__":
    raise SystemExit(main())
