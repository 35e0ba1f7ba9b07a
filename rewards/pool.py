"""A pool of long-lived scoring workers: parallel, bounded in time, and never leaking.

`RewardPool` owns N worker processes (see `rewards.worker`) and one dispatcher thread per
worker. Callers submit (prediction, task) pairs and get futures back; `score_many` blocks for a
list, `ascore_many` awaits one. Each dispatcher sends small batches to its worker, so a group of
samples for the same task travels once, and enforces the kill timeout: a worker that overruns
its budget, crashes or runs out of memory is killed and replaced, and the prediction it was
scoring gets a zero. Workers die with the pool: on `close()`, at interpreter exit, and (through
the kernel's parent-death signal and their closed pipes) when the calling process dies. A
worker whose scoring code differs from what this process loaded (the package changed on disk
under a running pool) is refused, and its jobs raise `ScoringCodeChanged` rather than score.

`score()` is the one-call form, backed by a lazily started single-worker pool.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import itertools
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from rewards import codeversion
from rewards.config import RewardConfig, SandboxLimits
from rewards.score import CRASHED, ScoreResult
from rewards.task import Task

Pair = tuple[str, Task]
"""A prediction (raw completion, or SQL when extraction is off) and the task it answers."""


@dataclass
class _Job:
    job_id: int
    task: Task
    prediction: str
    config: RewardConfig
    future: Future
    attempts: int = 0


@dataclass(frozen=True)
class WorkerStats:
    pid: int
    rss_mb: float
    peak_rss_mb: float
    scored: int
    restarts: int


_STOP = object()


class ScoringCodeChanged(RuntimeError):
    """A new worker loaded other scoring code than its pool's process runs."""


def _import_roots() -> list[str]:
    """Where a fresh interpreter finds this package (and its dependencies) as we do."""
    root = str(Path(__file__).resolve().parent.parent)
    return [root, *[p for p in sys.path if p and p != root]]


