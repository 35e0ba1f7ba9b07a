"""Deterministic train/dev/test assignment for questions that do not name their split.

The assignment is a function of the seed and the question ids (or database names) alone, so
fixing a gold query or adding a question elsewhere never moves a question between splits, and
the test questions stay the same across runs and machines. By database, whole databases go to
one split (the Spider design: dev and test databases are never seen in training).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Literal

from sqltasks.sources.questions import Question

SplitBy = Literal["question", "database"]


def _rank(seed: int, key: str) -> str:
    return hashlib.sha256(f"{seed}\0{key}".encode()).hexdigest()


def _assign(keys: Sequence[str], seed: int, dev: float, test: float) -> dict[str, str]:
    ordered = sorted(set(keys), key=lambda k: _rank(seed, k))
    n = len(ordered)
    n_test = max(1, round(n * test)) if test > 0 and n >= 3 else 0
    n_dev = min(n - n_test, max(1, round(n * dev))) if dev > 0 and n >= 3 else 0
    return {key: "test" if i < n_test else "dev" if i < n_test + n_dev else "train"
            for i, key in enumerate(ordered)}


def assign_splits(questions: Sequence[Question], seed: int, dev: float, test: float,
                  by: SplitBy = "question") -> dict[str, str]:
    """Question id -> split: a question's own split when it names one, else a seeded draw
    with about `dev` and `test` of the rest (by question, or by database)."""
    if not 0 <= dev <= 1 or not 0 <= test <= 1 or dev + test > 1:
        raise ValueError("dev and test fractions must be in [0, 1] and add up to at most 1")
    free = [q for q in questions if not q.split]
    if by == "database":
        databases = _assign([q.database for q in free], seed, dev, test)
        drawn = {q.id: databases[q.database] for q in free}
    else:
        drawn = _assign([q.id for q in free], seed, dev, test)
    return {q.id: q.split or drawn[q.id] for q in questions}
