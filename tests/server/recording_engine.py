"""An engine stand-in for scheduler tests: it records the batches it is given and holds its
first call until the test has queued everything, so the batches a scheduler forms are
deterministic."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from server.protocol.codec import SampledSequence, SampleResult


class RecordingEngine:
    """Stands in for the engine: records each batch's owners and token counts."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[str, int]]] = []
        self.gate = threading.Event()
        self.entered = threading.Event()

    def forward_backward(self, jobs):
        self.entered.set()
        self.gate.wait(30)
        self.batches.append([(job.owner, job.tokens) for job in jobs])
        return [SimpleNamespace(outputs=[], metrics={}) for _ in jobs]

    def sample(self, jobs):
        self.entered.set()
        self.gate.wait(30)
        self.batches.append([(job.owner, job.num_samples) for job in jobs])
        return [SampleResult([SampledSequence([], [], False)]) for _ in jobs]
