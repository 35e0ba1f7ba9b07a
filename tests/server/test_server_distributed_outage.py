"""A Redis outage costs the trainers time, not their sessions; a trainer that lost a session
cannot write for it.

Two trainer replicas run in process against a real `redis-server` with its append-only file, so
stopping it and starting it again is a Redis pod rescheduled: every heartbeat has lapsed when it
returns. Neither replica exits or takes the other over; a replica that really stops beating is
still taken over, and when it answers again every write it tries for the moved session (a
journal entry, a save's pointer) is refused by the session's placement, and it drops the
session and rejoins empty.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import torch

from server.distributed.journal import SavePoint, Target, log_entry
from server.distributed.store import Keys, RedisFutureStore, Store, connect
from server.distributed.trainer import DistributedService, SessionLost, TrainerWorker
from server.engine.engine import Engine
from server.engine.lora import LoraSpec
from server.entrypoints.runtime import free_port
from server.service.records import Sampler
from server.storage.checkpoints import CheckpointStore
from tests.server.server_helpers import NEEDS_REDIS, wait_until

pytestmark = NEEDS_REDIS
TTL = 1.0
SESSION = "sess-outage"


class PersistentRedis:
    """A `redis-server` with an append-only file that can be stopped and started again on the
    same port and data, as a rescheduled Redis pod with its disk re-attached."""

    def __init__(self, directory: Path):
        self.directory, self.port = directory, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.directory)],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        client = redis.Redis.from_url(self.url)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        wait_until(answers, 20, "redis-server to answer", interval=0.05)

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()  # as a pod's SIGTERM: the append-only file is flushed
            self.process.wait(timeout=30)
            self.process = None


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PersistentRedis]:
    server = PersistentRedis(tmp_path)
    server.start()
    yield server
    server.stop()


def _worker(engine: Engine, url: str, data_dir: Path, name: str) -> TrainerWorker:
    store = Store(connect(url), Keys("ar"))
    service = DistributedService(engine, CheckpointStore(data_dir), RedisFutureStore(store),
                                 store)
    return TrainerWorker(service, worker_id=name, heartbeat_ttl=TTL)


def _hold_session(worker: TrainerWorker, engine: Engine) -> None:
    """Place SESSION on `worker` with a journal entry, a session record and a sampler."""
    client, keys, service = worker.store.redis, worker.keys, worker.service
    client.set(keys.placement(SESSION), worker.worker_id)
    client.sadd(keys.owned(worker.worker_id), SESSION)
    client.rpush(keys.control_log(SESSION), log_entry("op-create", None))
    service.sessions[SESSION] = service._new_session(SESSION, "key-x", {})
    adapter = engine.create_run(LoraSpec(rank=2), seed=1).adapter.frozen_copy()
    service._register_sampler(Sampler(f"{SESSION}:sample:0", "key-x", service.base_model, None,
                                      adapter))


def test_a_redis_outage_longer_than_the_heartbeat_moves_no_session(engine, server, tmp_path):
    a = _worker(engine, server.url, tmp_path / "data", "a").start()
    b = _worker(engine, server.url, tmp_path / "data", "b").start()
    try:
        _hold_session(a, engine)
        wait_until(lambda: a.recovered.is_set() and b.recovered.is_set(), 60, "recovery")
        server.stop()
        time.sleep(6 * TTL)  # every heartbeat lapses while Redis is away
        assert a.connected_for() == 0.0 and b.connected_for() == 0.0
        ready, detail = a.readiness()  # not ready while Redis is away, and no exception
        assert not ready and detail["redis_reachable"] is False
        server.start()
        client = redis.Redis.from_url(server.url)
        wait_until(lambda: a.connected_for() > 3 * TTL and b.connected_for() > 3 * TTL,
                   30, "both trainers to reach Redis again")
        assert client.get(f"ar:placement:{SESSION}") == a.worker_id.encode()
        assert a.taken_over == [] and b.taken_over == [] and a.rejoins == b.rejoins == 0
        assert SESSION in a.service.sessions and not a.service.lost_sessions
        assert all(client.exists(f"ar:trainer:alive:{w.worker_id}") for w in (a, b))
        assert a.readiness()[0] and b.readiness()[0]
    finally:
        a.stop(save=False)
        b.stop(save=False)


def test_a_replica_taken_over_cannot_write_and_rejoins_empty(engine, server, tmp_path):
    a = _worker(engine, server.url, tmp_path / "data", "a").start()
    b = _worker(engine, server.url, tmp_path / "data", "b").start()
    client = redis.Redis.from_url(server.url)
    try:
        _hold_session(a, engine)
        wait_until(lambda: b.recovered.is_set(), 60, "b's recovery")
        # a is cut off: it stops beating, its lease lapses, b takes SESSION over.
        a._stop.set()
        a._heart.join(timeout=10)
        wait_until(lambda: client.get(f"ar:placement:{SESSION}") == b.worker_id.encode(),
                   30, "b to take the session over")
        journal = client.lrange(f"ar:log:control:{SESSION}", 0, -1)

        # a answers again: each write it tries for SESSION is refused by the placement.
        run_id = f"{SESSION}:train:0"
        target = Target(run_id, 3)
        assert not a._acknowledge("op-late", "POST", "/optim_step", b"{}", target, False)
        assert not client.exists(f"ar:log:run:{run_id}")
        point = SavePoint(4)
        with pytest.raises(SessionLost):
            a.service._write_save(run_id, {"steps": 3}, point)
        assert not client.exists(f"ar:save:run:{run_id}")
        assert not (a.service.saves._dir(run_id) / point.file).exists()

        # Its next heartbeat finds it no member: it drops what it held and joins again.
        assert a.beat_once() and a.rejoins == 1
        assert client.sismember("ar:trainers", a.worker_id)
        wait_until(lambda: SESSION not in a.service.sessions
                   and not any(s.startswith(SESSION) for s in a.service.samplers),
                   30, "a to drop the moved session")
        # What it dropped was only its memory: the journal and the sampler are b's now.
        assert client.lrange(f"ar:log:control:{SESSION}", 0, -1) == journal
        assert client.exists(f"ar:sampler-session:{SESSION}:sample:0")
        assert client.get(f"ar:placement:{SESSION}") == b.worker_id.encode()
    finally:
        a.stop(save=False)
        b.stop(save=False)


def test_a_save_is_pointed_to_only_with_the_journal_trim_it_allows(engine, server, tmp_path):
    worker = _worker(engine, server.url, tmp_path / "data", "a")
    client, service = worker.store.redis, worker.service
    run_id = f"{SESSION}:train:0"
    client.set(f"ar:placement:{SESSION}", worker.worker_id)
    for seq in (1, 2, 3):
        client.rpush(f"ar:log:run:{run_id}", log_entry(f"op-{seq}", seq))
    state = engine.create_run(LoraSpec(rank=2), seed=2)
    service._write_save(run_id, service.saves.snapshot(state), SavePoint(3))
    point = service.save_point(run_id)
    assert point is not None and point.next_seq == 3 and worker.worker_id in point.file
    assert client.lrange(f"ar:log:run:{run_id}", 0, -1) == [b"op-3|3"]
    restored = service.saves.load(run_id, point, engine)
    name = next(iter(state.adapter.a))
    assert torch.equal(restored.adapter.a[name], state.adapter.a[name])
    worker.service.scheduler.stop()
    worker.service.writer.close()
