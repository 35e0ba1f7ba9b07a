"""The sampler worker: sampling jobs from Redis, run on any backend, results written once.

A job names its adapter by an immutable snapshot directory (`snapshots.py`), never by a run, so
a sampler can cache adapters by path and never serves weights that changed under it. Jobs move
atomically from the shared queue to this worker's processing list and leave it only after their
result is stored; a worker that dies leaves them there, and another worker moves them back.

A backend is any object with `sample(jobs: list[SampleJob]) -> list[SampleResult]`: the torch
`Engine` by default. Each job's `adapter` is a `StoredAdapter`, whose `path` is the snapshot.
The torch engine decodes a batch together, so the worker gathers a burst and samples it as one;
a backend that says it `streams` (vLLM, which batches continuously on its own) gets each job
as it is taken, up to `max_in_flight` at once, and each result is stored when it comes, so no
job waits for a batch to gather or for the slowest job of its batch.
"""

from __future__ import annotations

import collections
import json
import logging
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from server.distributed.snapshots import StoredAdapter, load_snapshot
from server.distributed.store import Store, encode_result
from server.engine.engine import SampleJob, SamplingParams, UserError
from server.engine.engine_thread import EngineThread, start_loop
from server.protocol.codec import SampleResult, encode_sample_response
from server.protocol.futures import RESULT_TTL_SECONDS
from server.samplers.openai_http import VLLMUnavailable
from server.scheduling.scheduler import SAMPLE_GATHER_SECONDS, SAMPLE_QUIET_SECONDS

log = logging.getLogger(__name__)


ALL_MODULES = "*"
"""What a backend without `servable_modules` (the torch engine) serves: every LoRA module."""


UNAVAILABLE_GRACE_SECONDS = 30.0
"""How long a backend may be unreachable (vLLM restarting) before this worker steps aside."""


def _unavailable(exc: BaseException) -> bool:
    """Whether a failure means the backend cannot be reached (retry later), not a bad job."""
    if isinstance(exc, VLLMUnavailable):
        return True
    outcomes = getattr(exc, "outcomes", None)
    failures = [o for o in outcomes or [] if isinstance(o, BaseException)]
    return bool(failures) and all(isinstance(f, VLLMUnavailable) for f in failures)


class SamplingBackend(Protocol):
    def sample(self, jobs: list[SampleJob]) -> list[SampleResult]: ...


MIN_BLOCK_SECONDS = 0.002
"""The shortest blocking wait asked of Redis (its timeouts count whole milliseconds)."""


def served_modules(raw: bytes | str | None) -> frozenset[str]:
    """The modules a sampler worker advertised (`ALL_MODULES` if it named none)."""
    if not raw:
        return frozenset({ALL_MODULES})
    return frozenset(json.loads(raw))


