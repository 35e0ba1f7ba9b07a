"""Typed configuration for scoring: the reward surface an agent may tune, and the sandbox limits.

`RewardConfig` is what a research agent edits between trials: component weights and comparator
switches. It is bounded and round-trips through JSON/YAML. `SandboxLimits` is the fixed harness:
time, memory and result-size caps a pool applies to every worker; an agent does not tune it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, create_model

from rewards.components import default_weights


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


MAX_WEIGHT = 10.0

RewardWeights = create_model(
    "RewardWeights",
    __base__=_Frozen,
    __doc__="Weight of each score component in the total (fields and defaults from "
    "`rewards.components.Components`, the one list of components).",
    __module__=__name__,
    **{name: (float, Field(weight, ge=0.0, le=MAX_WEIGHT))
       for name, weight in default_weights().items()},
)


class MatchConfig(_Frozen):
    """How a prediction's result is judged equal to the gold's."""

    column_mode: Literal["strict", "perm"] = "perm"
    """`strict` keeps column order; `perm` accepts any column permutation (Spider test-suite)."""
    respect_order: bool = True
    """Compare rows as sequences when the gold's top-level query has ORDER BY."""
    rel_tol: float = Field(1e-6, ge=0.0, le=0.1)
    abs_tol: float = Field(1e-6, ge=0.0, le=1.0)
    all_instances: bool = True
    """Require a match on every seeded copy of the database, not only the first."""


class RewardConfig(_Frozen):
    """Everything that decides a prediction's reward, apart from the sandbox limits."""

    weights: RewardWeights = RewardWeights()
    match: MatchConfig = MatchConfig()
    extract: bool = True
    """Pull the SQL out of a raw completion first; off means the prediction is already SQL."""
    length_budget: float = Field(2.0, ge=1.0, le=20.0)
    """Length credit is 1 up to this many times the gold's length, falling to 0 at twice that."""
    snap_names: bool = False
    """Run the prediction with the table and column names its database lacks replaced by the
    closest ones it has (`rewards/snap.py`): an inference-time repair for evaluation. Leave it
    off for training rewards, which must judge what the model wrote."""
    snap_values: bool = False
    """Run the prediction with each string it compares a text column with replaced by the value
    that column holds which differs only in case, spaces, hyphens or underscores (`'Urgent'`
    where the data says `'urgent'`; `rewards/snap_values.py`): the same kind of repair, for
    values. Off for training rewards, for the same reason."""

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str) -> RewardConfig:
        return cls.model_validate_json(text)


class SandboxLimits(_Frozen):
    """Hard limits for running untrusted SQL; fixed per pool of workers."""

    timeout_s: float = Field(2.0, gt=0.0, le=120.0)
    """Limit for one statement; no further database copy is started once a prediction has
    used this much time, so a prediction takes at most twice this."""
    kill_grace_s: float = Field(1.0, gt=0.0, le=60.0)
    """Extra time, beyond twice `timeout_s`, before the parent kills a worker."""
    prepare_timeout_s: float = Field(120.0, gt=0.0, le=3600.0)
    """Time allowed for trusted work (building databases, running gold queries)."""
    memory_limit_mb: int = Field(256, ge=16, le=65536)
    """DuckDB's own memory limit (soft: large scalar values escape it)."""
    address_space_mb: int = Field(1536, ge=256, le=262144)
    """RLIMIT_AS of each worker process: the hard memory cap."""
    max_rows: int = Field(1000, ge=1, le=1_000_000)
    """A result with more rows is refused as too large."""
    max_sql_chars: int = Field(8000, ge=16, le=1_000_000)
    cached_databases: int = Field(512, ge=1, le=100_000)
    """Databases each worker keeps loaded, least recently used evicted first."""
    cache_memory_fraction: float = Field(0.5, gt=0.0, le=0.9)
    """Share of `memory_limit_mb` cached databases may hold; the rest is for queries."""
