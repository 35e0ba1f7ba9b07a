"""The training service: sessions, runs, samplers and checkpoints, and who owns each.

It turns validated protocol requests into scheduler work and JSON answers. HTTP lives in
`server.api.app`; tensors in `server.engine.engine`. Every lookup is scoped to the caller's owner
id: another key's run is indistinguishable from a run that does not exist.

`TrainingService` is the one object the API and the distributed trainer hold. Each concern
lives in a module of its own and shares the state of `core.ServiceCore`; they are combined
here by inheritance rather than held as separate objects because the distributed trainer
subclasses this class and overrides hooks (`_ordered`, `_check_backlog`, `_register_sampler`,
`sample`, ...) that every concern must go through.
"""

from __future__ import annotations

from server.service.checkpoints import CheckpointRequests
from server.service.errors import (
    USER_ERRORS,
    Backpressure,
    NotFound,
    QuotaExceeded,
    SessionGone,
    SnapshotFreed,
)
from server.service.exports import WeightExports
from server.service.records import Limits, Run, Sampler, Session
from server.service.rest import RestQueries
from server.service.sampling import SamplingRequests
from server.service.sessions import SessionRequests
from server.service.training import TrainingRequests

__all__ = [
    "USER_ERRORS",
    "Backpressure",
    "Limits",
    "NotFound",
    "QuotaExceeded",
    "Run",
    "Sampler",
    "Session",
    "SessionGone",
    "SnapshotFreed",
    "TrainingService",
]


class TrainingService(
    SessionRequests,
    TrainingRequests,
    CheckpointRequests,
    WeightExports,
    SamplingRequests,
    RestQueries,
):
    """Every request the `tinker` SDK can make, each answered by the module of its concern."""