class SamplerWorker:
    def __init__(self, store: Store, backend: SamplingBackend, device: Any = "cpu",
                 worker_id: str | None = None, heartbeat_ttl: float = 10.0,
                 max_rows: int = 64, cached_adapters: int = 16,
                 quiet_seconds: float = SAMPLE_QUIET_SECONDS,
                 gather_seconds: float = SAMPLE_GATHER_SECONDS, max_in_flight: int = 32):
        self.store = store
        self.keys = store.keys
        self.backend = backend
        self.device = device
        self.worker_id = worker_id or f"sampler-{uuid.uuid4().hex[:8]}"
        self.heartbeat_ttl = heartbeat_ttl
        self.max_rows = max_rows
        self.cached_adapters = cached_adapters
        self.quiet_seconds, self.gather_seconds = quiet_seconds, gather_seconds
        """A burst that finds this worker idle is gathered until `quiet_seconds` pass without
        a new job, `gather_seconds` at most (the scheduler's window): one client's requests
        reach the queue over some milliseconds, and taking only the first would decode the
        rest in a second batch at part width. Jobs that queued while it was busy go at once."""
        self.processing = self.keys.samples_processing(self.worker_id)
        servable = getattr(backend, "servable_modules", None)
        self.modules = sorted(servable) if servable is not None else [ALL_MODULES]
        self._adapters: collections.OrderedDict[str, StoredAdapter] = collections.OrderedDict()
        self._stop = threading.Event()
        self._threads: list[threading.Thread | EngineThread] = []
        self._unavailable_since = 0.0
        self._connected_since: float | None = None
        self.streams = bool(getattr(backend, "streams", False))
        self.max_in_flight = max_in_flight
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._jobs = (ThreadPoolExecutor(max_in_flight, thread_name_prefix="sampler-job")
                      if self.streams else None)
        self._stranded: set[str] = set()
        """Streamed jobs whose return to the queue failed (Redis away): retried by the loop."""
        self._stranded_lock = threading.Lock()
        self._in_flight: set[str] = set()

    # ------------------------------------------------------------ lifecycle
    def start(self) -> SamplerWorker:
        self.reclaim(include_own=True)
        # A torch engine's loop runs on the thread that loaded its model.
        self._threads.append(start_loop(self.backend, self._loop, "sampler"))
        heartbeat = threading.Thread(target=self._heartbeat, name="heartbeat", daemon=True)
        heartbeat.start()
        self._threads.append(heartbeat)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        if self._jobs is not None:
            self._jobs.shutdown(wait=True)
        self.store.redis.delete(self.keys.alive("sampler", self.worker_id))
        self.store.redis.srem(self.keys.members("sampler"), self.worker_id)

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        alive = all(t.is_alive() for t in self._threads) and bool(self._threads)
        backend_down = bool(self._unavailable_since) and (
            time.monotonic() - self._unavailable_since > UNAVAILABLE_GRACE_SECONDS)
        return alive and not backend_down, {"worker_id": self.worker_id,
                                            "backend_unavailable": backend_down}

    def _heartbeat(self) -> None:
        while True:
            try:
                if not self.readiness()[0]:
                    self.store.redis.delete(self.keys.alive("sampler", self.worker_id))
                else:
                    # What it serves first, so a trainer never sees it alive without it.
                    self.store.redis.set(self.keys.sampler_modules(self.worker_id),
                                         json.dumps(self.modules),
                                         px=int(self.heartbeat_ttl * 2000))
                    self.store.heartbeat("sampler", self.worker_id, self.heartbeat_ttl)
                self._connected_since = self._connected_since or time.monotonic()
                self.reclaim()
            except Exception:  # noqa: BLE001 - a Redis hiccup must not stop the heartbeat
                self._connected_since = None
                log.exception("sampler heartbeat failed")
            if self._stop.wait(self.heartbeat_ttl / 4):
                return

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once(block_seconds=1.0)
            except Exception:  # noqa: BLE001 - jobs stay taken and are retried
                log.exception("sampling batch failed")
                self._stop.wait(1.0)
                try:  # jobs whose taking was lost with Redis go back (results are write-once)
                    if self.streams:
                        self._requeue_untended()
                    else:
                        self.reclaim(include_own=True)
                except Exception:  # noqa: BLE001 - Redis still away: the next failure retries
                    log.warning("Redis unavailable; jobs stay taken for now")

    def reclaim(self, include_own: bool = False) -> int:
        """Move jobs of dead samplers (and this worker's earlier life) back to the queue.
        Another's only once this worker has reached Redis for a heartbeat's TTL: after a Redis
        outage every heartbeat has lapsed, and the live samplers need that long to renew."""
        settled = (self._connected_since is not None
                   and time.monotonic() - self._connected_since >= self.heartbeat_ttl)
        if not settled and not include_own:
            return 0
        live = set(self.store.live_workers("sampler"))
        members = {m.decode() for m in self.store.redis.smembers(self.keys.members("sampler"))}
        dead = ({m for m in members if m not in live and m != self.worker_id} if settled
                else set())
        if include_own:
            dead.add(self.worker_id)
        moved = 0
        for worker in dead:
            source = self.keys.samples_processing(worker)
            while self.store.redis.lmove(source, self.keys.samples, "LEFT", "RIGHT") is not None:
                moved += 1
            if worker != self.worker_id:
                self.store.redis.srem(self.keys.members("sampler"), worker)
        if moved:
            log.info("requeued %d sampling jobs of %s", moved, sorted(dead))
        return moved

    # ---------------------------------------------------------------- work
    def _take(self, block_seconds: float) -> list[str]:
        redis = self.store.redis
        first = redis.lmove(self.keys.samples, self.processing, "RIGHT", "LEFT")
        fresh = first is None  # nothing queued: what comes next begins a burst
        if fresh and block_seconds > 0:
            first = redis.blmove(self.keys.samples, self.processing, block_seconds, "RIGHT", "LEFT")
        if first is None:
            return []
        taken = [first.decode()]
        opened = last = time.monotonic()
        while len(taken) < self.max_rows:
            more = redis.lmove(self.keys.samples, self.processing, "RIGHT", "LEFT")
            if more is None and fresh:
                wait = min(last + self.quiet_seconds, opened + self.gather_seconds)
                wait -= time.monotonic()
                if wait >= MIN_BLOCK_SECONDS:  # Redis reads a timeout that rounds to 0 as "forever"
                    more = redis.blmove(self.keys.samples, self.processing, wait, "RIGHT", "LEFT")
            if more is None:
                break
            taken.append(more.decode())
            last = time.monotonic()
        return taken

    def _adapter(self, path: str | None) -> StoredAdapter | None:
        if path is None:
            return None
        if path in self._adapters:
            self._adapters.move_to_end(path)
            return self._adapters[path]
        adapter = load_snapshot(Path(path), self.device)
        self._adapters[path] = adapter
        while len(self._adapters) > self.cached_adapters:
            self._adapters.popitem(last=False)
        return adapter

    def _job(self, spec: dict[str, Any]) -> SampleJob:
        return SampleJob(self._adapter(spec["adapter"]), list(spec["prompt"]),
                         int(spec["num_samples"]), SamplingParams(**spec["params"]),
                         prompt_logprobs=bool(spec["prompt_logprobs"]),
                         topk_prompt_logprobs=int(spec["topk_prompt_logprobs"]),
                         topk_sample_logprobs=int(spec["topk_sample_logprobs"]),
                         # A payload queued by a gateway from before the field scores it all.
                         prompt_logprobs_last_n=spec.get("prompt_logprobs_last_n"))

    def _load(self, job_id: str, raw: bytes | None) -> SampleJob | None:
        """A taken job's spec as a job; None when there is nothing to sample (already done by
        a worker that died before acknowledging: acknowledged now; a spec that cannot load,
        such as a deleted snapshot: answered with the error)."""
        if raw is None:
            self._ack(job_id)
            return None
        try:
            return self._job(json.loads(raw))
        except Exception as exc:  # noqa: BLE001 - the error is this job's answer
            self._finish(job_id, encode_result(error=f"could not load job: {exc}",
                                               category="server"))
            return None

    def run_once(self, block_seconds: float = 0.0) -> int:
        """Take up to `max_rows` jobs, sample them together, store their results (a streaming
        backend: take one job and start it, see `_stream_once`)."""
        if self.streams:
            return self._stream_once(block_seconds)
        taken = self._take(block_seconds)
        if not taken:
            return 0
        raws = self.store.redis.mget([self.keys.sample(job_id) for job_id in taken])
        jobs = [(job_id, job) for job_id, raw in zip(taken, raws, strict=True)
                if (job := self._load(job_id, raw)) is not None]
        self._sample(jobs)
        return len(taken)

    def _sample(self, jobs: list[tuple[str, SampleJob]]) -> None:
        if not jobs:
            return
        try:
            results = self.backend.sample([job for _, job in jobs])
        except Exception as exc:  # noqa: BLE001 - every failure goes back to its caller
            if len(jobs) > 1:  # one bad job must not fail the others
                for one in jobs:
                    self._sample([one])
                return
            if _unavailable(exc):
                # vLLM restarting: the job stays taken and goes back to the queue (`_loop`);
                # meanwhile this worker reports not ready, so trainers sample if it persists.
                self._unavailable_since = self._unavailable_since or time.monotonic()
                raise
            category = "user" if isinstance(exc, UserError | ValueError) else "server"
            log.warning("sampling %s failed: %s", jobs[0][0], exc)
            self._finish(jobs[0][0], encode_result(error=str(exc) or type(exc).__name__,
                                                   category=category))
            return
        self._unavailable_since = 0.0
        for (job_id, _), result in zip(jobs, results, strict=True):
            self._finish(job_id, encode_result(proto=encode_sample_response(result)))
        self.store.redis.hincrby(self.keys.stats, f"sampled:{self.worker_id}", len(jobs))

    # ------------------------------------------------------------ streaming
    def _stream_once(self, block_seconds: float) -> int:
        """Wait for a free slot, take one job and start it on the job pool; 1 if one started."""
        self._requeue_stranded()
        if not self._slots.acquire(timeout=max(block_seconds, 0.0)):
            return 0
        started = False
        try:
            redis = self.store.redis
            taken = redis.lmove(self.keys.samples, self.processing, "RIGHT", "LEFT")
            if taken is None and block_seconds > 0:
                taken = redis.blmove(self.keys.samples, self.processing, block_seconds,
                                     "RIGHT", "LEFT")
            if taken is None:
                return 0
            job_id = taken.decode()
            job = self._load(job_id, redis.get(self.keys.sample(job_id)))
            if job is None:
                return 1
            with self._stranded_lock:
                self._in_flight.add(job_id)
            self._jobs.submit(self._stream_job, job_id, job)  # type: ignore[union-attr]
            started = True
            return 1
        finally:
            if not started:
                self._slots.release()

    def _stream_job(self, job_id: str, job: SampleJob) -> None:
        """One streamed job to its stored result; if the backend is unavailable (vLLM
        restarting) or Redis fails, the job goes back to the front of the queue."""
        try:
            self._sample([(job_id, job)])
        except Exception as exc:  # noqa: BLE001 - the job is retried, never lost
            if not _unavailable(exc):
                log.exception("sampling %s failed; it goes back to the queue", job_id)
            self._requeue(job_id)
            self._stop.wait(1.0)  # the backend is away: do not spin on the queue
        finally:
            with self._stranded_lock:
                self._in_flight.discard(job_id)
            self._slots.release()

    def _requeue(self, job_id: str) -> None:
        try:
            pipe = self.store.redis.pipeline(transaction=True)
            pipe.lrem(self.processing, 0, job_id)
            pipe.rpush(self.keys.samples, job_id)  # taken from the right: next in line
            pipe.execute()
        except Exception:  # noqa: BLE001 - Redis away: the loop retries
            with self._stranded_lock:
                self._stranded.add(job_id)

    def _requeue_untended(self) -> None:
        """This worker's taken jobs that no job thread holds (a taking whose reply was lost
        with Redis) go back to the queue; jobs in flight stay."""
        with self._stranded_lock:
            in_flight = set(self._in_flight)
        for raw in self.store.redis.lrange(self.processing, 0, -1):
            if raw.decode() not in in_flight:
                self._requeue(raw.decode())

    def _requeue_stranded(self) -> None:
        with self._stranded_lock:
            stranded, self._stranded = self._stranded, set()
        for job_id in stranded:
            self._requeue(job_id)

    def _finish(self, job_id: str, value: bytes) -> None:
        self.store.publish_once(self.keys.result(job_id), value, int(RESULT_TTL_SECONDS))
        self.store.redis.expire(self.keys.future(job_id), int(RESULT_TTL_SECONDS))
        self._ack(job_id)

    def _ack(self, job_id: str) -> None:
        pipe = self.store.redis.pipeline(transaction=True)
        pipe.lrem(self.processing, 0, job_id)
        pipe.delete(self.keys.sample(job_id))
        pipe.execute()
