"""Load the transfer split: hand-written questions with gold SQL over three application databases.

Each database is a DuckDB script in `databases/` (keys declared, rows written by hand) with a
second copy of redrawn values beside it (`<name>-copy.sql`, written by `redraw`): a prediction
is right only where it matches the gold on both, so a scalar or a filter right by luck fails.
Its questions are a YAML file beside this module, tiered like the generated corpus. The split
is never trained on: `load_corpus` serves it only as `transfer`, and a study reads it like test.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml

from rewards import Task
from sqltasks.templates import TIERS

HERE = Path(__file__).resolve().parent
DATABASES = ("helpdesk", "fleet", "mealkit")


def setup_sql(database: str) -> str:
    return (HERE / "databases" / f"{database}.sql").read_text(encoding="utf-8")


def copy_sql(database: str) -> str:
    """The database's second copy: its schema with redrawn values (`redraw`)."""
    return (HERE / "databases" / f"{database}-copy.sql").read_text(encoding="utf-8")


@cache
def load_transfer() -> tuple[Task, ...]:
    """Every transfer task, in file order; ids are `transfer-<database>-<nnn>`."""
    tasks = []
    for database in DATABASES:
        spec = yaml.safe_load((HERE / f"{database}.yaml").read_text(encoding="utf-8"))
        setup, copy = setup_sql(database), copy_sql(database)
        for n, item in enumerate(spec["questions"]):
            if item["tier"] not in TIERS:
                raise ValueError(f"{database} question {n}: unknown tier {item['tier']!r}")
            tasks.append(Task(setup_sql=setup, question=item["question"], gold_sql=item["sql"],
                              extra_setups=(copy,), id=f"transfer-{database}-{n:03d}",
                              domain=database,
                              tier=item["tier"], split="transfer",
                              meta={"source": "transfer", "database": database}))
    return tuple(tasks)
