"""The future store: every submitted request gets an id; `retrieve_future` long-polls it.

Results are set from the engine thread and awaited from the HTTP event loop, so completion is
handed over with `call_soon_threadsafe`. Finished results are kept in the order they finished
and leave that order after a TTL, or oldest first once their bytes pass a memory budget, so a
client that never collects them cannot grow memory without bound; expiry only ever looks at the
oldest entries, never at every record. A future that never finishes (its work was lost with a
restarted stream, say) goes after `UNFINISHED_TTL_SECONDS`.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

LONG_POLL_SECONDS = 20.0
"""Under the SDK's 45 s read timeout, long enough that idle polling costs almost nothing."""
RESULT_TTL_SECONDS = 3600.0
RESULT_BUDGET_BYTES = 512 * 1024 * 1024
"""Finished results held at most, in all; the oldest go first past it."""
UNFINISHED_TTL_SECONDS = 24 * 3600.0


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

    def __init__(self, budget_bytes: int = RESULT_BUDGET_BYTES) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.budget_bytes = budget_bytes
        self._records: dict[str, FutureRecord] = {}
        self._counter = itertools.count(1)
        self._lock = threading.Lock()
        self._finished: collections.OrderedDict[str, int] = collections.OrderedDict()
        """Finished request ids, oldest first, with their results' sizes in bytes."""
        self._created: collections.deque[tuple[float, str]] = collections.deque()
        self.held_bytes = 0

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The HTTP event loop, which completions are handed to."""
        self.loop = loop

    def create(self, owner: str, kind: str) -> FutureRecord:
        """Called by an HTTP handler, on the event loop or on a worker thread after `bind`."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        request_id = f"req-{next(self._counter)}-{kind}"
        record = FutureRecord(request_id, owner, kind)
        with self._lock:
            self._expire()
            self._records[request_id] = record
            self._created.append((record.created, request_id))
        return record

    def get(self, request_id: str) -> FutureRecord | None:
        return self._records.get(request_id)

    def __len__(self) -> int:
        return len(self._records)

    def _finish(self, record: FutureRecord) -> None:
        self._account(record)
        record.done.set()

    def _account(self, record: FutureRecord) -> None:
        """Record that `record` finished, and what its result holds."""
        record.finished_at = time.monotonic()
        size = _size(record)
        with self._lock:
            if record.request_id in self._records and record.request_id not in self._finished:
                self._finished[record.request_id] = size
                self.held_bytes += size
            self._expire()

    def _hand_over(self, record: FutureRecord) -> None:
        """Wake the waiting long-poll; once the server has shut its event loop, nobody waits
        any more, so a result finished during shutdown is simply kept."""
        try:
            self.loop.call_soon_threadsafe(self._finish, record)
        except RuntimeError:  # the event loop is closed: the server is stopping
            self._account(record)

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
        """Drop results past their TTL or the budget, and futures that never finished (called
        with the lock held; looks only at the oldest entries)."""
        now = time.monotonic()
        while self._finished:
            rid, size = next(iter(self._finished.items()))
            record = self._records.get(rid)
            stale = record is None or now - (record.finished_at or now) > RESULT_TTL_SECONDS
            if not stale and self.held_bytes <= self.budget_bytes:
                break
            self._finished.popitem(last=False)
            self.held_bytes -= size
            self._records.pop(rid, None)
        while self._created:
            created, rid = self._created[0]
            if rid in self._finished:
                break  # held until its result expires above
            if rid in self._records and now - created <= UNFINISHED_TTL_SECONDS:
                break
            self._created.popleft()
            self._records.pop(rid, None)


def _size(record: FutureRecord) -> int:
    """Bytes a finished record holds (its result or error), roughly."""
    if record.proto_result is not None:
        return len(record.proto_result) + 256
    if record.json_result is not None:
        return len(json.dumps(record.json_result, default=str)) + 256
    return len(record.error or "") + 256
