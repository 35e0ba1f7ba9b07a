"""Fair queuing across keys: a burst one key is allowed cannot make another key's call wait
behind it, in training or in sampling.

The scheduler runs against a recording engine that holds its first call until every request is
queued, so the batches it forms are deterministic; the latency bound those batches imply is
measured against the real engine in `bench/bench_fairness.py`.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

from server.engine.engine import ForwardBackwardJob, SampleJob, SamplingParams
from server.engine.lora import AdapterWeights, LoraSpec
from server.scheduling.scheduler import Scheduler, Work
from tests.server.recording_engine import RecordingEngine


def _job(owner: str, tokens: int) -> ForwardBackwardJob:
    job = ForwardBackwardJob(SimpleNamespace(adapter=AdapterWeights(LoraSpec(rank=1))), [None],
                             "cross_entropy", {}, False)
    job.owner, job.tokens = owner, tokens  # read back by the recording engine
    return job


def _scheduler(engine: RecordingEngine, share: int) -> Scheduler:
    scheduler = Scheduler(engine, key_share_tokens=share)
    scheduler.train_quiet_seconds = scheduler.sample_quiet_seconds = 0.0
    return scheduler


def _train(scheduler: Scheduler, done: threading.Semaphore, run: str, owner: str,
           tokens: int, seq_id: int = 1) -> None:
    """Queue one forward_backward of `tokens` for `owner`'s `run` (its stream opened once)."""
    if seq_id == 1:
        scheduler.open_stream(run)
    scheduler.submit_ordered(Work(run, "fb", lambda *_: done.release(),
                                  job=_job(owner, tokens), seq_id=seq_id, tokens=tokens,
                                  owner=owner))


def _hold(scheduler: Scheduler, engine: RecordingEngine, done: threading.Semaphore,
          owner: str) -> None:
    """Put the engine inside a first batch, so what is queued next is taken in one turn."""
    _train(scheduler, done, "hold", owner, 1)
    assert engine.entered.wait(10)


def test_a_training_burst_of_one_key_does_not_ride_with_another_keys_call():
    engine = RecordingEngine()
    scheduler = _scheduler(engine, share=1000)
    done = threading.Semaphore(0)
    try:
        _hold(scheduler, engine, done, "holder")
        for run in ("burst-1", "burst-2", "burst-3"):
            for seq in range(1, 11):
                _train(scheduler, done, run, "burst", 400, seq)
        _train(scheduler, done, "victim", "victim", 50)
        engine.gate.set()
        for _ in range(1 + 30 + 1):
            assert done.acquire(timeout=30)
    finally:
        scheduler.stop()
    with_victim = next(b for b in engine.batches if ("victim", 50) in b)
    burst_tokens = sum(t for owner, t in with_victim if owner == "burst")
    assert burst_tokens <= 1000, with_victim
    assert engine.batches.index(with_victim) == 1  # the first batch after the held one
    for batch in engine.batches:  # a batch that two keys share holds each within its share
        if len({owner for owner, _ in batch}) < 2:
            continue
        per_key: dict[str, int] = {}
        for owner, tokens in batch:
            per_key[owner] = per_key.get(owner, 0) + tokens
        assert all(t <= 1000 or sum(o == k for o, _ in batch) == 1
                   for k, t in per_key.items()), batch


def test_sample_requests_are_taken_round_robin_across_keys():
    engine = RecordingEngine()
    scheduler = _scheduler(engine, share=1000)
    scheduler.max_sample_rows = 8
    done = threading.Semaphore(0)

    def sample(owner: str) -> Work:
        job = SampleJob(None, [1, 2], 2, SamplingParams(max_tokens=1))
        job.owner = owner  # read back by the recording engine
        return Work(None, "sample", lambda *_: done.release(), sample=job, tokens=4,
                    owner=owner)

    try:
        scheduler.submit_sample(sample("holder"))
        assert engine.entered.wait(10)
        for _ in range(40):
            scheduler.submit_sample(sample("burst"))
        scheduler.submit_sample(sample("victim"))
        engine.gate.set()
        for _ in range(42):
            assert done.acquire(timeout=30)
    finally:
        scheduler.stop()
    assert ("victim", 2) in engine.batches[1], engine.batches[:3]


def test_one_keys_runs_alone_fuse_without_a_share():
    """The share is for sharing: a study's parallel trials under one key still fuse fully."""
    engine = RecordingEngine()
    scheduler = _scheduler(engine, share=1000)
    done = threading.Semaphore(0)
    try:
        _hold(scheduler, engine, done, "study")
        for run in ("trial-1", "trial-2", "trial-3"):
            _train(scheduler, done, run, "study", 900)
        engine.gate.set()
        for _ in range(4):
            assert done.acquire(timeout=30)
    finally:
        scheduler.stop()
    assert engine.batches[1] == [("study", 900)] * 3
