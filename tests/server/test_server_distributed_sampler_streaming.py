"""A sampler worker on a backend that batches continuously (vLLM) streams its jobs: each is
started as it is taken, at most `max_in_flight` at once, and its result is stored as soon as it
comes, so a fast job never waits for a slow one taken beside it. A job the backend cannot take
right now (vLLM restarting) goes back to the queue and is answered once it is back.

Against a real `redis-server`, with backends that stand in for vLLM's timing.
"""

from __future__ import annotations

import json
import threading
import time

from server.distributed.sampler import SamplerWorker
from server.distributed.store import Keys, Store, connect
from server.protocol.codec import SampledSequence, SampleResult
from server.samplers.openai_http import VLLMUnavailable
from tools.processes import wait_until


class TimedBackend:
    """Takes as long as its prompt's first token says (in 10 ms units); counts jobs in flight."""

    streams = True

    def __init__(self, unavailable_first: int = 0) -> None:
        self.lock = threading.Lock()
        self.in_flight = self.most_in_flight = 0
        self.calls: list[int] = []
        self.unavailable_left = unavailable_first

    def sample(self, jobs):
        with self.lock:
            if self.unavailable_left:
                self.unavailable_left -= 1
                raise VLLMUnavailable("vLLM at http://127.0.0.1:1 unreachable")
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.calls.append(len(jobs))
        try:
            time.sleep(jobs[0].prompt[0] / 100)
            return [SampleResult([SampledSequence([7], [0.0], False)]) for _ in jobs]
        finally:
            with self.lock:
                self.in_flight -= 1


def _queue(store: Store, job_id: str, centiseconds: int) -> None:
    payload = {"request_id": job_id, "owner": "k", "adapter": None,
               "prompt": [centiseconds, 10, 11], "num_samples": 1,
               "params": {"max_tokens": 3, "temperature": 0.0, "stop": []},
               "prompt_logprobs": False, "topk_prompt_logprobs": 0, "topk_sample_logprobs": 0}
    store.redis.set(store.keys.sample(job_id), json.dumps(payload))
    store.redis.lpush(store.keys.samples, job_id)


def _done(store: Store, job_id: str) -> bool:
    return store.redis.exists(store.keys.result(job_id)) == 1


def test_a_fast_job_is_answered_while_a_slow_one_taken_before_it_still_runs(redis_url) -> None:
    store = Store(connect(redis_url), Keys("stream"))
    backend = TimedBackend()
    worker = SamplerWorker(store, backend, worker_id="sampler-s", heartbeat_ttl=2.0).start()
    try:
        _queue(store, "slow", 300)  # 3 s
        _queue(store, "fast", 5)
        wait_until(lambda: _done(store, "fast"), timeout=10, what="the fast job's result")
        assert not _done(store, "slow")  # a batch would have held the fast one 3 s
        wait_until(lambda: _done(store, "slow"), timeout=10, what="the slow job's result")
        assert backend.calls == [1, 1]  # one request each, as vLLM is sent them
    finally:
        worker.stop()
    assert store.redis.llen(worker.processing) == 0


def test_no_more_than_max_in_flight_jobs_run_at_once(redis_url) -> None:
    store = Store(connect(redis_url), Keys("bound"))
    backend = TimedBackend()
    worker = SamplerWorker(store, backend, worker_id="sampler-m", heartbeat_ttl=2.0,
                           max_in_flight=2).start()
    try:
        for k in range(6):
            _queue(store, f"job-{k}", 30)
        wait_until(lambda: all(_done(store, f"job-{k}") for k in range(6)), timeout=20,
                   what="six results")
    finally:
        worker.stop()
    assert backend.most_in_flight == 2 and len(backend.calls) == 6


def test_a_job_the_backend_cannot_take_yet_goes_back_and_is_answered_later(redis_url) -> None:
    store = Store(connect(redis_url), Keys("away"))
    backend = TimedBackend(unavailable_first=2)
    worker = SamplerWorker(store, backend, worker_id="sampler-u", heartbeat_ttl=2.0).start()
    try:
        _queue(store, "retried", 1)
        wait_until(lambda: _done(store, "retried"), timeout=20, what="the retried job")
    finally:
        worker.stop()
    assert backend.unavailable_left == 0 and backend.calls == [1]
    assert store.redis.llen(worker.processing) == 0 and store.redis.llen(store.keys.samples) == 0
