"""Futures cannot pile up: finished results leave in finish order after their TTL or once
their bytes pass the budget, futures that never finish leave after theirs, and expiry looks
only at the oldest entries."""

from __future__ import annotations

import asyncio

import server.protocol.futures as futures_module
from server.protocol.futures import FutureStore


def _store(budget: int) -> FutureStore:
    store = FutureStore(budget_bytes=budget)
    loop = asyncio.new_event_loop()
    loop.close()  # completions are then accounted at once, as during a shutdown
    store.bind(loop)
    return store


def test_finished_results_past_the_byte_budget_go_oldest_first():
    store = _store(budget=5_000)
    records = []
    for _ in range(10):
        record = store.create("key", "sample")
        store.resolve_proto(record, b"x" * 1_000)
        records.append(record)
    store.create("key", "sample")  # expiry runs on creation too
    kept = [r for r in records if store.get(r.request_id) is not None]
    assert kept == records[-len(kept):] and 3 <= len(kept) <= 4
    assert store.held_bytes <= 5_000


def test_results_past_their_ttl_and_unfinished_futures_past_theirs_go(monkeypatch):
    store = _store(budget=1 << 30)
    finished = store.create("key", "optim_step")
    store.resolve_json(finished, {"metrics": {}})
    waiting = store.create("key", "forward_backward")
    monkeypatch.setattr(futures_module, "RESULT_TTL_SECONDS", -1.0)
    store.create("key", "sample")
    assert store.get(finished.request_id) is None
    assert store.get(waiting.request_id) is not None  # unfinished: its own, longer TTL
    monkeypatch.setattr(futures_module, "UNFINISHED_TTL_SECONDS", -1.0)
    fresh = store.create("key", "sample")
    assert store.get(waiting.request_id) is None
    assert len(store) == 1 and store.get(fresh.request_id) is fresh
