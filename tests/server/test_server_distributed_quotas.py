"""Per-key quotas hold across every trainer, not per trainer: a key's runs are counted in Redis
(admitted atomically below the limit, released when freed), and its queued tokens are summed
over the live trainers, each publishing its own with its heartbeat.

Two trainer services run in process against a real `redis-server`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from server.distributed.store import Keys, RedisFutureStore, Store, connect
from server.distributed.trainer import DistributedService
from server.engine.engine import Engine
from server.service.errors import Backpressure, QuotaExceeded
from server.service.records import Limits
from server.storage.checkpoints import CheckpointStore
from tests.server.server_helpers import NEEDS_REDIS

pytestmark = NEEDS_REDIS
KEY = "tml-quota-key"


@pytest.fixture
def trainers(engine: Engine, redis_url: str, tmp_path: Path, request):
    prefix = request.node.name[:40]
    made = []
    for name in ("a", "b"):
        store = Store(connect(redis_url), Keys(prefix))
        service = DistributedService(
            engine, CheckpointStore(tmp_path / "data"), RedisFutureStore(store), store,
            limits=Limits(max_runs_per_key=2, max_queued_tokens_per_key=1000))
        service.worker_id = f"trainer-{name}"
        store.heartbeat("trainer", service.worker_id, 30)
        made.append(service)
    yield made
    for service in made:
        service.writer.close(timeout=10)
        service.scheduler.stop()


def test_a_keys_run_limit_counts_its_runs_on_every_trainer(trainers):
    a, b = trainers
    a._check_run_quota(KEY, "sess-1:train:0")
    b._check_run_quota(KEY, "sess-2:train:0")
    with pytest.raises(QuotaExceeded):
        a._check_run_quota(KEY, "sess-1:train:1")  # a holds one run, the key two
    b._check_run_quota(KEY, "sess-2:train:0")  # a replay or retry of a counted run: admitted
    b._check_run_quota("tml-another-key", "sess-3:train:0")  # other keys are not counted
    a._forget_run_journal("sess-1:train:0", KEY)  # freed: its place is given back
    b._check_run_quota(KEY, "sess-2:train:1")


def test_a_keys_queued_tokens_are_summed_over_the_live_trainers(trainers, monkeypatch):
    a, b = trainers
    monkeypatch.setattr(a.scheduler, "queued_tokens_by_owner", lambda: {KEY: 900})
    a.publish_backlog()
    with pytest.raises(Backpressure, match="900 tokens queued"):
        b._check_backlog(KEY, 200)  # b has nothing queued itself
    b._check_backlog(KEY, 100)
    # A trainer that is gone no longer counts (its queue moved to whoever took it over).
    b.redis.redis.delete(b.keys.alive("trainer", a.worker_id))
    b._check_backlog(KEY, 200)
    # Once a's queue drains, what it published goes too.
    monkeypatch.setattr(a.scheduler, "queued_tokens_by_owner", lambda: {})
    a.publish_backlog()
    assert not b.redis.redis.hgetall(b.keys.key_backlog(KEY))
