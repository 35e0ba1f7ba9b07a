"""Bounded device memory: idle training runs are spilled to disk and come back on demand.

A run's adapter, its accumulated gradients and its AdamW state are written to one file and
dropped from memory when the run has been idle longer than a TTL, or when more runs are
resident than the configured cap (least recently used first, never one that the batch about to
run needs). The next request for that run reloads it bit for bit. Everything here runs on the
engine thread, so a run is never moved while the engine is using it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

from server.engine.engine import Engine, RunState
from server.observability.metrics import ServerMetrics
from server.storage.spill import (
    adapter_from_payload,
    adapter_payload,
    read_spill,
    spill_path,
    write_spill,
)

log = logging.getLogger(__name__)


class Resident(Protocol):
    run_id: str
    state: RunState | None
    spill_path: Path | None
    last_used: float


class Residency:
    def __init__(
        self,
        engine: Engine,
        spill_dir: Path,
        metrics: ServerMetrics,
        max_resident: int | None = None,
        idle_seconds: float | None = None,
    ):
        self.engine = engine
        self.spill_dir = spill_dir
        self.metrics = metrics
        self.max_resident = max_resident
        self.idle_seconds = idle_seconds
        self.spill_dir.mkdir(parents=True, exist_ok=True)
        self._resident: dict[str, Resident] = {}
        self.evictions = 0

    @property
    def resident_count(self) -> int:
        return len(self._resident)

    def adopt(self, run: Resident, pinned: Iterable[str] = ()) -> None:
        """A run whose state was just created or loaded is resident now."""
        run.last_used = time.monotonic()
        self._resident[run.run_id] = run
        self._enforce_cap(pinned={run.run_id, *pinned})
        self._publish()

    def touch(self, run: Resident, pinned: Iterable[str] = ()) -> RunState:
        """The run's state, reloaded from disk first if it was evicted."""
        run.last_used = time.monotonic()
        if run.state is None:
            if run.spill_path is None:
                raise LookupError(f"training run {run.run_id} has no weights loaded")
            run.state = self._reload(run.spill_path)
            run.spill_path.unlink(missing_ok=True)
            run.spill_path = None
            self.adopt(run, pinned)
        return run.state

    def forget(self, run: Resident) -> None:
        self._resident.pop(run.run_id, None)
        run.state = None
        if run.spill_path is not None:
            run.spill_path.unlink(missing_ok=True)
            run.spill_path = None
        self._publish()

    def evict_idle(self, busy: Iterable[str] = ()) -> int:
        """Spill runs idle for longer than the TTL (never ones with queued work)."""
        if self.idle_seconds is None:
            return 0
        busy = set(busy)
        cutoff = time.monotonic() - self.idle_seconds
        idle = [r for r in self._resident.values() if r.last_used < cutoff and r.run_id not in busy]
        for run in idle:
            self.evict(run)
        return len(idle)

    def evict(self, run: Resident) -> None:
        if run.state is None:
            return
        run.spill_path = self._spill(run.run_id, run.state)
        run.state = None
        self._resident.pop(run.run_id, None)
        self._publish()  # the gauge first: whoever sees the eviction counted sees the run gone
        self.evictions += 1
        self.metrics.evictions.inc()
        log.info("evicted run %s to %s", run.run_id, run.spill_path)

    def _enforce_cap(self, pinned: set[str]) -> None:
        if self.max_resident is None:
            return
        while len(self._resident) > self.max_resident:
            candidates = [r for r in self._resident.values() if r.run_id not in pinned]
            if not candidates:
                return  # one batch needs more runs than the cap: allowed until it finishes
            self.evict(min(candidates, key=lambda r: r.last_used))

    def _publish(self) -> None:
        self.metrics.resident_adapters.set(len(self._resident))

    # ------------------------------------------------------------ spill files
    def _spill(self, run_id: str, state: RunState) -> Path:
        adapter = state.adapter
        payload = {
            **adapter_payload(adapter),
            "grad_a": {k: v.grad.cpu() for k, v in adapter.a.items() if v.grad is not None},
            "grad_b": {k: v.grad.cpu() for k, v in adapter.b.items() if v.grad is not None},
            "optimizer": state.optimizer.state_dict(),
            "steps": state.steps,
        }
        return write_spill(payload, spill_path(self.spill_dir, run_id))

    def _reload(self, path: Path) -> RunState:
        payload = read_spill(path, self.engine.device)
        adapter = adapter_from_payload(payload)
        state = self.engine.restore_run(adapter, payload["optimizer"])
        for name, grad in payload["grad_a"].items():
            adapter.a[name].grad = grad.to(adapter.a[name].device)
        for name, grad in payload["grad_b"].items():
            adapter.b[name].grad = grad.to(adapter.b[name].device)
        state.steps = payload["steps"]
        return state
