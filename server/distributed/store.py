"""Redis layout and the primitives every role shares: write-once values, ops, futures.

Key layout (all under one prefix, `ar` by default)::

    op:<id>              hash   an op: method, path, query, owner, content_type, body, and
                                the session and queue it was routed by
    claim:<id>           string the op is enqueued (an SDK retry waits for it, never re-enqueues)
    ops:queue:<trainer>  list   ops for one trainer (its sessions', or placed there by load)
    ops:taken:<trainer>  list   ops that trainer took and has not acknowledged
    ops                  list   ops enqueued while no trainer was alive (any trainer drains it)
    placement:<session>  string the trainer that owns a session (its runs and samplers)
    trainer:sessions:<trainer>  set  the sessions a trainer owns (moved on take-over)
    trainer:load         hash   each trainer's tokens of the last minute (where sessions go)
    reply:<id>           string the op's HTTP answer (write-once), `reply:<id>:n` wakes waiters
    future:<id>          hash   owner, kind of a future; `result:<id>` (write-once) its result
    log:control:<session>  list journal of a session's own ops; `log:run:<run_id>` per run
    save:run:<run_id>    string the run's save in force (its state file and what it covers)
    key:<tag>:runs       set    the runs an API key holds on any trainer (its run quota)
    key:<tag>:queued     hash   each trainer's queued tokens for that key (its queue quota)
    trainers, trainer:alive:<id>   worker ids and their heartbeats (keys that expire)
    samples, samples:processing:<worker>, sample:<id>   sampling jobs
    samplers, sampler:alive:<id>   sampler worker ids and heartbeats; `sampler:modules:<id>`
                         the LoRA modules its backend serves
    sampler-session:<id> string a sampling session's snapshot (survives trainer restarts)

A write-once value is SET NX plus a push on its notification list; a waiter blocks on that list
with BLMOVE from the list to itself (a rotation), which wakes every waiter and consumes nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
import uuid
from typing import Any

import redis

from server.protocol.futures import LONG_POLL_SECONDS, RESULT_TTL_SECONDS, FutureRecord

log = logging.getLogger(__name__)

REPLY_TTL_SECONDS = 3600
RESOLVE_RETRY_SECONDS = 300.0
"""How long a result is retried while Redis restarts (its pod is rescheduled within this)."""
FUTURE_TTL_SECONDS = 7 * 24 * 3600
"""An unresolved future's metadata outlives any realistic queue; resolution shortens it."""

PUBLISH_ONCE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'EX', ARGV[2]) then
  redis.call('RPUSH', KEYS[2], '1')
  redis.call('EXPIRE', KEYS[2], ARGV[2])
  return 1
end
return 0
"""

ACK_UNLOGGED = """
if redis.call('LREM', KEYS[1], 0, ARGV[1]) > 0 then
  redis.call('DEL', KEYS[2])
  return 1
end
return 0
"""


def owner_tag(owner: str) -> str:
    """A key's name in Redis key names: a digest, so no API key is spelled in a key name."""
    return hashlib.sha256(owner.encode()).hexdigest()[:24]


