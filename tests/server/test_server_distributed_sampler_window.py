"""The split deployment's sampler worker gathers a burst of requests into one batch.

A client's requests reach the Redis queue over some milliseconds (through a gateway each); a
worker that took only what was queued the moment the first arrived decoded one request alone
and the rest in a second batch. It now waits, as the single-process scheduler does, for a
quiet spell (or its cap) before it starts, except for work that queued while it was busy.
"""

from __future__ import annotations

import json
import threading
import time

from server.distributed.sampler import SamplerWorker
from server.distributed.store import Keys, Store, connect
from server.protocol.codec import SampledSequence, SampleResult


class RecordingBackend:
    """Answers every job with one empty sequence and records each batch's size."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def sample(self, jobs):
        self.batches.append(len(jobs))
        return [SampleResult([SampledSequence([], [], False)]) for _ in jobs]


def _queue(store: Store, job_id: str) -> None:
    payload = {"request_id": job_id, "owner": "k", "adapter": None, "prompt": [2, 10, 11],
               "num_samples": 1, "params": {"max_tokens": 3, "temperature": 0.0, "stop": []},
               "prompt_logprobs": False, "topk_prompt_logprobs": 0, "topk_sample_logprobs": 0}
    store.redis.set(store.keys.sample(job_id), json.dumps(payload))
    store.redis.lpush(store.keys.samples, job_id)


def test_a_burst_that_arrives_over_milliseconds_is_sampled_in_one_batch(redis_url) -> None:
    store = Store(connect(redis_url), Keys("burst"))
    backend = RecordingBackend()
    worker = SamplerWorker(store, backend, worker_id="sampler-b", quiet_seconds=0.5,
                           gather_seconds=5.0)

    def client() -> None:  # six requests, 20 ms apart, after the worker is waiting
        time.sleep(0.1)
        for k in range(6):
            _queue(store, f"burst-{k}")
            time.sleep(0.02)

    sender = threading.Thread(target=client)
    sender.start()
    assert worker.run_once(block_seconds=5.0) == 6
    sender.join()
    assert backend.batches == [6]


def test_work_that_queued_while_the_worker_was_busy_goes_without_waiting(redis_url) -> None:
    store = Store(connect(redis_url), Keys("queued"))
    backend = RecordingBackend()
    worker = SamplerWorker(store, backend, worker_id="sampler-q", quiet_seconds=5.0,
                           gather_seconds=10.0)
    for k in range(3):
        _queue(store, f"queued-{k}")
    started = time.monotonic()
    assert worker.run_once(block_seconds=5.0) == 3
    assert time.monotonic() - started < 2.0  # not the 5 s quiet
    assert backend.batches == [3]
