"""The trainer worker: the single-process service, fed with ops from Redis.

`DistributedService` is `TrainingService` with what a restartable worker needs on top: ids
derived from op ids (so replays address the same sessions and futures), run-state saves every
few optimizer steps, adapter snapshots for sampler workers, and sampling routed to them when one
is alive. `TrainerWorker` holds the trainer lease (one trainer at a time), replays the journal
on start, then takes ops one by one (BLMOVE to the processing list), runs each through the
ordinary FastAPI app in process, journals and acknowledges it in one transaction, and publishes
the reply. Its heartbeat key expires unless the engine keeps coming round.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import shutil
import threading
import time
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

from server.api.app import create_app
from server.api.auth import AuthError
from server.distributed.journal import (
    RunStateSaves,
    SavePoint,
    Target,
    classify,
    log_entry,
    normalize,
    parse_entry,
    parse_json,
)
from server.distributed.sampler import SamplerWorker
from server.distributed.snapshots import load_snapshot, snapshot_checkpoint, write_snapshot
from server.distributed.store import (
    REPLY_TTL_SECONDS,
    RedisFutureStore,
    Store,
    encode_reply,
)
from server.engine.engine import Engine
from server.scheduling.scheduler import Work
from server.service.service import NotFound, Sampler, Session, TrainingService
from server.storage.checkpoints import CheckpointStore, TinkerPath

log = logging.getLogger(__name__)

RENEW_LEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""
_LOCAL = object()
FAULT_REPLY_TTL_SECONDS = 30


def control_session(op_id: str, path: str, body: bytes) -> str | None:
    """The session a control op belongs to: the one it creates (ids derive from the op id),
    the one its body names, or the one in its path (finish, delete of one of its runs)."""
    if path == "/create_session":
        return f"sess-{op_id.removeprefix('op-')[:12]}"
    if path.startswith("/sessions/"):
        return path.split("/")[2]
    if path.startswith("/training_runs/"):
        return path.split("/")[2].split(":", 1)[0]
    session_id = parse_json(body).get("session_id")
    return session_id if isinstance(session_id, str) else None


class TrustedOwner:
    """The in-process app's key ring: gateways authenticated the caller and pass its owner id.

    This app is never served over the network; the worker's port serves health only.
    """

    open = False

    def authenticate(self, owner: str | None) -> str:
        if not owner:
            raise AuthError("missing X-API-Key header")
        return owner


class DistributedService(TrainingService):
    sampler_is_engine = False  # sampler workers run their own backend (vLLM on a cluster)

    def __init__(self, engine: Engine, checkpoints: CheckpointStore, futures: RedisFutureStore,
                 store: Store, save_every: int = 4, **kwargs: Any):
        super().__init__(engine, checkpoints, futures, **kwargs)
        self.redis = store
        self.keys = store.keys
        self.data_dir = checkpoints.root
        self.saves = RunStateSaves(self.data_dir)
        self.save_every = max(1, save_every)
        self.replaying = False
        self.remote_sampled = False
        self._steps: collections.Counter[str] = collections.Counter()
        self._unsequenced: dict[str, list[str]] = collections.defaultdict(list)
        self._sampler_dirs: dict[str, Path] = {}
        self._route: object = _LOCAL
        self._samplers_checked = (0.0, False)
        self._submit_local_sample = self.scheduler.submit_sample
        self.scheduler.submit_sample = self._route_sample  # type: ignore[method-assign]

    @property
    def current_op(self) -> str | None:
        return self.futures.current_op  # type: ignore[attr-defined]

    # ---------------------------------------------------- deterministic ids
    def create_session(self, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        op = self.current_op or uuid.uuid4().hex
        session_id = f"sess-{op.removeprefix('op-')[:12]}"
        self.sessions[session_id] = self._new_session(session_id, owner, body)
        return {"session_id": session_id, "type": "create_session"}

    # ------------------------------------------------------------ lifecycle
    def _free_run(self, run_id: str, reason: str) -> None:
        """A freed run's journal goes with it: its log, its ops and its saved state."""
        super()._free_run(run_id, reason)
        self._forget_run_journal(run_id)

    def _forget_run_journal(self, run_id: str) -> None:
        key = self.keys.run_log(run_id)
        entries = self.redis.redis.lrange(key, 0, -1)
        self.redis.redis.delete(key, *(self.keys.op(parse_entry(e)[0]) for e in entries))
        self.saves.delete(run_id)

    def _drop_session(self, session: Session) -> None:
        """A dropped session's entries leave the control log, so a restart never replays it
        and the log stays as long as the live sessions' history."""
        super()._drop_session(session)
        index = self.keys.session_ops(session.session_id)
        entries = self.redis.redis.smembers(index)
        pipe = self.redis.redis.pipeline(transaction=True)
        for entry in entries:
            pipe.lrem(self.keys.control_log, 0, entry)
            pipe.delete(self.keys.op(parse_entry(entry)[0]))
        pipe.delete(index)
        pipe.execute()

    def _check_backlog(self, owner: str, tokens: int) -> None:
        if not self.replaying:  # replayed work was admitted once already
            super()._check_backlog(owner, tokens)

    # ------------------------------------------------------ run-state saves
    def _ordered(self, owner, run, seq_id, kind, make_work):
        op_id = self.current_op

        def make(record):
            work = make_work(record)
            finish = work.done

            def done(result: object | None, error: BaseException | None) -> None:
                finish(result, error)
                self._applied(run, seq_id, op_id, kind, error)

            work.done = done
            return work

        return super()._ordered(owner, run, seq_id, kind, make)

    def _applied(self, run, seq_id: int | None, op_id: str | None, kind: str,
                 error: BaseException | None) -> None:
        """On the engine thread, after an op's result is stored: save every few steps."""
        if seq_id is None and op_id:
            self._unsequenced[run.run_id].append(op_id)
        if kind != "optim_step" or error is not None or seq_id is None:
            return
        self._steps[run.run_id] += 1
        if self._steps[run.run_id] % self.save_every or run.run_id not in self.runs:
            return
        try:
            self._save_run(run, seq_id + 1)
        except Exception:  # noqa: BLE001 - a failed save only means a longer replay
            log.exception("saving state of %s failed", run.run_id)

    def _save_run(self, run, next_seq: int) -> None:
        point = SavePoint(next_seq, list(self._unsequenced[run.run_id]))
        self.saves.save(run.run_id, self._state(run), point)
        key = self.keys.run_log(run.run_id)
        pipe = self.redis.redis.pipeline()
        for raw in self.redis.redis.lrange(key, 0, -1):
            op_id, seq = parse_entry(raw)
            if point.covers(op_id, seq):
                pipe.lrem(key, 1, raw)
                pipe.delete(self.keys.op(op_id))
        pipe.execute()
        self._unsequenced[run.run_id] = [
            op for op in self._unsequenced[run.run_id] if op not in point.unsequenced
        ]
        log.info("saved state of %s at seq %d", run.run_id, next_seq)

    def restore_run(self, run_id: str, point: SavePoint) -> None:
        """Queue a run's saved state ahead of its remaining ops (called while replaying)."""
        run = self.runs[run_id]
        state = self.saves.load(run_id, point, self.engine)

        def restore() -> None:
            self.residency.forget(run)
            run.spec, run.state = state.adapter.spec, state
            self.residency.adopt(run)

        self.scheduler.submit_control(Work(run_id, "restore", lambda *_: None, action=restore))
        for seq in range(1, point.next_seq):  # the stream resumes after the saved steps
            self.scheduler.submit_ordered(Work(run_id, "restored", lambda *_: None,
                                               action=lambda: None, seq_id=seq))
        self._unsequenced[run_id] = list(point.unsequenced)

    def delete_run(self, owner: str, run_id: str) -> None:
        super().delete_run(owner, run_id)
        self._forget_run_journal(run_id)

    # ---------------------------------------------------------- samplers
    def _register_sampler(self, sampler: Sampler, reload=None) -> None:
        """Sampling sessions outlive the process: an immutable snapshot plus a Redis record."""
        directory = None
        if sampler.adapter is not None:
            directory = write_snapshot(self.data_dir, sampler.adapter, sampler.base_model)
            self._sampler_dirs[sampler.sampler_id] = directory
            device = self.engine.device
            reload = lambda: load_snapshot(directory, device)  # noqa: E731
        super()._register_sampler(sampler, reload)
        record = {"owner": sampler.owner, "base_model": sampler.base_model,
                  "model_path": sampler.model_path,
                  "snapshot": None if directory is None else str(directory)}
        self.redis.redis.set(self.keys.sampler_session(sampler.sampler_id), json.dumps(record))

    def _free_sampler(self, sampler_id: str, reason: str) -> None:
        """A freed sampling session also leaves Redis and, once no session uses it, its
        snapshot directory leaves the shared storage."""
        super()._free_sampler(sampler_id, reason)
        self.redis.redis.delete(self.keys.sampler_session(sampler_id))
        directory = self._sampler_dirs.pop(sampler_id, None)
        if directory is not None and directory not in self._sampler_dirs.values():
            shutil.rmtree(directory, ignore_errors=True)

    def restore_sampler_sessions(self) -> None:
        """Sampling sessions from Redis after a restart, registered lazily: a snapshot's
        weights are read on its first request, inside the resident-sampler cap, not all at
        start-up."""
        for key in self.redis.redis.scan_iter(match=self.keys.sampler_session("*")):
            sampler_id = key.decode().split(":", 2)[2]
            if sampler_id in self.samplers:
                continue
            record = json.loads(self.redis.redis.get(key) or "{}")
            snapshot = record.get("snapshot")
            if snapshot and not Path(snapshot).is_dir():
                self.redis.redis.delete(key)  # its snapshot is gone: nothing to serve
                continue
            sampler = Sampler(sampler_id, record["owner"], record["base_model"],
                              record.get("model_path"), None)
            TrainingService._register_sampler(self, sampler)
            if snapshot:
                directory, device = Path(snapshot), self.engine.device
                self._sampler_dirs[sampler_id] = directory
                self.sampler_cache.put_on_disk(
                    sampler_id, lambda d=directory, v=device: load_snapshot(d, v))
                sampler.tuned = True

    def _remote_samplers(self) -> bool:
        checked, alive = self._samplers_checked
        if time.monotonic() - checked > 1.0:
            alive = bool(self.redis.live_workers("sampler"))
            self._samplers_checked = (time.monotonic(), alive)
        return alive

    def _snapshot_for(self, owner: str, body: dict[str, Any]) -> Path | None:
        sampler_id = body.get("sampling_session_id")
        if sampler_id:
            sampler = self.samplers.get(sampler_id)
            if sampler is None or sampler.owner != owner:
                raise NotFound(f"unknown sampling session {sampler_id!r}")
            return self._sampler_dirs.get(sampler_id)
        if body.get("model_path"):
            path = TinkerPath.parse(body["model_path"])
            self._readable_checkpoint(owner, path)
            return snapshot_checkpoint(self.data_dir, self.store.checkpoint_dir(path))
        return None

    def sample(self, owner: str, body: dict[str, Any]):
        self.remote_sampled = False
        # Recorded sampling (record_stability_info) stays on this engine: the record must be
        # written where training requests resolve it.
        if self.replaying or body.get("record_stability_info") or not self._remote_samplers():
            return super().sample(owner, body)
        self._route = self._snapshot_for(owner, body)
        try:
            return super().sample(owner, body)
        finally:
            self._route = _LOCAL

    def _route_sample(self, work: Work) -> None:
        """Hand a validated sample job to the sampler workers, or to this engine."""
        if self._route is _LOCAL:
            self._submit_local_sample(work)
            return
        job = work.sample
        request_id = self.futures.last_created.request_id  # type: ignore[attr-defined]
        payload = {
            "request_id": request_id,
            "owner": work.owner,
            "adapter": None if self._route is None else str(self._route),
            "prompt": [int(t) for t in job.prompt],
            "num_samples": job.num_samples,
            "params": asdict(job.params),
            "prompt_logprobs": job.prompt_logprobs,
            "topk_prompt_logprobs": job.topk_prompt_logprobs,
            "topk_sample_logprobs": job.topk_sample_logprobs,
            "prompt_logprobs_last_n": job.prompt_logprobs_last_n,
        }
        pipe = self.redis.redis.pipeline(transaction=True)
        pipe.set(self.keys.sample(request_id), json.dumps(payload))
        pipe.lpush(self.keys.samples, request_id)
        pipe.execute()
        self.remote_sampled = True