class Keys:
    """Key names under one prefix (several deployments may share a Redis)."""

    def __init__(self, prefix: str = "ar"):
        self.prefix = prefix

    def __call__(self, *parts: str) -> str:
        return ":".join((self.prefix, *parts))

    @property
    def shared_ops(self) -> str:
        return self("ops")

    def queue(self, trainer: str) -> str:
        return self("ops", "queue", trainer)

    def taken(self, trainer: str) -> str:
        return self("ops", "taken", trainer)

    def placement(self, session_id: str) -> str:
        return self("placement", session_id)

    def owned(self, trainer: str) -> str:
        return self("trainer", "sessions", trainer)

    def op(self, op_id: str) -> str:
        return self("op", op_id)

    def claim(self, op_id: str) -> str:
        return self("claim", op_id)

    def reply(self, op_id: str) -> str:
        return self("reply", op_id)

    def future(self, request_id: str) -> str:
        return self("future", request_id)

    def result(self, request_id: str) -> str:
        return self("result", request_id)

    def control_log(self, session_id: str) -> str:
        return self("log", "control", session_id)

    def run_log(self, run_id: str) -> str:
        return self("log", "run", run_id)

    def run_save(self, run_id: str) -> str:
        return self("save", "run", run_id)

    def key_runs(self, owner: str) -> str:
        """The run ids an API key holds on any trainer (its run quota counts them)."""
        return self("key", owner_tag(owner), "runs")

    def key_backlog(self, owner: str) -> str:
        """Each trainer's queued tokens for an API key (its queue quota sums them)."""
        return self("key", owner_tag(owner), "queued")

    def alive(self, role: str, worker_id: str) -> str:
        return self(role, "alive", worker_id)

    def members(self, role: str) -> str:
        return self(role + "s")

    @property
    def trainer_load(self) -> str:
        """Each trainer's load: tokens trained, sampled and queued over the last minute."""
        return self("trainer", "load")

    @property
    def samples(self) -> str:
        return self("samples")

    def samples_processing(self, worker_id: str) -> str:
        return self("samples", "processing", worker_id)

    def sample(self, job_id: str) -> str:
        return self("sample", job_id)

    def sampler_modules(self, worker_id: str) -> str:
        return self("sampler", "modules", worker_id)

    def sampler_session(self, sampler_id: str) -> str:
        return self("sampler-session", sampler_id)

    @property
    def stats(self) -> str:
        return self("stats")


# ----------------------------------------------------------------- encodings
def encode_result(json_result: Any = None, proto: bytes | None = None,
                  error: str | None = None, category: str = "user") -> bytes:
    """A future's result as one value: a tag byte, then JSON or protobuf bytes."""
    if error is not None:
        return b"E" + json.dumps({"error": error, "category": category}).encode()
    if proto is not None:
        return b"P" + proto
    return b"J" + json.dumps(json_result).encode()


def decode_result(value: bytes) -> tuple[str, Any]:
    """(`json` | `proto` | `error`, payload)."""
    tag, payload = value[:1], value[1:]
    if tag == b"P":
        return "proto", payload
    if tag == b"E":
        return "error", json.loads(payload)
    return "json", json.loads(payload)


def encode_reply(status: int, media_type: str, body: bytes) -> bytes:
    return json.dumps({"status": status, "media_type": media_type}).encode() + b"\n" + body


def decode_reply(value: bytes) -> tuple[int, str, bytes]:
    head, _, body = value.partition(b"\n")
    meta = json.loads(head)
    return int(meta["status"]), str(meta["media_type"]), body


SOCKET_TIMEOUT_SECONDS = 60.0
"""Longer than any blocking command here (at most 25 s), so only a dead connection times out."""


def connect(url: str) -> redis.Redis:
    """A thread-safe client whose socket timeout leaves room for blocking commands."""
    return redis.Redis.from_url(url, socket_timeout=SOCKET_TIMEOUT_SECONDS,
                                socket_keepalive=True, health_check_interval=30)


class Store:
    """Synchronous Redis operations used by the trainer and sampler workers (any thread)."""

    def __init__(self, client: redis.Redis, keys: Keys):
        self.redis = client
        self.keys = keys
        self._publish_once = client.register_script(PUBLISH_ONCE)
        self._ack_unlogged = client.register_script(ACK_UNLOGGED)

    def publish_once(self, key: str, value: bytes, ttl: int) -> bool:
        """Write `key` unless it already has a value; wake its waiters. True if written."""
        written = bool(self._publish_once(keys=[key, key + ":n"], args=[value, ttl]))
        if not written:
            self.redis.hincrby(self.keys.stats, "duplicate_writes_suppressed", 1)
        return written

    def ack_unlogged(self, processing: str, op_id: str) -> bool:
        """Drop an op that is done and was never journaled from the processing list."""
        return bool(self._ack_unlogged(keys=[processing, self.keys.op(op_id)], args=[op_id]))

    def heartbeat(self, role: str, worker_id: str, ttl: float) -> None:
        pipe = self.redis.pipeline()
        pipe.sadd(self.keys.members(role), worker_id)
        pipe.set(self.keys.alive(role, worker_id), str(time.time()), px=int(ttl * 1000))
        pipe.execute()

    def live_workers(self, role: str) -> list[str]:
        members = sorted(m.decode() for m in self.redis.smembers(self.keys.members(role)))
        if not members:
            return []
        alive = self.redis.mget([self.keys.alive(role, m) for m in members])
        return [m for m, beat in zip(members, alive, strict=True) if beat is not None]


