"""Load the generated corpus as `rewards.Task`s.

The shipped file (`data/generated-seed0.jsonl`) holds questions, gold queries and near misses;
the rows of every database copy are rebuilt from the seed, which is cheap. Other seeds are
generated (and verified) on first use, which takes about a minute.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache

from rewards import Task
from sqltasks.database import COPIES, instance
from sqltasks.domains import DOMAINS, SPLITS
from sqltasks.generate import Record, corpus_path, generate, read
from sqltasks.templates import TIERS


@lru_cache(maxsize=4)
def _records(seed: int) -> tuple[Record, ...]:
    path = corpus_path(seed)
    return tuple(read(path) if path.exists() else generate(seed))


def to_task(record: Record, seed: int = 0) -> Task:
    blueprint = DOMAINS[record.domain]
    copies = [instance(blueprint, record.variant, c, seed).setup_sql for c in range(COPIES)]
    return Task(
        setup_sql=copies[0],
        question=record.question,
        gold_sql=record.gold_sql,
        extra_setups=tuple(copies[1:]),
        id=record.id,
        domain=record.domain,
        tier=record.tier,
        split=record.split,
        meta={
            "variant": record.variant,
            "template": record.template,
            "near_misses": list(record.near_misses),
            "source": f"generated-seed{seed}",
        },
    )


def load_corpus(
    split: str = "train", seed: int = 0, tiers: Iterable[str] | None = None
) -> list[Task]:
    """Tasks of one split (`train`, `dev`, `test`, or `all`), optionally only some tiers."""
    if split != "all" and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS} or 'all'")
    wanted = set(tiers) if tiers is not None else set(TIERS)
    unknown = wanted - set(TIERS)
    if unknown:
        raise ValueError(f"unknown tiers {sorted(unknown)}; expected some of {TIERS}")
    return [
        to_task(r, seed)
        for r in _records(seed)
        if (split == "all" or r.split == split) and r.tier in wanted
    ]
