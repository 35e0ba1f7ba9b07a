"""Distributed mode keeps nothing forever either: a freed sampling session leaves Redis and the
shared snapshot storage, a dropped session leaves its journal and placement (so no take-over
replays it), and sessions restored after a restart are read lazily, inside the resident cap.

The trainer's service runs in process against a real `redis-server`; the journaling of ops is
exercised end to end by `test_server_distributed.py`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from server.distributed.journal import log_entry
from server.distributed.sampler import SamplerWorker
from server.distributed.store import Keys, RedisFutureStore, Store, connect, decode_result
from server.distributed.trainer import DistributedService, control_session
from server.engine.engine import Engine
from server.engine.lora import LoraSpec
from server.samplers.openai_http import VLLMUnavailable
from server.service.records import Sampler
from server.storage.checkpoints import CheckpointStore
from tests.server.server_helpers import NEEDS_REDIS

pytestmark = NEEDS_REDIS


def _service(engine: Engine, redis_url: str, data_dir: Path, prefix: str) -> DistributedService:
    store = Store(connect(redis_url), Keys(prefix))
    return DistributedService(engine, CheckpointStore(data_dir), RedisFutureStore(store), store)


def _sampler(engine: Engine, service: DistributedService, sampler_id: str, seed: int):
    adapter = engine.create_run(LoraSpec(rank=2), seed=seed).adapter.frozen_copy()
    with torch.no_grad():
        for b in adapter.b.values():
            b.normal_(0, 0.1)
    service._register_sampler(Sampler(sampler_id, "key-x", service.base_model, None, adapter))


def test_a_freed_sampling_session_leaves_redis_and_the_snapshot_store(engine, redis_url,
                                                                      tmp_path):
    service = _service(engine, redis_url, tmp_path / "data", "free")
    try:
        _sampler(engine, service, "sess-a:sample:0", seed=1)
        directory = service._sampler_dirs["sess-a:sample:0"]
        key = service.keys.sampler_session("sess-a:sample:0")
        assert directory.is_dir() and service.redis.redis.exists(key)
        service._free_sampler("sess-a:sample:0", "its session ended")
        assert not directory.exists()
        assert not service.redis.redis.exists(key)
    finally:
        service.scheduler.stop()


def test_a_dropped_session_leaves_its_journal_and_its_placement(engine, redis_url, tmp_path):
    service = _service(engine, redis_url, tmp_path / "data", "drop")
    service.worker_id = "trainer-x"
    redis, keys = service.redis.redis, service.keys
    try:
        for session_id, ops in (("sess-gone", ["op-1", "op-2"]), ("sess-kept", ["op-3"])):
            service.sessions[session_id] = service._new_session(session_id, "key-x", {})
            redis.set(keys.placement(session_id), "trainer-x")
            redis.sadd(keys.owned("trainer-x"), session_id)
            for op in ops:
                redis.rpush(keys.control_log(session_id), log_entry(op, None))
                redis.hset(keys.op(op), "path", "/create_model")
        service._drop_session(service.sessions["sess-gone"])
        assert not redis.exists(keys.control_log("sess-gone"))
        assert [e.decode() for e in redis.lrange(keys.control_log("sess-kept"), 0, -1)] == [
            "op-3|"]
        assert not redis.exists(keys.op("op-1")) and not redis.exists(keys.op("op-2"))
        assert redis.exists(keys.op("op-3"))
        assert not redis.exists(keys.placement("sess-gone"))
        assert redis.smembers(keys.owned("trainer-x")) == {b"sess-kept"}
        assert "sess-gone" not in service.sessions
    finally:
        service.scheduler.stop()


@pytest.mark.parametrize(("path", "body", "session"), [
    ("/create_session", b"{}", "sess-0123456789ab"),
    ("/create_model", b'{"session_id": "sess-x"}', "sess-x"),
    ("/create_sampling_session", b'{"session_id": "sess-y"}', "sess-y"),
    ("/load_weights", b'{"session_id": "sess-z", "path": "p"}', "sess-z"),
    ("/sessions/sess-w/finish", b"{}", "sess-w"),
    ("/training_runs/sess-v:train:0", b"", "sess-v"),
    ("/training_runs/copy-0123", b"", None),
    ("/sessions/not-a-session/finish", b"{}", None),
])
def test_every_control_op_is_indexed_under_its_session(path, body, session):
    assert control_session("op-0123456789abcdef", path, body) == session


def test_restored_sampling_sessions_are_read_lazily(engine, redis_url, tmp_path):
    first = _service(engine, redis_url, tmp_path / "data", "lazy")
    try:
        for k in range(3):
            _sampler(engine, first, f"sess-l:sample:{k}", seed=10 + k)
        gone = first._sampler_dirs["sess-l:sample:2"]
    finally:
        first.scheduler.stop()
    shutil.rmtree(gone)
    second = _service(engine, redis_url, tmp_path / "data", "lazy")
    try:
        second.restore_sampler_sessions()
        assert sorted(second.samplers) == ["sess-l:sample:0", "sess-l:sample:1"]
        assert second.sampler_cache.resident_count() == 0
        assert not second.redis.redis.exists(second.keys.sampler_session("sess-l:sample:2"))
        adapter = second.sampler_cache.get("sess-l:sample:0")
        assert second.sampler_cache.resident_count() == 1
        assert any(float(b.abs().sum()) > 0 for b in adapter.b.values())
    finally:
        second.scheduler.stop()


class _RestartingVLLM:
    """A backend that is unreachable for its first `down` calls (vLLM restarting)."""

    def __init__(self, engine: Engine, down: int):
        self.engine, self.down, self.calls = engine, down, 0

    def sample(self, jobs):
        self.calls += 1
        if self.calls <= self.down:
            raise VLLMUnavailable("vLLM at http://127.0.0.1:1 unreachable: connection refused")
        return self.engine.sample(jobs)


def test_a_sample_waits_for_a_restarting_vllm_instead_of_failing(engine, redis_url) -> None:
    store = Store(connect(redis_url), Keys("restart"))
    backend = _RestartingVLLM(engine, down=2)
    worker = SamplerWorker(store, backend, worker_id="sampler-r")
    payload = {"request_id": "req-1", "owner": "k", "adapter": None, "prompt": [2, 10, 11],
               "num_samples": 1, "params": {"max_tokens": 3, "temperature": 0.0, "stop": []},
               "prompt_logprobs": False, "topk_prompt_logprobs": 0, "topk_sample_logprobs": 0}
    store.redis.set(store.keys.sample("req-1"), json.dumps(payload))
    store.redis.lpush(store.keys.samples, "req-1")
    for _ in range(backend.down):
        with pytest.raises(VLLMUnavailable):
            worker.run_once()
        assert store.redis.get(store.keys.result("req-1")) is None  # not answered with an error
        assert worker.reclaim(include_own=True) == 1  # back in the queue (what `_loop` does)
    assert worker.run_once() == 1
    kind, _ = decode_result(store.redis.get(store.keys.result("req-1")))
    assert kind == "proto"
