"""Several runs' samples meet in one batch when their clients step, save and sample together.

A client's RL step ends with an optimizer step and a weight save before its next samples. When
several runs do this at once, the first run's sample requests reach the scheduler while the
others' saves still wait in their streams; sampling at once would decode each run in a batch of
its own (four runs' second steps took four batches, `bench/bench_fused_runs.py`). The scheduler
runs such ready actions while sample requests are still arriving, so the runs meet.
"""

from __future__ import annotations

import threading

from server.engine.engine import SampleJob, SamplingParams
from server.scheduling.scheduler import Scheduler, Work
from tests.server.recording_engine import RecordingEngine


def test_ready_saves_run_while_samples_gather_so_every_runs_samples_share_a_batch():
    engine = RecordingEngine()
    engine.gate.set()
    scheduler = Scheduler(engine)
    scheduler.sample_quiet_seconds, scheduler.sample_gather_seconds = 1.0, 10.0
    done = threading.Semaphore(0)
    held, release = threading.Event(), threading.Event()

    def sample(owner: str) -> Work:
        job = SampleJob(None, [1, 2], 8, SamplingParams(max_tokens=1))
        job.owner = owner  # read back by the recording engine
        return Work(None, "sample", lambda *_: done.release(), sample=job, tokens=2,
                    owner=owner)

    def save_then_sample(owner: str):
        """A run's weight save, after which its client sends its samples."""
        return lambda: scheduler.submit_sample(sample(owner))

    def hold() -> None:
        held.set()
        release.wait(30)

    def ordered(run: str, action) -> None:
        scheduler.open_stream(run)
        scheduler.submit_ordered(Work(run, "save_weights", lambda *_: done.release(),
                                      action=action, seq_id=1, owner=run))

    try:
        ordered("holder", hold)  # the engine busy with a step of another run
        assert held.wait(10)
        scheduler.submit_sample(sample("a"))  # run a saved first and sent its samples
        for run in ("b", "c", "d"):
            ordered(run, save_then_sample(run))
        release.set()
        for _ in range(1 + 3 + 4):
            assert done.acquire(timeout=30)
    finally:
        scheduler.stop()
    assert engine.batches == [[("a", 8), ("b", 8), ("c", 8), ("d", 8)]], engine.batches
