"""The named parts of a reward, declared once: each field is a component, its docstring says
what it measures, and its `weight` metadata is its default weight in the total.

`RewardWeights` (the tunable weights, `rewards.config`) is built from these fields, so a new
component is one field here and appears in the weights, the total and every report at once.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


def component(default_weight: float) -> Any:
    """A component field: value 0 until scored, with its default weight in the total."""
    return field(default=0.0, metadata={"weight": default_weight})


@dataclass(frozen=True)
class Components:
    """Named parts of a reward, each in [0, 1].

    The default weights follow the robust Arctic-style reward: execution match dominates and a
    small bonus rewards SQL that runs. Partial credit is off by default because published runs
    saw policies farm it.
    """

    format: float = component(0.0)
    """The completion starts with the query (or its code fence): no prose before it."""
    parses: float = component(0.0)
    """One statement that sqlglot parses."""
    executes: float = component(0.1)
    """Ran without error on every database copy."""
    result: float = component(1.0)
    """Execution match on every copy: the verdict."""
    columns: float = component(0.0)
    """Share of gold columns reproduced, averaged over copies; 1 when correct."""
    rows: float = component(0.0)
    """F1 of the row multisets, averaged over copies; 1 when correct."""
    overlap: float = component(0.0)
    """For a wrong result that runs: how close it is to the gold's (`compare.result_overlap`:
    paired columns' F1 times the F1 of the rows on them), so a near miss outranks a far one
    while `SELECT *` or a query returning every row earns little; 1 when correct."""
    length: float = component(0.0)
    """For SQL that runs: 1 within the length budget relative to the gold, falling linearly to
    0 at twice it."""
    schema_linking: float = component(0.0)
    """Schema linking (`rewards.schema_linking`): real tables and columns named, the gold's
    tables and joins chosen; graded even when the query fails. Computed only when weighted
    (it parses both queries), so it reads 0 at weight 0."""

    def total(self, weights: Any) -> float:
        """The weighted sum under `weights` (a `RewardWeights`, which has the same fields)."""
        return sum(value * getattr(weights, name) for name, value in self.as_dict().items())

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def component_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(Components))


def default_weights() -> dict[str, float]:
    return {f.name: f.metadata["weight"] for f in fields(Components)}
