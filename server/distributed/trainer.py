"""The trainer worker: the single-process service, fed with ops from Redis.

`DistributedService` is `TrainingService` with what a restartable worker needs on top: ids
derived from op ids (so replays address the same sessions and futures), run-state saves every
few optimizer steps, adapter snapshots for sampler workers, and sampling routed to them when one
is alive and can serve the adapter. `TrainerWorker` runs any number of replicas side by side:
each owns the sessions placed on it (`placement.py`) and takes ops from its own queue (BLMOVE to
its taken list), runs each through the ordinary FastAPI app in process, journals and
acknowledges it in one transaction fenced on the session's placement, and publishes the reply.
Its heartbeat key is its lease: when it lapses, another replica takes the sessions over (one Lua
script re-places them and moves the queue), restores each run's saved state and replays the
rest of its journal. Every write a replica makes for a session (a journal entry, a save's
pointer and the journal trim it allows) is one Redis transaction fenced on the session's
placement: a replica that lost a session cannot write for it, and drops it from memory instead
of forking it. A Redis outage therefore costs nothing but time: while Redis is away nobody can
take anything over, and when it returns a replica takes over only after it has itself been
connected for a heartbeat's TTL, by which time every live replica has renewed its own; a
replica that was taken over all the same (cut off alone for longer than the TTL) drops its
sessions and rejoins empty. One that is stopped saves its runs first, so the take-over replays
nothing.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import shutil
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
from redis import exceptions as redis_errors
from redis.client import Pipeline

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
from server.distributed.placement import TAKE_OVER, new_session_id, session_of_id
from server.distributed.sampler import ALL_MODULES, SamplerWorker, served_modules
from server.distributed.snapshots import load_snapshot, snapshot_checkpoint, write_snapshot
from server.distributed.state_writer import StateWriter
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

BEAT = """
-- KEYS: the trainer's alive key, the trainer members. ARGV: ttl in ms, the trainer's id.
-- Renews the heartbeat of a member, lapsed or not (a Redis outage lapses every heartbeat at
-- once); a trainer that is no member was taken over (its sessions moved on): 0.
if redis.call('SISMEMBER', KEYS[2], ARGV[2]) == 0 then return 0 end
redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[1])
return 1
"""

TAKE_SHARED = """
-- KEYS: the shared queue, this trainer's taken list. ARGV: prefix, this trainer's id.
-- Takes the oldest unplaced op, or hands it to the trainer that owns its session by now.
local op = redis.call('RPOP', KEYS[1])
if not op then return false end
local session = redis.call('HGET', ARGV[1] .. ':op:' .. op, 'session')
local owner = false
if session and session ~= '' then
  owner = redis.call('GET', ARGV[1] .. ':placement:' .. session)
end
if owner and owner ~= ARGV[2] then
  redis.call('LPUSH', ARGV[1] .. ':ops:queue:' .. owner, op)
  return false
