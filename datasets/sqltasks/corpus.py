"""Load a generated corpus, or the hand-written transfer split, as `rewards.Task`s.

Two generated corpora ship: `twotable` (`data/generated-seed0.jsonl`: one parent/child shape
in many domains, with near misses) and `multitable` (`data/multitable-seed0.jsonl`: databases
of 3 to 12 tables with keys, junctions, self-references, NULLs and six naming styles). Files
hold questions and gold queries; the rows of every database copy are rebuilt from the seed,
which is cheap. Other seeds are generated (and verified) on first use. The split `transfer` is
the same for both: hand-written questions on three application databases neither corpus has.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import Literal

from rewards import Task
from sqltasks.database import COPIES, instance
from sqltasks.domains import DOMAINS, SPLITS
from sqltasks.generate import Record, corpus_path, generate, read
from sqltasks.shapes.build import database
from sqltasks.shapes.generate import load_records as multitable_records
from sqltasks.templates import TIERS
from sqltasks.transfer.split import load_transfer

Corpus = Literal["twotable", "multitable"]
CORPORA = ("twotable", "multitable")


@lru_cache(maxsize=4)
def _records(seed: int, corpus: str = "twotable") -> tuple[Record, ...]:
    if corpus == "multitable":
        return tuple(multitable_records(seed))
    path = corpus_path(seed)
    return tuple(read(path) if path.exists() else generate(seed))


def multitable_task(record: Record, seed: int = 0) -> Task:
    setups = database(record.domain, record.variant, seed).setups()
    return Task(
        setup_sql=setups[0], question=record.question, gold_sql=record.gold_sql,
        extra_setups=setups[1:], id=record.id, domain=record.domain, tier=record.tier,
        split=record.split,
        meta={"variant": record.variant, "template": record.template, "near_misses": [],
              "source": f"multitable-seed{seed}"},
    )


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
    split: str = "train", seed: int = 0, tiers: Iterable[str] | None = None,
    corpus: Corpus = "twotable",
) -> list[Task]:
    """Tasks of one split (`train`, `dev`, `test`, `transfer`, or `all` of the generated
    ones), optionally only some tiers."""
    if split != "all" and split not in (*SPLITS, "transfer"):
        raise ValueError(f"unknown split {split!r}; expected one of {(*SPLITS, 'transfer')} "
                         "or 'all'")
    if corpus not in CORPORA:
        raise ValueError(f"unknown corpus {corpus!r}; expected one of {CORPORA}")
    wanted = set(tiers) if tiers is not None else set(TIERS)
    unknown = wanted - set(TIERS)
    if unknown:
        raise ValueError(f"unknown tiers {sorted(unknown)}; expected some of {TIERS}")
    if split == "transfer":
        return [t for t in load_transfer() if t.tier in wanted]
    build = multitable_task if corpus == "multitable" else to_task
    return [
        build(r, seed)
        for r in _records(seed, corpus)
        if (split == "all" or r.split == split) and r.tier in wanted
    ]
