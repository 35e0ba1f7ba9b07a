"""Load the frozen held-out split: hand-written questions over two application databases, each
database in two copies with other rows, fixed by a content hash.

The transfer split became a development set: its failures were read, its questions edited,
and many runs were scored on it. This split exists so that one set stays untouched. Its files
are hashed into `FROZEN` when written; `load_holdout` refuses to serve a split whose files no
longer match, so an edit cannot go unnoticed, and the only command that scores it
(`autoresearch holdout`) appends every read to `ledger.jsonl` beside it, so how often it has
been read is on record. Each question is scored on both copies of its database: an answer
that matches the first by luck (a hard-coded number, a name read off the sample rows) fails on
the second.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

import yaml

from rewards import Task
from sqltasks.templates import TIERS

HERE = Path(__file__).resolve().parent
DATABASES = ("library", "clinic")
FROZEN = HERE / "FROZEN"
LEDGER = HERE / "ledger.jsonl"


class SplitChanged(RuntimeError):
    """The held-out split's files differ from the hash they were frozen with."""


def split_files() -> list[Path]:
    """Every file whose content makes the split: questions and both copies of each database."""
    files = []
    for database in DATABASES:
        files += [HERE / f"{database}.yaml", HERE / "databases" / f"{database}.sql",
                  HERE / "databases" / f"{database}-copy.sql"]
    return files


def content_hash() -> str:
    """SHA-256 over the split's files, each as its name and its bytes, in a fixed order."""
    digest = hashlib.sha256()
    for path in split_files():
        digest.update(path.name.encode() + b"\x00" + path.read_bytes() + b"\x00")
    return digest.hexdigest()


def frozen_hash() -> str:
    return FROZEN.read_text(encoding="utf-8").split()[0]


@cache
def load_holdout() -> tuple[Task, ...]:
    """Every held-out task, in file order (ids `holdout-<database>-<nnn>`); raises
    `SplitChanged` if the files are not the ones frozen."""
    if content_hash() != frozen_hash():
        raise SplitChanged(
            f"the held-out split's files changed since they were frozen ({FROZEN}): a split "
            "that was edited after it was read is no longer held out; add questions as a new "
            "split instead")
    tasks = []
    for database in DATABASES:
        spec = yaml.safe_load((HERE / f"{database}.yaml").read_text(encoding="utf-8"))
        setup = (HERE / "databases" / f"{database}.sql").read_text(encoding="utf-8")
        copy = (HERE / "databases" / f"{database}-copy.sql").read_text(encoding="utf-8")
        for n, item in enumerate(spec["questions"]):
            if item["tier"] not in TIERS:
                raise ValueError(f"{database} question {n}: unknown tier {item['tier']!r}")
            tasks.append(Task(setup_sql=setup, question=item["question"], gold_sql=item["sql"],
                              extra_setups=(copy,), id=f"holdout-{database}-{n:03d}",
                              domain=database, tier=item["tier"], split="holdout",
                              meta={"source": "holdout", "database": database}))
    return tuple(tasks)
