"""Run-state saves written off the engine thread.

A save used to serialise each run's adapter and optimizer state to the shared storage on the
engine thread, so the accelerator idled for every write (with many resident runs, minutes per
round of saves on a network share). Now the engine thread only copies the state to host memory
between steps, and one background thread writes the copies in the order they were taken: a
run's saves land in step order, and a run's deletion queued after its saves runs after them.
How many copies may wait is bounded, so a slow share makes the engine wait instead of filling
host memory.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

log = logging.getLogger(__name__)

# Host copies waiting to be written; the next save waits for room (memory stays bounded).
MAX_PENDING = 8


def host_copy(value: Any) -> Any:
    """`value` with every tensor copied to host memory: a snapshot the engine may go on
    changing in place (a tensor already on the CPU is copied too, never aliased)."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: host_copy(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(host_copy(v) for v in value)
    return value


class StateWriter:
    """One thread that runs queued writes in order, at most `max_pending` waiting."""

    def __init__(self, max_pending: int = MAX_PENDING):
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="state-writer")
        self._room = threading.BoundedSemaphore(max_pending)
        self._last: Future | None = None
        self._lock = threading.Lock()

    def submit(self, write: Callable[[], Any]) -> Future:
        """Queue `write` after every write queued before it; blocks while the queue is full."""
        self._room.acquire()

        def run() -> Any:
            try:
                return write()
            finally:
                self._room.release()

        with self._lock:
            future = self._pool.submit(run)
            self._last = future
        return future

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every write queued so far has ended; False if `timeout` passed first."""
        with self._lock:
            last = self._last
        if last is None:
            return True
        try:
            last.exception(timeout=timeout)
        except TimeoutError:
            return False
        return True

    def close(self, timeout: float | None = 60.0) -> None:
        if not self.flush(timeout):
            log.warning("run-state writes still pending at shutdown; their runs replay instead")
        self._pool.shutdown(wait=False, cancel_futures=True)
