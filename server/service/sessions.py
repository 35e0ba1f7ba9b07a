"""Sessions, heartbeats and the lifecycle hooks run while the engine is idle."""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from server.service import session_search
from server.service.core import ServiceCore
from server.service.errors import SessionGone
from server.service.records import Session, str_metadata
from server.service.request_fields import metadata, short_text, tags

log = logging.getLogger(__name__)


class SessionRequests(ServiceCore):
    """Sessions: created, kept alive by heartbeats, ended or expired, listed and searched."""

    def _maintain(self) -> None:
        busy = {rid for rid, depth in self.scheduler.queue_depths().items() if depth}
        self.residency.evict_idle(busy)
        self._expire_sessions()
        self._spill_ended_runs(busy)
        self._expire_snapshots()
        if time.monotonic() - self._last_sweep >= self.policy.checkpoint_sweep_seconds:
            self._last_sweep = time.monotonic()
            for path in self.store.expire():
                self.adapters.drop(path)

    def _expire_sessions(self) -> None:
        """End sessions that stopped heartbeating; forget ended ones after their retention."""
        timeout, now = self.policy.session_timeout_seconds, time.monotonic()
        for session in list(self.sessions.values()):
            if session.finished is None and timeout is not None:
                if now - session.last_seen > timeout:
                    log.info("session %s expired (no heartbeat for %.0f s)",
                             session.session_id, now - session.last_seen)
                    self._end_session(session, "expired")
            elif (
                session.ended_at is not None
                and now - session.ended_at > self.policy.ended_session_retention_seconds
            ):
                self._drop_session(session)

    def _drop_session(self, session: Session) -> None:
        """An ended session past its retention: its runs are freed and its record goes."""
        for run_id in list(session.run_ids):
            self._free_run(run_id, f"its session {session.session_id} ended")
        with self._lock:
            self.sessions.pop(session.session_id, None)

    def _spill_ended_runs(self, busy: set[str]) -> None:
        """An ended session's runs leave memory at once (adapter and AdamW state to a spill
        file, from which a request still reloads them) and are freed after the retention."""
        for session in list(self.sessions.values()):
            if session.ended_at is None:
                continue
            for run_id in session.run_ids:
                run = self.runs.get(run_id)
                if run is not None and run.state is not None and run_id not in busy:
                    self.residency.evict(run)

    def _free_run(self, run_id: str, reason: str) -> None:
        """Forget a run entirely (its checkpoints and run record on disk stay): its stream,
        dedup records, resident state and spill file. Runs on the engine thread."""
        run = self._retire_run(run_id, f"training run {run_id} was freed because {reason}")
        if run is None:
            return
        self.residency.forget(run)
        log.info("freed run %s: %s", run_id, reason)

    def _end_session(self, session: Session, reason: str) -> None:
        """An ended session's samplers go (snapshots and all); its runs and checkpoints stay."""
        session.finished = session.finished or reason
        session.ended_at = session.ended_at or time.monotonic()
        for sampler_id in list(session.sampler_ids):
            self._free_sampler(sampler_id, f"its session {session.session_id} ended ({reason})")

    def _expire_snapshots(self) -> None:
        ttl = self.policy.snapshot_ttl_seconds
        if ttl is None:
            return
        cutoff = time.monotonic() - ttl
        stale = [s.sampler_id for s in list(self.samplers.values())
                 if s.run_id is not None and s.last_used < cutoff]
        for sampler_id in stale:
            self._free_sampler(sampler_id, f"it was unused for {ttl:.0f} s")

    def create_session(self, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        session_id = f"sess-{uuid.uuid4().hex[:12]}"
        self.sessions[session_id] = self._new_session(session_id, owner, body)
        return {"session_id": session_id, "type": "create_session"}

    @staticmethod
    def _new_session(session_id: str, owner: str, body: dict[str, Any]) -> Session:
        return Session(
            session_id,
            owner,
            tags(body.get("tags")),
            metadata(body.get("user_metadata")),
            display_name=short_text(body.get("display_name"), "display_name"),
        )

    def heartbeat(self, owner: str, session_id: str) -> dict[str, Any]:
        session = self._session(owner, session_id)
        if session.finished is not None:
            raise SessionGone(f"session {session_id} has ended ({session.finished})")
        session.last_seen = time.monotonic()
        return {"type": "session_heartbeat"}

    def finish_session(self, owner: str, session_id: str, reason: str) -> dict[str, Any]:
        self._end_session(self._session(owner, session_id), reason)
        return {"status": "ok"}

    def list_sessions(self, owner: str, limit: int, offset: int) -> dict[str, Any]:
        ids = [sid for sid, s in self.sessions.items() if s.owner == owner]
        return {"sessions": ids[offset : offset + limit]}

    def search_sessions(self, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        def checkpoints_of(session: Any) -> int:
            return sum(len(self.store.list(rid)) for rid in session.run_ids
                       if self.store.read_run(rid) is not None)

        return session_search.search(list(self.sessions.values()), owner, body, checkpoints_of)

    def get_session(self, owner: str, session_id: str) -> dict[str, Any]:
        session = self._session(owner, session_id)
        return {
            "training_run_ids": list(session.run_ids),
            "sampler_ids": list(session.sampler_ids),
            "user_metadata": str_metadata(session.user_metadata),
        }