end
redis.call('LPUSH', KEYS[2], op)
return op
"""
ADMIT_RUN = """
-- KEYS: the key's runs. ARGV: run id, limit. A run already counted is admitted again (a replay,
-- a take-over); a new one only below the limit, counted in the same step.
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 1 end
if redis.call('SCARD', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
redis.call('SADD', KEYS[1], ARGV[1])
return 1
"""
_LOCAL = object()
FAULT_REPLY_TTL_SECONDS = 30


class SessionLost(RuntimeError):
    """A write for a session that another trainer owns now: refused by its fence."""


def control_session(op_id: str, path: str, body: bytes) -> str | None:
    """The session a control op belongs to: the one it creates (ids derive from the op id),
    the one its body names, or the one in its path (finish, delete of one of its runs)."""
    if path == "/create_session":
        return new_session_id(op_id)
    if path.startswith(("/sessions/", "/training_runs/")):
        return session_of_id(path.split("/")[2])
    return session_of_id(parse_json(body).get("session_id"))


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
        self.writer = StateWriter()
        self._unsequenced_lock = threading.Lock()
        self.worker_id = ""
        self.replaying = False
        self.lost_sessions: set[str] = set()
        self._forgetting_locally = False
        self._admit_run_script = store.redis.register_script(ADMIT_RUN)
        self._published_backlog: set[str] = set()
        self.remote_sampled = False
        self._next_seq: dict[str, int] = {}
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
        session_id = new_session_id(self.current_op or uuid.uuid4().hex)
        self.sessions[session_id] = self._new_session(session_id, owner, body)
        return {"session_id": session_id, "type": "create_session"}

    # ------------------------------------------------------------ lifecycle
    def _free_run(self, run_id: str, reason: str) -> None:
        """A freed run's journal goes with it: its log, its ops, its saved state and its place
        in its key's run count."""
        run = self.runs.get(run_id)
        super()._free_run(run_id, reason)
        if not self._forgetting_locally:
            self._forget_run_journal(run_id, run.owner if run else None)

    def _forget_run_journal(self, run_id: str, owner: str | None = None) -> None:
        key = self.keys.run_log(run_id)
        entries = self.redis.redis.lrange(key, 0, -1)
        self.redis.redis.delete(key, *(self.keys.op(parse_entry(e)[0]) for e in entries))
        if owner is not None:
            self.redis.redis.srem(self.keys.key_runs(owner), run_id)

        def delete_saves() -> None:  # after its pending saves (whose pointers they set)
            self.saves.delete(run_id)
            self.redis.redis.delete(self.keys.run_save(run_id))

        self.writer.submit(delete_saves)

    def lose_sessions(self, sessions: set[str], why: str) -> None:
        """Sessions another replica owns now: nothing more is written for them (every write is
        fenced anyway), and their runs and samplers leave this replica's memory, on the engine
        thread, without touching their journals, saves or snapshots, which are the new owner's."""
        fresh = set(sessions) - self.lost_sessions
        if not fresh:
            return
        self.lost_sessions |= fresh
        log.warning("trainer %s lost sessions %s (%s); dropping them here, their journals "
                    "and saves are the new owner's", self.worker_id, sorted(fresh), why)

        def forget() -> None:
            self._forgetting_locally = True
            try:
                for session_id in sorted(fresh):
                    for sampler_id in [s for s in self.samplers
                                       if session_of_id(s) == session_id]:
                        self._free_sampler(sampler_id, f"its session moved ({why})")
                    session = self.sessions.get(session_id)
                    if session is not None:
                        self._drop_session(session)
                    for run_id in [r for r in self.runs if session_of_id(r) == session_id]:
                        self._free_run(run_id, f"its session moved ({why})")
                    for table in (self._next_seq, self._steps):
                        for run_id in [r for r in table if session_of_id(r) == session_id]:
                            del table[run_id]
                    with self._unsequenced_lock:
                        for run_id in [r for r in self._unsequenced
                                       if session_of_id(r) == session_id]:
                            del self._unsequenced[run_id]
            finally:
                self._forgetting_locally = False

        self.scheduler.submit_control(Work(None, "lose-sessions", lambda *_: None,
                                           action=forget))

    def owns(self, session: str) -> bool:
        """Whether this replica still holds `session` (not known lost)."""
        return session not in self.lost_sessions

    def _drop_session(self, session: Session) -> None:
        """A dropped session's journal and placement go with it, so no take-over replays it and
        Redis holds only the live sessions' history."""
        super()._drop_session(session)
        if self._forgetting_locally:
            return
        log_key = self.keys.control_log(session.session_id)
        entries = self.redis.redis.lrange(log_key, 0, -1)
        pipe = self.redis.redis.pipeline(transaction=True)
        for entry in entries:
            pipe.delete(self.keys.op(parse_entry(entry)[0]))
        pipe.delete(log_key, self.keys.placement(session.session_id))
        pipe.srem(self.keys.owned(self.worker_id), session.session_id)
        pipe.execute()

    def _check_backlog(self, owner: str, tokens: int) -> None:
        if not self.replaying:  # replayed work was admitted once already
            super()._check_backlog(owner, tokens)

    # ------------------------------------------------- per-key quotas, all trainers
    def _admit_run(self, owner: str, run_id: str, limit: int) -> bool:
        """A key's runs are counted on every trainer at once: a set in Redis that a run joins
        when it is admitted (atomically, below the limit) and leaves when it is freed."""
        if self.replaying:  # admitted once already; a take-over recounts nothing
            self.redis.redis.sadd(self.keys.key_runs(owner), run_id)
            return True
        return bool(self._admit_run_script(keys=[self.keys.key_runs(owner)],
                                           args=[run_id, limit]))

    def _queued_for_key(self, owner: str) -> int:
        """This trainer's queued tokens for the key, plus what every other live trainer last
        published for it (each publishes its own with its heartbeat)."""
        local = self.scheduler.queued_tokens(owner)
        published = self.redis.redis.hgetall(self.keys.key_backlog(owner))
        others = {k.decode(): int(v) for k, v in published.items()
                  if k.decode() != self.worker_id}
        if not others:
            return local
        live = set(self.redis.live_workers("trainer"))
        return local + sum(n for trainer, n in others.items() if trainer in live)

    def publish_backlog(self) -> None:
        """Publish this trainer's queued tokens per key (and clear the keys it no longer
        has), for the other trainers' queue quotas, and its load (tokens of the last minute
        and queued), where the gateways place new sessions."""
        queued = self.scheduler.queued_tokens_by_owner()
        pipe = self.redis.redis.pipeline(transaction=False)
        pipe.hset(self.keys.trainer_load, self.worker_id,
                  self.metrics.recent_tokens() + sum(queued.values()))
        for owner, tokens in queued.items():
            pipe.hset(self.keys.key_backlog(owner), self.worker_id, tokens)
        for owner in self._published_backlog - set(queued):
            pipe.hdel(self.keys.key_backlog(owner), self.worker_id)
        pipe.execute()
        self._published_backlog = set(queued)

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
            with self._unsequenced_lock:
                self._unsequenced[run.run_id].append(op_id)
        if seq_id is not None:
            self._next_seq[run.run_id] = seq_id + 1
        if kind != "optim_step" or error is not None or seq_id is None:
            return
        self._steps[run.run_id] += 1
        if self._steps[run.run_id] % self.save_every or run.run_id not in self.runs:
            return
        try:
            self._save_run(run, seq_id + 1)
        except Exception:  # noqa: BLE001 - a failed copy only means a longer replay
            log.exception("saving state of %s failed", run.run_id)

    def _save_run(self, run, next_seq: int) -> Future:
        """On the engine thread: copy the run's state to host memory, then hand the write to
        the background writer (the engine goes on at once). The write puts the state file
        before its pointer, and only then drops the journal entries the save covers, so a crash
        at any point leaves a save and a journal that together hold every step once."""
        run_id = run.run_id
        with self._unsequenced_lock:
            point = SavePoint(next_seq, list(self._unsequenced[run_id]))
        payload = self.saves.snapshot(self._state(run))
        return self.writer.submit(lambda: self._write_save(run_id, payload, point))

    def _write_save(self, run_id: str, payload: dict[str, Any], point: SavePoint) -> None:
        """The state file, then, in one transaction fenced on the session's placement, its
        pointer and the trim of the journal entries it covers."""
        try:
            self.saves.write(run_id, payload, point, writer=self.worker_id)
        except Exception:  # noqa: BLE001 - a failed save only means a longer replay
            log.exception("saving state of %s failed", run_id)
            raise
        if not self._commit_save(run_id, point):
            self.saves.prune_file(run_id, point.file)
            raise SessionLost(f"run {run_id} moved to another trainer; its save was dropped")
        self.saves.prune(run_id, keep=point.file)
        with self._unsequenced_lock:
            self._unsequenced[run_id] = [
                op for op in self._unsequenced[run_id] if op not in point.unsequenced
            ]
        log.info("saved state of %s at seq %d", run_id, point.next_seq)

    def _commit_save(self, run_id: str, point: SavePoint) -> bool:
        """Point at a written state file and trim the journal it covers, only while this
        replica owns the run's session; False (and the session lost) otherwise."""
        session = session_of_id(run_id)
        if session is None:
            return False
        key = self.keys.run_log(run_id)

        def write(pipe: Pipeline, owner: bytes | None) -> None:
            entries = pipe.lrange(key, 0, -1)
            pipe.multi()
            pipe.set(self.keys.run_save(run_id), json.dumps(asdict(point)))
            for raw in entries:
                op_id, seq = parse_entry(raw)
                if point.covers(op_id, seq):
                    pipe.lrem(key, 1, raw)
                    pipe.delete(self.keys.op(op_id))

        return self.fenced(session, write, key)

    def fenced(self, session: str, write: Callable[[Pipeline, bytes | None], None],
               *watch: str) -> bool:
        """One Redis transaction for `session`, fenced on its placement: the lease token is the
        placement's value, which only a take-over changes. `write(pipe, owner)` gets the
        watched pipeline and the session's owner (None before it is placed), may read, then
        calls `pipe.multi()` and queues its writes. False, with nothing written and the session
        lost here, when another trainer owns it; retried when a watched key changes."""
        placement = self.keys.placement(session)
        with self.redis.redis.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(placement, *watch)
                    owner = pipe.get(placement)
                    if owner is not None and owner.decode() != self.worker_id:
                        pipe.reset()
                        self.lose_sessions({session}, f"placed on {owner.decode()}")
                        return False
                    write(pipe, owner)
                    pipe.execute()
                    return True
                except redis_errors.WatchError:
                    continue

    def save_point(self, run_id: str) -> SavePoint | None:
        """The save in force for a run: its pointer in Redis, else a legacy pointer file."""
        raw = self.redis.redis.get(self.keys.run_save(run_id))
        if raw is not None:
            return SavePoint(**json.loads(raw))
        return self.saves.legacy_point(run_id)

    def save_all_runs(self, timeout: float = 120.0) -> int:
        """Save every run at the point the engine reached (a drained trainer's last act, so the
        replica that takes its sessions over replays nothing). The copies are taken on the
        engine thread, after the work already queued; this returns once they are written, with
        how many were."""
        pending: list[Future] = []
        copied = threading.Event()

        def save() -> None:
            try:
                for run_id, run in list(self.runs.items()):
                    try:
                        if self.owns(session_of_id(run_id) or ""):
                            pending.append(self._save_run(run, self._next_seq.get(run_id, 0)))
                    except Exception:  # noqa: BLE001 - that run's journal replays instead
                        log.exception("saving state of %s failed", run_id)
            finally:
                copied.set()

        self.scheduler.submit_control(Work(None, "save-all", lambda *_: None, action=save))
        copied.wait(timeout=timeout)
        self.writer.flush(timeout=timeout)
        return sum(1 for f in pending if f.done() and f.exception() is None)

    def restore_run(self, run_id: str, point: SavePoint) -> None:
        """Queue a run's saved state ahead of its remaining ops (called while replaying)."""
        run = self.runs[run_id]
        state = self.saves.load(run_id, point, self.engine)

        def restore() -> None:
            self.residency.forget(run)
            run.spec, run.state = state.adapter.spec, state
            run.optimizer = state.optimizer_type
            self.residency.adopt(run)

        self.scheduler.submit_control(Work(run_id, "restore", lambda *_: None, action=restore))
        for seq in range(1, point.next_seq):  # the stream resumes after the saved steps
            self.scheduler.submit_ordered(Work(run_id, "restored", lambda *_: None,
                                               action=lambda: None, seq_id=seq))
        with self._unsequenced_lock:
            self._unsequenced[run_id] = list(point.unsequenced)
        self._next_seq[run_id] = point.next_seq

    def delete_run(self, owner: str, run_id: str) -> None:
        super().delete_run(owner, run_id)
        self._forget_run_journal(run_id, owner)

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
        if self._forgetting_locally:
            self._sampler_dirs.pop(sampler_id, None)
            return
        self.redis.redis.delete(self.keys.sampler_session(sampler_id))
        directory = self._sampler_dirs.pop(sampler_id, None)
        if directory is not None and directory not in self._sampler_dirs.values():
            shutil.rmtree(directory, ignore_errors=True)

    def restore_sampler_sessions(self, sessions: set[str] | None = None) -> None:
        """Sampling sessions from Redis after a restart or take-over (of `sessions`, or all),
        registered lazily: a snapshot's weights are read on its first request, inside the
        resident-sampler cap, not all at start-up."""
        for key in self.redis.redis.scan_iter(match=self.keys.sampler_session("*")):
            sampler_id = key.decode().split(":", 2)[2]
            if sampler_id in self.samplers or (
                    sessions is not None and session_of_id(sampler_id) not in sessions):
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
        return self._remote_modules() is not None

    def _remote_modules(self) -> frozenset[str] | None:
        """The LoRA modules every live sampler worker serves (`ALL_MODULES` for torch ones), or
        None when no sampler worker is alive; looked up at most once a second."""
        checked, modules = self._samplers_checked
        if time.monotonic() - checked > 1.0:
            live = self.redis.live_workers("sampler")
            modules = None
            if live:
                served = [served_modules(raw) for raw in self.redis.redis.mget(
                    [self.keys.sampler_modules(w) for w in live])]
                modules = frozenset.intersection(*served)
            self._samplers_checked = (time.monotonic(), modules)
        return modules

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
        job = work.sample
        if self._route is _LOCAL or not self._servable(job.adapter):
            self._submit_local_sample(work)
            return
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


    def _servable(self, adapter: Any) -> bool:
        """Whether the live sampler workers serve every module the adapter trains (vLLM serves
        no LoRA on Gemma's tied output head): what they cannot serve is sampled here."""
        modules = self._remote_modules()
        if adapter is None or modules is None or ALL_MODULES in modules:
            return modules is not None
        return {name.rsplit(".", 1)[-1] for name in adapter.a} <= modules


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
    """Placement, take-over, the op loop and the heartbeat of one trainer replica."""

    def __init__(self, service: DistributedService, worker_id: str | None = None,
                 heartbeat_ttl: float = 10.0):
        self.service = service
        self.store = service.redis
        self.keys = service.keys
        # A fresh id per life: a lapsed heartbeat can never be renewed by a later process.
        self.worker_id = f"{worker_id or 'trainer'}-{uuid.uuid4().hex[:6]}"
        service.worker_id = self.worker_id
        service.futures.taken = self.keys.taken(self.worker_id)  # type: ignore[attr-defined]
        self.queue, self.taken = self.keys.queue(self.worker_id), self.keys.taken(self.worker_id)
        self.heartbeat_ttl = heartbeat_ttl
        self.app = create_app(service, TrustedOwner())  # type: ignore[arg-type]
        self.recovered = threading.Event()
        self.taken_over: list[dict[str, Any]] = []
        self._unfinished: dict[str, Any] = {}
        self._stop = threading.Event()
        self._connected_since: float | None = None
        self._away_since: float | None = None
        self.rejoins = 0
        self._beat = self.store.redis.register_script(BEAT)
        self._take_over = self.store.redis.register_script(TAKE_OVER)
        self._take_shared = self.store.redis.register_script(TAKE_SHARED)
        self._dispatcher = threading.Thread(target=self._dispatch_thread, name="dispatcher",
                                            daemon=True)
        self._heart = threading.Thread(target=self._heartbeat_thread, name="heartbeat",
                                       daemon=True)
        # Sampling jobs queued for sampler workers that all went away are run here instead.
        self.fallback = SamplerWorker(self.store, SchedulerBackend(service),
                                      service.engine.device, worker_id=f"{self.worker_id}-local")
        self._drain = threading.Thread(target=self._drain_thread, name="sample-fallback",
                                       daemon=True)

    # ---------------------------------------------------------- lifecycle
    def start(self) -> TrainerWorker:
        self.store.heartbeat("trainer", self.worker_id, self.heartbeat_ttl)
        self._connected_since = time.monotonic()
        log.info("trainer %s joined", self.worker_id)
        self._heart.start()
        self._dispatcher.start()
        self._drain.start()
        return self

    def stop(self, save: bool = True) -> None:
        """Drain: take no more ops, save every run, then let the heartbeat lapse at once so
        another replica takes the sessions over from those saves."""
        self._stop.set()
        self._dispatcher.join(timeout=30)
        if save and self.recovered.is_set():
            try:
                log.info("trainer %s saved %d runs before leaving", self.worker_id,
                         self.service.save_all_runs())
            except Exception:  # noqa: BLE001 - the journal replays what was not saved
                log.exception("saving runs before leaving failed")
        self._heart.join(timeout=10)
        self._drain.join(timeout=30)
        self.store.redis.delete(self.keys.alive("trainer", self.worker_id))
        self.service.scheduler.stop()
        self.service.writer.close()

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        stalled = self.service.scheduler.stalled_seconds()
        healthy = stalled <= self.service.scheduler.stall_limit
        ready = self.recovered.is_set() and healthy and self._dispatcher.is_alive()
        try:
            sessions: int | None = self.store.redis.scard(self.keys.owned(self.worker_id))
        except redis_errors.RedisError:  # not ready while Redis is away; liveness is apart
            ready, sessions = False, None
        return ready, {"worker_id": self.worker_id, "recovered": self.recovered.is_set(),
                       "engine_stalled": not healthy, "sessions": sessions,
                       "redis_reachable": sessions is not None}

    def _heartbeat_thread(self) -> None:
        while not self._stop.wait(self.heartbeat_ttl / 4):
            self.beat_once()

    def beat_once(self) -> bool:
        """Renew this replica's heartbeat; True if Redis answered. Never exits: while Redis is
        away the replica keeps its sessions (nobody can take them over meanwhile), and a
        replica found taken over when it answers drops them and rejoins (`_rejoin`)."""
        try:
            renewed = self._beat(keys=[self.keys.alive("trainer", self.worker_id),
                                       self.keys.members("trainer")],
                                 args=[int(self.heartbeat_ttl * 1000), self.worker_id,
                                       str(time.time())])
        except Exception:  # noqa: BLE001 - Redis away: keep the sessions, keep trying
            self._connected_since = None
            if self._away_since is None:
                self._away_since = time.monotonic()
                log.warning("trainer %s cannot reach Redis; keeping its sessions and "
                            "retrying", self.worker_id, exc_info=True)
            return False
        if self._away_since is not None:
            log.warning("trainer %s reached Redis again after %.0f s", self.worker_id,
                        time.monotonic() - self._away_since)
            self._away_since = None
        if self._connected_since is None:
            self._connected_since = time.monotonic()
        if not renewed:
            self._rejoin()
        try:
            self.service.publish_backlog()
        except Exception:  # noqa: BLE001 - published again on the next beat
            log.warning("publishing queued tokens failed", exc_info=True)
        return True

    def connected_for(self) -> float:
        """Seconds this replica has reached Redis without a break (0 while it cannot)."""
        since = self._connected_since
        return 0.0 if since is None else time.monotonic() - since

    def _rejoin(self) -> None:
        """Taken over while cut off from Redis: every session this replica holds is another's
        now. Drop them here and join again, empty, under the same id."""
        held = set(self.service.sessions) | {
            s for s in (session_of_id(r) for r in self.service.runs) if s}
        self.service.lose_sessions(held, "this trainer was taken over while cut off")
        self.store.heartbeat("trainer", self.worker_id, self.heartbeat_ttl)
        self.rejoins += 1
        log.warning("trainer %s rejoined empty after being taken over", self.worker_id)

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
            await self.take_over_lapsed()
            self.recovered.set()
            scanned = time.monotonic()
            while not self._stop.is_set():
                try:
                    if time.monotonic() - scanned > self.heartbeat_ttl / 2:
                        await self.take_over_lapsed()
                        scanned = time.monotonic()
                    raw = self._take_shared(keys=[self.keys.shared_ops, self.taken],
                                            args=[self.keys.prefix, self.worker_id])
                    if raw is None:
                        raw = self.store.redis.blmove(self.queue, self.taken, 0.5, "RIGHT",
                                                      "LEFT")
                    if raw is not None:
                        await self.handle(raw.decode())
                except Exception:  # noqa: BLE001 - the op stays taken and is redelivered
                    log.exception("dispatching an op failed")
                    self._stop.wait(1.0)
                    healed, since, said = False, time.monotonic(), False
                    while not healed and not self._stop.is_set():
                        try:
                            self.heal_taken()
                            healed = True
                        except Exception:  # noqa: BLE001 - Redis still away: try again
                            if not said:
                                log.warning("Redis unavailable; retrying every second")
                                said = True
                            self._stop.wait(1.0)
                    if said and healed:
                        log.warning("Redis back after %.0f s; taken ops healed",
                                    time.monotonic() - since)

    async def take_over_lapsed(self) -> None:
        """Take over every trainer whose heartbeat lapsed: its sessions, its queue, and what it
        had taken; then rebuild those sessions from their journals. Only once this replica has
        itself reached Redis for a heartbeat's TTL without a break: after an outage every
        heartbeat has lapsed, and the live replicas need that long to renew theirs."""
        if self.connected_for() < self.heartbeat_ttl:
            return
        redis, keys = self.store.redis, self.keys
        members = {m.decode() for m in redis.smembers(keys.members("trainer"))}
        for dead in sorted(members - {self.worker_id}):
            started = time.monotonic()
            moved_before = redis.llen(self.queue)
            taken = self._take_over(
                keys=[keys.alive("trainer", dead), keys.owned(dead), keys.queue(dead),
                      keys.taken(dead), keys.owned(self.worker_id), self.queue,
                      keys.members("trainer")],
                args=[keys.prefix, dead, self.worker_id])
            if taken is None:
                continue  # still alive
            sessions = {s.decode() for s in taken}
            for backlog in redis.scan_iter(match=keys("key", "*", "queued")):
                redis.hdel(backlog, dead)  # its queued tokens are this trainer's queue now
            redis.hdel(keys.trainer_load, dead)
            replayed = await self.recover(sessions)
            event = {"from": dead, "sessions": len(sessions), "replayed": replayed,
                     "queued": redis.llen(self.queue) - moved_before,
                     "seconds": round(time.monotonic() - started, 3)}
            self.taken_over.append(event)
            log.info("trainer %s took over %s: %d sessions, %d ops replayed", self.worker_id,
                     dead, len(sessions), replayed)

    async def recover(self, sessions: set[str]) -> int:
        """Rebuild these sessions (their runs and samplers) from the journal and saved state;
        returns how many ops were replayed."""
        if not sessions:
            return 0
        redis, keys, service = self.store.redis, self.keys, self.service
        service.replaying = True
        replayed = 0
        try:
            for session in sorted(sessions):
                for raw in redis.lrange(keys.control_log(session), 0, -1):
                    await self.handle(parse_entry(raw)[0], replay=True)
                    replayed += 1
            service.restore_sampler_sessions(sessions)
            for run_id in [r for r in service.runs if session_of_id(r) in sessions]:
                point = service.save_point(run_id)
                if point is not None:
                    service.restore_run(run_id, point)
                for raw in redis.lrange(keys.run_log(run_id), 0, -1):
                    op_id, seq = parse_entry(raw)
                    if point is None or not point.covers(op_id, seq):
                        await self.handle(op_id, replay=True)
                        replayed += 1
        finally:
            service.replaying = False
        return replayed

    async def handle(self, op_id: str, replay: bool = False) -> None:
        redis, keys = self.store.redis, self.keys
        fields = redis.hgetall(keys.op(op_id))
        if not fields:  # withdrawn by its gateway, or already covered by a saved state
            if not replay:
                redis.lrem(self.taken, 0, op_id)
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
        reply = encode_reply(response.status_code, response.headers.get("content-type", ""),
                             response.content)
        if replay:
            return
        sampled_here = (path == "/asample" and response.status_code < 400
                        and not self.service.remote_sampled)

        def finish() -> None:
            if not self._acknowledge(op_id, method, path, body, target, sampled_here):
                return  # its session moved: the new owner answers it
            if response.status_code >= 500:
                # A server fault may be transient: waiters see it, a retry enqueues afresh.
                redis.delete(keys.claim(op_id))
                self.store.publish_once(keys.reply(op_id), reply, FAULT_REPLY_TTL_SECONDS)
            else:
                self.store.publish_once(keys.reply(op_id), reply, REPLY_TTL_SECONDS)

        # Applied in memory: if Redis fails now, the journal entry and the reply are retried
        # (`heal_taken`), never the op itself.
        self._unfinished[op_id] = finish
        finish()
        del self._unfinished[op_id]

    def heal_taken(self) -> None:
        """After a Redis failure: finish the ops that were applied but not journaled or
        answered, and put back in the queue the ops taken whose taking never reached this
        process (a BLMOVE whose reply was lost). Ops sampled here stay until their result."""
        redis, keys = self.store.redis, self.keys
        for op_id, finish in list(self._unfinished.items()):
            finish()
            del self._unfinished[op_id]
        for raw in redis.lrange(self.taken, 0, -1):
            op_id = raw.decode()
            if redis.hget(keys.op(op_id), "path") == b"/asample" and redis.exists(
                    keys.future(op_id)):
                continue  # being sampled here (its future exists): acknowledged with it
            pipe = redis.pipeline(transaction=True)
            pipe.lrem(self.taken, 1, op_id)
            pipe.rpush(self.queue, op_id)  # taken next
            pipe.execute()
            log.warning("trainer %s requeued op %s after a Redis failure", self.worker_id,
                        op_id)

    def _acknowledge(self, op_id: str, method: str, path: str, body: bytes,
                     target: Target | None, sampled_here: bool) -> bool:
        """Journal (if it changed state) and acknowledge an op in one transaction, fenced on
        its session's placement. False when another replica owns the session now: nothing is
        written, the session leaves this replica, and the op (moved with the session's queue)
        is the new owner's to apply and answer."""
        redis, keys = self.store.redis, self.keys
        session = log_key = None
        if target is not None:
            session = (control_session(op_id, path, body) if target.control
                       else session_of_id(target.run_id))
        if session is not None and target is not None:
            log_key = (keys.control_log(session) if target.run_id is None
                       else keys.run_log(target.run_id))
        if session is None or log_key is None or target is None:
            if not sampled_here:  # else: acknowledged when its result is stored
                pipe = redis.pipeline(transaction=True)
                pipe.lrem(self.taken, 0, op_id)
                pipe.delete(keys.op(op_id))
                pipe.execute()
            return True

        def write(pipe: Pipeline, owner: bytes | None) -> None:
            pipe.multi()
            pipe.rpush(log_key, log_entry(op_id, target.seq_id))
            if owner is None and path == "/create_session":
                pipe.set(keys.placement(session), self.worker_id)
                pipe.sadd(keys.owned(self.worker_id), session)
            pipe.hset(keys.op(op_id), "body", body)
            pipe.lrem(self.taken, 0, op_id)

        return self.service.fenced(session, write)
