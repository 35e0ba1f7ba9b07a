"""The future store: every submitted request gets an id; `retrieve_future` long-polls it.

Results are set from the engine thread and awaited from the HTTP event loop, so completion is
handed over with `call_soon_threadsafe`. Results expire after a TTL so a client that never
collects them cannot grow memory without bound.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

LONG_POLL_SECONDS = 20.0
"""Under the SDK's 45 s read timeout, long enough that idle polling costs almost nothing."""
RESULT_TTL_SECONDS = 3600.0


@dataclass
class FutureRecord:
    request_id: str
    owner: str
    kind: str
    created: float = field(default_factory=time.monotonic)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    json_result: dict[str, Any] | None = None
    proto_result: bytes | None = None
    error: str | None = None
    category: str = "user"
    finished_at: float | None = None
    queue_state: str = "active"
    run_id: str | None = None


class FutureStore:
    """In-memory futures for the single-process server."""

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self._records: dict[str, FutureRecord] = {}
        self._counter = itertools.count(1)

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The HTTP event loop, which completions are handed to."""
        self.loop = loop

    def create(self, owner: str, kind: str) -> FutureRecord:
        """Called by an HTTP handler, on the event loop or on a worker thread after `bind`."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        self._expire()
        request_id = f"req-{next(self._counter)}-{kind}"
        record = FutureRecord(request_id, owner, kind)
        self._records[request_id] = record
        return record

    def get(self, request_id: str) -> FutureRecord | None:
        return self._records.get(request_id)

    def _finish(self, record: FutureRecord) -> None:
        record.finished_at = time.monotonic()
        record.done.set()

    def _hand_over(self, record: FutureRecord) -> None:
        """Wake the waiting long-poll; once the server has shut its event loop, nobody waits
        any more, so a result finished during shutdown is simply kept."""
        try:
            self.loop.call_soon_threadsafe(self._finish, record)
        except RuntimeError:  # the event loop is closed: the server is stopping
            record.finished_at = time.monotonic()

    def resolve_json(self, record: FutureRecord, result: dict[str, Any]) -> None:
        record.json_result = result
        self._hand_over(record)

    def resolve_proto(self, record: FutureRecord, payload: bytes) -> None:
        record.proto_result = payload
        self._hand_over(record)

    def fail(self, record: FutureRecord, message: str, category: str = "user") -> None:
        record.error, record.category = message, category
        self._hand_over(record)

    async def wait(self, record: FutureRecord, timeout: float = LONG_POLL_SECONDS) -> bool:
        try:
            await asyncio.wait_for(record.done.wait(), timeout)
        except TimeoutError:
            return False
        return True

    def _expire(self) -> None:
        now = time.monotonic()
        stale = [
            rid
            for rid, rec in self._records.items()
            if rec.finished_at is not None and now - rec.finished_at > RESULT_TTL_SECONDS
        ]
        for rid in stale:
            del self._records[rid]
