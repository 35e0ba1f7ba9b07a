"""Run-state saves leave the engine thread: the state is copied between steps and written in
the background, file before pointer before the journal is trimmed, so a slow share never holds
the engine and a failed or unfinished write never loses a step or claims one it lacks.

The trainer's service runs in process against a real `redis-server`.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from server.distributed.journal import SavePoint, log_entry
from server.distributed.state_writer import StateWriter, host_copy
from server.distributed.store import Keys, RedisFutureStore, Store, connect
from server.distributed.trainer import DistributedService
from server.engine.engine import Engine
from server.engine.lora import LoraSpec
from server.storage.checkpoints import CheckpointStore
from tests.server.server_helpers import NEEDS_REDIS

pytestmark = NEEDS_REDIS
RUN = "sess-s:train:0"


@pytest.fixture
def service(engine: Engine, redis_url: str, tmp_path: Path, request):
    store = Store(connect(redis_url), Keys(request.node.name[:40]))
    service = DistributedService(engine, CheckpointStore(tmp_path / "data"),
                                 RedisFutureStore(store), store)
    state = engine.create_run(LoraSpec(rank=2), seed=5)
    service._state = lambda run: state  # type: ignore[method-assign]
    service.live_state = state  # type: ignore[attr-defined]
    try:
        yield service
    finally:
        service.writer.close(timeout=10)
        service.scheduler.stop()


def _journal(service: DistributedService, seqs: list[int]) -> None:
    for seq in seqs:
        service.redis.redis.rpush(service.keys.run_log(RUN), log_entry(f"op-{seq}", seq))
        service.redis.redis.hset(service.keys.op(f"op-{seq}"), "path", "/optim_step")


def _journaled(service: DistributedService) -> list[str]:
    return [e.decode() for e in service.redis.redis.lrange(service.keys.run_log(RUN), 0, -1)]


def test_a_slow_share_does_not_hold_the_engine_and_the_save_is_the_state_it_copied(service):
    run = SimpleNamespace(run_id=RUN)
    _journal(service, [1, 2, 3])
    release, started = threading.Event(), threading.Event()
    write = service.saves.write

    def slow_write(*args, **kwargs):
        started.set()
        release.wait(30)
        write(*args, **kwargs)

    service.saves.write = slow_write
    began = time.monotonic()
    future = service._save_run(run, 3)
    assert time.monotonic() - began < 5 and started.wait(10) and not future.done()
    live = service.live_state.adapter.a
    name = next(iter(live))
    copied = live[name].detach().clone()
    with torch.no_grad():
        live[name].add_(1.0)  # the engine's next step, while the write waits
    assert service.save_point(RUN) is None and len(_journaled(service)) == 3
    release.set()
    future.result(timeout=30)
    point = service.save_point(RUN)
    assert point is not None and point.next_seq == 3
    saved = torch.load(service.saves._dir(RUN) / point.file, weights_only=True)
    assert torch.equal(saved["a"][name], copied)
    assert _journaled(service) == ["op-3|3"]  # only what the save covers left the journal


def test_a_failed_write_keeps_the_previous_save_and_the_whole_journal(service):
    run = SimpleNamespace(run_id=RUN)
    _journal(service, [1, 2])
    service._save_run(run, 2).result(timeout=30)
    first = service.save_point(RUN)
    _journal(service, [3, 4])

    service.saves.write = lambda run_id, payload, point, **_: (_ for _ in ()).throw(
        OSError(28, "No space left on device"))
    with pytest.raises(OSError):
        service._save_run(run, 4).result(timeout=30)
    assert service.save_point(RUN) == first
    assert _journaled(service) == ["op-2|2", "op-3|3", "op-4|4"]


def test_a_run_freed_with_a_save_pending_leaves_no_state_behind(service):
    run = SimpleNamespace(run_id=RUN)
    release = threading.Event()
    write = service.saves.write
    service.saves.write = lambda *args, **kw: (release.wait(30), write(*args, **kw))
    service._save_run(run, 2)
    service._forget_run_journal(RUN)
    release.set()
    assert service.writer.flush(timeout=30)
    assert not service.saves._dir(RUN).exists() and service.save_point(RUN) is None


def test_waiting_copies_are_bounded_and_written_in_order():
    writer = StateWriter(max_pending=2)
    gate, order = threading.Event(), []
    writer.submit(lambda: (gate.wait(30), order.append(1)))
    writer.submit(lambda: order.append(2))
    third = threading.Thread(target=lambda: writer.submit(lambda: order.append(3)))
    third.start()
    third.join(timeout=0.5)
    assert third.is_alive()  # a full queue makes the next save wait: memory stays bounded
    gate.set()
    third.join(timeout=30)
    assert writer.flush(timeout=30) and order == [1, 2, 3]
    writer.close()


def test_a_host_copy_never_aliases_the_engines_tensors():
    live = {"w": torch.zeros(3), "nested": [torch.ones(2)], "step": 4}
    copy = host_copy(live)
    live["w"].add_(1)
    live["nested"][0].add_(1)
    assert torch.equal(copy["w"], torch.zeros(3)) and torch.equal(copy["nested"][0], torch.ones(2))
    assert copy["step"] == 4 and SavePoint(3).covers("x", 2)