def _read_status_mb(pid: int, field: str) -> float:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class _Slot:
    """One worker process and the thread that feeds it."""

    def __init__(self, pool: RewardPool, index: int) -> None:
        self.pool = pool
        self.index = index
        self.process: subprocess.Popen | None = None
        self.connection: Connection | None = None
        self.scored = 0
        self.restarts = -1
        self.started = threading.Event()
        self.live = threading.Event()
        self.start_error: Exception | None = None
        self.thread = threading.Thread(target=self._serve, name=f"reward-slot-{index}", daemon=True)

    def start_worker(self) -> None:
        """Start a fresh interpreter running `rewards.worker`, joined to us by a socket pair.

        Called from this slot's own thread: the kernel's parent-death signal is tied to the
        thread that started the child, and this thread lives exactly as long as the pool.
        """
        self.restarts += 1
        ours, theirs = socket.socketpair()
        code = (
            f"import sys; sys.path[:0] = {_import_roots()!r}; "
            f"from rewards.worker import main; main({theirs.fileno()}, sys.argv[1])"
        )
        try:
            process = subprocess.Popen(
                [sys.executable, "-c", code, self.pool.limits.model_dump_json()],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                close_fds=True,
            )
        finally:
            theirs.close()
        connection = Connection(ours.detach())
        self.process, self.connection = process, connection
        try:
            ready = connection.poll(self.pool.limits.prepare_timeout_s) and connection.recv()
        except (EOFError, OSError):
            ready = None
        if not ready:
            self.kill_worker()
            raise RuntimeError("a scoring worker failed to start")
        if ready[2] != codeversion.LOADED:
            self.kill_worker()
            raise ScoringCodeChanged(
                "the scoring code on disk (the rewards package) changed after this process "
                "loaded it, so a new scoring worker would score with other code; restart the "
                "process (a trial resumes from its last checkpoint)"
            )
        self.live.set()

    def stop_worker(self) -> None:
        self.live.clear()
        process, connection = self.process, self.connection
        self.process = self.connection = None
        if connection is not None:
            connection.close()
        if process is not None:
            try:
                process.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5.0)

    def kill_worker(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        self.stop_worker()

    def _serve(self) -> None:
        try:
            self.start_worker()
        except Exception as error:  # surfaced by the pool's constructor
            self.start_error = error
        self.started.set()
        jobs = self.pool._jobs
        while True:
            first = jobs.get()
            if first is _STOP:
                self.stop_worker()
                return
            batch = [first]
            while len(batch) < self.pool.batch_size:
                try:
                    more = jobs.get_nowait()
                except queue.Empty:
                    break
                if more is _STOP:
                    jobs.put(_STOP)
                    break
                batch.append(more)
            batch = [job for job in batch if job.future.set_running_or_notify_cancel()]
            while batch:
                batch = self._run_batch(batch)
            if self.process is None:  # replace a lost worker now, not when the next job waits
                with contextlib.suppress(Exception):
                    self.start_worker()

    def _run_batch(self, batch: list[_Job]) -> list[_Job]:
        """Score `batch` on the worker; returns the jobs still to do after a kill."""
        if self.process is None:
            try:
                self.start_worker()
            except ScoringCodeChanged as error:  # no score is honest now: the caller must stop
                for job in batch:
                    job.future.set_exception(error)
                return []
            except Exception as error:  # cannot start a worker: fail these jobs, keep serving
                for job in batch:
                    job.future.set_result(
                        ScoreResult.zero(CRASHED, f"worker failed to start: {error}", job.task.id)
                    )
                self.stop_worker()
                return []
        limits = self.pool.limits
        connection = self.connection
        by_id = {job.job_id: job for job in batch}
        pending = list(batch)
        try:
            connection.send([(j.job_id, j.task, j.prediction, j.config) for j in batch])
        except (OSError, ValueError):
            self.kill_worker()
            return pending
        deadline = time.monotonic() + limits.prepare_timeout_s
        armed = False
        while pending:
            died = False
            message = None
            try:
                if connection.poll(max(0.0, deadline - time.monotonic())):
                    message = connection.recv()
            except (EOFError, OSError):
                died = True
            if message is None:
                current = pending.pop(0)
                exitcode = self.process.poll() if self.process else None
                self.kill_worker()
                current.attempts += 1
                if not armed and current.attempts < 2:
                    # The prediction never ran: the worker fell over before it. Try once more.
                    return [current, *pending]
                if died:
                    reason, outcome = f"worker died (exit code {exitcode})", CRASHED
                elif armed:
                    budget = 2 * limits.timeout_s + limits.kill_grace_s
                    reason, outcome = f"worker killed after running past {budget:.1f}s", "timeout"
                else:
                    reason, outcome = "worker killed: preparing the task took too long", CRASHED
                current.future.set_result(ScoreResult.zero(outcome, reason, current.task.id))
                return pending
            kind, job_id = message[0], message[1]
            if kind == "arm":
                armed = True
                deadline = time.monotonic() + 2 * limits.timeout_s + limits.kill_grace_s
                continue
            job = by_id[job_id]
            pending.remove(job)
            result: ScoreResult = message[2]
            if not result.task_id:
                result = dataclasses.replace(result, task_id=job.task.id)
            job.future.set_result(result)
            self.scored += 1
            armed = False
            deadline = time.monotonic() + limits.prepare_timeout_s
            if result.outcome == "memory" or self.process.poll() is not None:
                self.stop_worker()  # the worker exits after a memory error; start afresh
                return pending
        return []


class RewardPool:
    """Long-lived sandboxed workers that score predictions in parallel.

    Use as a context manager, or call `close()`. Submitting is thread-safe.
    """

    def __init__(
        self,
        workers: int | None = None,
        limits: SandboxLimits | None = None,
        config: RewardConfig | None = None,
        batch_size: int = 8,
    ) -> None:
        self.limits = limits or SandboxLimits()
        self.config = config or RewardConfig()
        self.batch_size = max(1, batch_size)
        self._jobs: queue.Queue = queue.Queue()
        self._ids = itertools.count()
        self._closed = False
        self._slots = [_Slot(self, i) for i in range(workers or os.cpu_count() or 1)]
        self._finalizer = weakref.finalize(self, RewardPool._shutdown, self._jobs, self._slots)
        for slot in self._slots:
            slot.thread.start()
        for slot in self._slots:
            slot.started.wait()
        errors = [slot.start_error for slot in self._slots if slot.start_error]
        if errors:
            self.close()
            raise RuntimeError(f"could not start the scoring workers: {errors[0]}")

    @property
    def workers(self) -> int:
        return len(self._slots)

    def submit(self, prediction: str, task: Task, config: RewardConfig | None = None) -> Future:
        """Queue one prediction; the future resolves to its `ScoreResult`."""
        if self._closed:
            raise RuntimeError("the reward pool is closed")
        future: Future = Future()
        self._jobs.put(_Job(next(self._ids), task, prediction, config or self.config, future))
        return future

    def submit_many(
        self, pairs: Iterable[Pair], config: RewardConfig | None = None
    ) -> list[Future]:
        return [self.submit(prediction, task, config) for prediction, task in pairs]

    def score_many(
        self, pairs: Iterable[Pair], config: RewardConfig | None = None
    ) -> list[ScoreResult]:
        """Score every pair, in parallel across workers; results in input order."""
        return [future.result() for future in self.submit_many(pairs, config)]

    async def ascore_many(
        self, pairs: Iterable[Pair], config: RewardConfig | None = None
    ) -> list[ScoreResult]:
        """`score_many` for asyncio callers; the event loop stays free while workers run."""
        futures = [asyncio.wrap_future(f) for f in self.submit_many(pairs, config)]
        return list(await asyncio.gather(*futures))

    def score(self, prediction: str, task: Task, config: RewardConfig | None = None) -> ScoreResult:
        return self.submit(prediction, task, config).result()

    def stats(self) -> list[WorkerStats]:
        """Memory (resident now and at peak) and work done per worker."""
        out = []
        for slot in self._slots:
            process = slot.process
            pid = process.pid if process is not None else 0
            out.append(
                WorkerStats(
                    pid=pid or 0,
                    rss_mb=_read_status_mb(pid, "VmRSS") if pid else 0.0,
                    peak_rss_mb=_read_status_mb(pid, "VmHWM") if pid else 0.0,
                    scored=slot.scored,
                    restarts=slot.restarts,
                )
            )
        return out

    def ready(self, timeout: float | None = None) -> bool:
        """Wait until every worker is up (for example after one was replaced)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for slot in self._slots:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not slot.live.wait(remaining):
                return False
        return True

    def worker_pids(self) -> list[int]:
        return [s.process.pid for s in self._slots if s.process is not None and s.process.pid]

    def close(self) -> None:
        """Stop the workers; queued jobs not yet started are cancelled."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()

    @staticmethod
    def _shutdown(jobs: queue.Queue, slots: Sequence[_Slot]) -> None:
        while True:
            try:
                job = jobs.get_nowait()
            except queue.Empty:
                break
            if job is not _STOP:
                job.future.cancel()
        for _ in slots:
            jobs.put(_STOP)
        for slot in slots:
            if slot.thread.is_alive():
                slot.thread.join(timeout=30.0)
            slot.kill_worker() if slot.thread.is_alive() else slot.stop_worker()

    def __enter__(self) -> RewardPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_default_pool: RewardPool | None = None
_default_lock = threading.Lock()


def _shared_pool() -> RewardPool:
    global _default_pool
    with _default_lock:
        if _default_pool is None or _default_pool._closed:
            _default_pool = RewardPool(workers=1)
            atexit.register(_default_pool.close)
        return _default_pool


def score(prediction: str, task: Task, config: RewardConfig | None = None) -> ScoreResult:
    """Score one prediction in the sandbox (a shared single-worker pool, started on first use)."""
    return _shared_pool().score(prediction, task, config)