class RedisFutureStore:
    """`server.protocol.futures.FutureStore`'s interface, with futures and results kept in Redis.

    A future's request id is the id of the op that created it (`current_op`, set by the
    trainer's dispatcher), so replaying an op addresses the same future, whose result the replay
    cannot overwrite.
    """

    def __init__(self, store: Store):
        self.store = store
        self.keys = store.keys
        self.current_op: str | None = None
        self.taken: str | None = None
        """The trainer's list of taken ops, where a locally sampled op waits for its result."""
        self.last_created: FutureRecord | None = None

    def bind(self, loop: object) -> None:
        """Results go to Redis, not to an event loop: nothing to bind."""

    def create(self, owner: str, kind: str) -> FutureRecord:
        request_id = self.current_op or f"req-{uuid.uuid4().hex}"
        record = FutureRecord(request_id, owner, kind)
        self.last_created = record
        key = self.keys.future(request_id)
        pipe = self.store.redis.pipeline()
        pipe.hsetnx(key, "owner", owner)
        pipe.hsetnx(key, "kind", kind)
        created, _ = pipe.execute()
        if created:  # a replay keeps the original future (and its expiry) untouched
            self.store.redis.expire(key, FUTURE_TTL_SECONDS)
        return record

    def get(self, request_id: str) -> FutureRecord | None:
        meta = self.store.redis.hgetall(self.keys.future(request_id))
        if not meta:
            return None
        record = FutureRecord(request_id, meta[b"owner"].decode(), meta[b"kind"].decode())
        value = self.store.redis.get(self.keys.result(request_id))
        if value is not None:
            self._fill(record, value)
        return record

    @staticmethod
    def _fill(record: FutureRecord, value: bytes) -> None:
        kind, payload = decode_result(value)
        if kind == "proto":
            record.proto_result = payload
        elif kind == "error":
            record.error, record.category = payload["error"], payload["category"]
        else:
            record.json_result = payload
        record.done.set()

    def _resolve(self, record: FutureRecord, value: bytes) -> None:
        """Store a result; while Redis is away (restarting), retry rather than lose it: the op
        that produced it is already applied and will not run again."""
        deadline = time.monotonic() + RESOLVE_RETRY_SECONDS
        while True:
            try:
                self.store.publish_once(self.keys.result(record.request_id), value,
                                        int(RESULT_TTL_SECONDS))
                self.store.redis.expire(self.keys.future(record.request_id),
                                        int(RESULT_TTL_SECONDS))
                if record.kind == "sample" and self.taken:  # never journaled: taken until now
                    self.store.ack_unlogged(self.taken, record.request_id)
                break
            except (redis.ConnectionError, redis.TimeoutError):
                if time.monotonic() > deadline:
                    raise
                log.warning("Redis unavailable while storing result %s; retrying",
                            record.request_id)
                time.sleep(0.5)
        self._fill(record, value)

    def resolve_json(self, record: FutureRecord, result: dict[str, Any]) -> None:
        self._resolve(record, encode_result(json_result=result))

    def resolve_proto(self, record: FutureRecord, payload: bytes) -> None:
        self._resolve(record, encode_result(proto=payload))

    def fail(self, record: FutureRecord, message: str, category: str = "user") -> None:
        self._resolve(record, encode_result(error=message, category=category))

    async def wait(self, record: FutureRecord, timeout: float = LONG_POLL_SECONDS) -> bool:
        key = self.keys.result(record.request_id)

        def block() -> bytes | None:
            value = self.store.redis.get(key)
            if value is None:
                self.store.redis.blmove(key + ":n", key + ":n", timeout, "RIGHT", "LEFT")
                value = self.store.redis.get(key)
            return value

        value = await asyncio.to_thread(block)
        if value is None:
            return False
        self._fill(record, value)
        return True
