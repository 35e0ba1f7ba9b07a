"""Rewards for text-to-SQL: run model SQL in a sandboxed DuckDB and score it against a gold query.

Data flows one way: a completion is reduced to SQL (`extract`), gated and run on every seeded
copy of the task's database inside a locked worker process (`sandbox`, `worker`, `pool`), its
rows are compared with the gold's (`compare`), and the comparison becomes named reward
components and a total under a `RewardConfig` (`score`).
"""

from rewards.compare import COMPARATOR_VERSION, column_overlap, execution_match, row_overlap
from rewards.config import MatchConfig, RewardConfig, RewardWeights, SandboxLimits
from rewards.extract import Extraction, extract, extract_sql
from rewards.pool import RewardPool, ScoringCodeChanged, WorkerStats, score
from rewards.score import Components, ScoreResult
from rewards.sqlinfo import has_top_level_order_by
from rewards.task import Task

__all__ = [
    "COMPARATOR_VERSION",
    "Components",
    "Extraction",
    "MatchConfig",
    "RewardConfig",
    "RewardPool",
    "RewardWeights",
    "SandboxLimits",
    "ScoreResult",
    "ScoringCodeChanged",
    "Task",
    "WorkerStats",
    "column_overlap",
    "execution_match",
    "extract",
    "extract_sql",
    "has_top_level_order_by",
    "row_overlap",
    "score",
]