class SchedulerBackend:
    """Runs sampling jobs on the trainer's own engine (when no sampler worker is alive)."""

    def __init__(self, service: DistributedService):
        self.service = service

    def sample(self, jobs: list) -> list:
        results: list[Any] = [None] * len(jobs)
        errors: list[BaseException | None] = [None] * len(jobs)
        remaining = threading.Semaphore(0)
        for i, job in enumerate(jobs):
            def finish(result: object | None, error: BaseException | None, i: int = i) -> None:
                results[i], errors[i] = result, error
                remaining.release()

            self.service._submit_local_sample(Work(None, "sample", finish, sample=job))
        for _ in jobs:
            remaining.acquire()
        failed = next((e for e in errors if e is not None), None)
        if failed is not None:
            raise failed
        return results


class TrainerWorker:
    """Lease, recovery, the op loop and the heartbeat of one trainer process."""

    def __init__(self, service: DistributedService, worker_id: str | None = None,
                 heartbeat_ttl: float = 10.0):
        self.service = service
        self.store = service.redis
        self.keys = service.keys
        self.worker_id = worker_id or f"trainer-{uuid.uuid4().hex[:8]}"
        self.heartbeat_ttl = heartbeat_ttl
        self.app = create_app(service, TrustedOwner())  # type: ignore[arg-type]
        self.recovered = threading.Event()
        self._stop = threading.Event()
        self._renew = self.store.redis.register_script(RENEW_LEASE)
        self._dispatcher = threading.Thread(target=self._dispatch_thread, name="dispatcher",
                                            daemon=True)
        self._heart = threading.Thread(target=self._heartbeat_thread, name="heartbeat",
                                       daemon=True)
        # Sampling jobs queued for sampler workers that all went away are run here instead.
        self.fallback = SamplerWorker(self.store, SchedulerBackend(service),
                                      service.engine.device, worker_id=f"{self.worker_id}-local")
        self._drain = threading.Thread(target=self._drain_thread, name="sample-fallback",
                                       daemon=True)

    # -------------------------------------------------------------- lease
    def _acquire_lease(self) -> None:
        ttl_ms = int(self.heartbeat_ttl * 1000)
        while not self._stop.is_set():
            if self.store.redis.set(self.keys.lease, self.worker_id, nx=True, px=ttl_ms):
                log.info("trainer %s holds the trainer lease", self.worker_id)
                return
            self._stop.wait(min(1.0, self.heartbeat_ttl / 4))

    def start(self) -> TrainerWorker:
        self._acquire_lease()
        live = set(self.store.live_workers("trainer"))
        for member in self.store.redis.smembers(self.keys.members("trainer")):
            if member.decode() not in live:  # earlier lives of trainers
                self.store.redis.srem(self.keys.members("trainer"), member)
        self.fallback.reclaim(include_own=True)
        self._heart.start()
        self._dispatcher.start()
        self._drain.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._dispatcher.join(timeout=30)
        self._heart.join(timeout=10)
        self._drain.join(timeout=30)
        self.store.redis.delete(self.keys.alive("trainer", self.worker_id))
        if (self.store.redis.get(self.keys.lease) or b"").decode() == self.worker_id:
            self.store.redis.delete(self.keys.lease)
        self.service.scheduler.stop()

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        stalled = self.service.scheduler.stalled_seconds()
        healthy = stalled <= self.service.scheduler.stall_limit
        ready = self.recovered.is_set() and healthy and self._dispatcher.is_alive()
        return ready, {"worker_id": self.worker_id, "recovered": self.recovered.is_set(),
                       "engine_stalled": not healthy}

    def _heartbeat_thread(self) -> None:
        ttl_ms = int(self.heartbeat_ttl * 1000)
        while not self._stop.wait(self.heartbeat_ttl / 4):
            try:
                if not self._renew(keys=[self.keys.lease], args=[self.worker_id, ttl_ms]):
                    # Another trainer may own the runs now: continuing would fork their state.
                    log.critical("trainer %s lost the trainer lease; exiting", self.worker_id)
                    os._exit(3)
                if self.readiness()[0]:
                    self.store.heartbeat("trainer", self.worker_id, self.heartbeat_ttl)
                else:
                    self.store.redis.delete(self.keys.alive("trainer", self.worker_id))
            except Exception:  # noqa: BLE001 - a Redis hiccup must not kill the heartbeat
                log.exception("trainer heartbeat failed")

    def _drain_thread(self) -> None:
        while not self._stop.wait(1.0):
            try:
                if (self.recovered.is_set() and self.store.redis.llen(self.keys.samples)
                        and not self.store.live_workers("sampler")):
                    while self.fallback.run_once() and not self._stop.is_set():
                        pass
            except Exception:  # noqa: BLE001 - retried on the next round
                log.exception("sampling fallback failed")

    # ---------------------------------------------------------- dispatch
    def _dispatch_thread(self) -> None:
        asyncio.run(self._dispatch())

    async def _dispatch(self) -> None:
        transport = httpx.ASGITransport(app=self.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://trainer",
                                     timeout=None) as client:
            self._client = client
            await self.recover()
            self.recovered.set()
            while not self._stop.is_set():
                try:
                    raw = self.store.redis.blmove(self.keys.ops, self.keys.processing, 1.0,
                                                  "RIGHT", "LEFT")
                    if raw is not None:
                        await self.handle(raw.decode())
                except Exception:  # noqa: BLE001 - the op stays taken and is redelivered
                    log.exception("dispatching an op failed")
                    self._stop.wait(1.0)

    async def recover(self) -> None:
        """Rebuild sessions and runs from the journal, then requeue ops taken but never done."""
        redis, keys, service = self.store.redis, self.keys, self.service
        service.replaying = True
        try:
            control = redis.lrange(keys.control_log, 0, -1)
            for raw in control:
                await self.handle(parse_entry(raw)[0], replay=True)
            service.restore_sampler_sessions()
            replayed = len(control)
            for run_id in list(service.runs):
                point = service.saves.point(run_id)
                if point is not None:
                    service.restore_run(run_id, point)
                for raw in redis.lrange(keys.run_log(run_id), 0, -1):
                    op_id, seq = parse_entry(raw)
                    if point is None or not point.covers(op_id, seq):
                        await self.handle(op_id, replay=True)
                        replayed += 1
        finally:
            service.replaying = False
        requeued = 0
        while redis.lmove(keys.processing, keys.ops, "LEFT", "RIGHT") is not None:
            requeued += 1
        log.info("trainer %s recovered: %d ops replayed, %d requeued", self.worker_id,
                 replayed, requeued)

    async def handle(self, op_id: str, replay: bool = False) -> None:
        redis, keys = self.store.redis, self.keys
        fields = redis.hgetall(keys.op(op_id))
        if not fields:  # withdrawn by its gateway, or already covered by a saved state
            if not replay:
                redis.lrem(keys.processing, 0, op_id)
            return
        method = fields[b"method"].decode()
        path = fields[b"path"].decode()
        query = fields.get(b"query", b"").decode()
        body = normalize(op_id, path, fields.get(b"body", b""))
        headers = {"x-api-key": fields.get(b"owner", b"").decode()}
        if fields.get(b"content_type"):
            headers["content-type"] = fields[b"content_type"].decode()
        self.service.futures.current_op = op_id  # type: ignore[attr-defined]
        try:
            response = await self._client.request(method, "/api/v1" + path, params=query or None,
                                                  content=body, headers=headers)
        finally:
            self.service.futures.current_op = None  # type: ignore[attr-defined]
        target: Target | None = None
        if response.status_code < 400:
            try:
                target = classify(method, path, body)
            except Exception:  # noqa: BLE001 - the app accepted it; nothing to journal
                target = None
        if not replay:
            pipe = redis.pipeline(transaction=True)
            if target is not None:
                log_key = keys.control_log if target.control else keys.run_log(target.run_id)
                entry = log_entry(op_id, target.seq_id)
                pipe.rpush(log_key, entry)
                session_id = control_session(op_id, path, body) if target.control else None
                if session_id is not None:
                    pipe.sadd(keys.session_ops(session_id), entry)
                pipe.hset(keys.op(op_id), "body", body)
                pipe.lrem(keys.processing, 0, op_id)
            elif not (path == "/asample" and response.status_code < 400
                      and not self.service.remote_sampled):
                pipe.lrem(keys.processing, 0, op_id)
                pipe.delete(keys.op(op_id))
            # else: sampled here; acknowledged when its result is stored
            pipe.execute()
        reply = encode_reply(response.status_code, response.headers.get("content-type", ""),
                             response.content)
        if response.status_code >= 500 and not replay:
            # A server fault may be transient: waiters see it, a retry enqueues afresh.
            redis.delete(keys.claim(op_id))
            self.store.publish_once(keys.reply(op_id), reply, FAULT_REPLY_TTL_SECONDS)
            return
        self.store.publish_once(keys.reply(op_id), reply, REPLY_TTL_SECONDS)
