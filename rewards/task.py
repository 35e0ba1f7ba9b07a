"""The unit of evaluation: a database, a question and a gold query.

A `Task` carries the DuckDB setup script of its database (DDL and rows) and, optionally, the
scripts of further independently seeded copies of the same schema. A prediction is correct only
if it matches the gold on every copy, which defeats lucky matches on one set of rows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Task:
    """A text-to-SQL task; build one directly from `setup_sql`, `question` and `gold_sql`."""

    setup_sql: str
    question: str
    gold_sql: str
    extra_setups: tuple[str, ...] = ()
    """Setup scripts of further copies of the database with the same schema, other rows."""
    id: str = ""
    domain: str = ""
    tier: str = ""
    split: str = ""
    meta: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)

    def __post_init__(self) -> None:
        if not self.id:
            digest = hashlib.sha1(
                f"{self.setup_sql}\x00{self.question}\x00{self.gold_sql}".encode()
            ).hexdigest()
            object.__setattr__(self, "id", f"task-{digest[:12]}")
        object.__setattr__(self, "extra_setups", tuple(self.extra_setups))

    @property
    def setups(self) -> tuple[str, ...]:
        """All database copies, the first being the one the prompt describes."""
        return (self.setup_sql, *self.extra_setups)


def database_key(setup_sql: str) -> str:
    """A stable name for a database, shared by every task built on the same script."""
    return "db_" + hashlib.sha1(setup_sql.encode()).hexdigest()[:16]
