"""How long the server keeps what clients leave behind (the policy is in docs/lifecycle.md).

A shared server runs for weeks; every RL step of every run takes a new sampler snapshot, and
clients vanish without saying goodbye. So each kind of state has a stated end of life:

- dedup records of ordered requests: kept until the run's order is `dedup_window` requests
  past them (long enough to answer a retried submit with its first future, and bounded);
- ephemeral sampler snapshots (`save_weights_and_get_sampling_client` without a name): freed
  when their session ends or expires, when unused for `snapshot_ttl_seconds`, and beyond the
  newest `snapshots_per_run` of their run; a freed one answers a clear error;
- sessions: expire after `session_timeout_seconds` without a heartbeat or request (the SDK
  sends one every 10 s), then count as ended; an ended session's record goes after
  `ended_session_retention_seconds`;
- named checkpoints: kept until deleted or until their TTL, swept every
  `checkpoint_sweep_seconds`.

This module holds the numbers and the bookkeeping of snapshots; the service acts on them.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass

DEFAULT_SNAPSHOTS_PER_RUN = 8
DEFAULT_SNAPSHOT_TTL_SECONDS = 3600.0
DEFAULT_SESSION_TIMEOUT_SECONDS = 300.0
"""30 missed heartbeats: a client busy scoring for minutes never loses its samplers."""


@dataclass
class LifecyclePolicy:
    dedup_window: int = 64
    snapshots_per_run: int | None = DEFAULT_SNAPSHOTS_PER_RUN
    snapshot_ttl_seconds: float | None = DEFAULT_SNAPSHOT_TTL_SECONDS
    session_timeout_seconds: float | None = DEFAULT_SESSION_TIMEOUT_SECONDS
    ended_session_retention_seconds: float = 3600.0
    checkpoint_sweep_seconds: float = 60.0


class SnapshotLedger:
    """Each run's live ephemeral snapshots (oldest first), and why freed ones were freed."""

    def __init__(self, per_run: int | None, remembered: int = 4096):
        self.per_run = per_run
        self._by_run: dict[str, collections.OrderedDict[str, None]] = {}
        self._freed: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._remembered = remembered

    def add(self, run_id: str, sampler_id: str) -> list[str]:
        """Record a new snapshot; returns the run's oldest ones beyond the cap (to free)."""
        snapshots = self._by_run.setdefault(run_id, collections.OrderedDict())
        snapshots[sampler_id] = None
        excess = []
        while self.per_run is not None and len(snapshots) > self.per_run:
            excess.append(snapshots.popitem(last=False)[0])
        return excess

    def remove(self, run_id: str, sampler_id: str, reason: str) -> None:
        snapshots = self._by_run.get(run_id)
        if snapshots is not None:
            snapshots.pop(sampler_id, None)
            if not snapshots:
                del self._by_run[run_id]
        self._freed[sampler_id] = reason
        while len(self._freed) > self._remembered:
            self._freed.popitem(last=False)

    def live(self) -> int:
        return sum(len(s) for s in self._by_run.values())

    def why_freed(self, sampler_id: str) -> str | None:
        return self._freed.get(sampler_id)
