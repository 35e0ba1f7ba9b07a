"""Observability: Prometheus metrics and the engine's duty cycle.

Each server owns its own `CollectorRegistry` (several servers can live in one process, as in
tests). The duty cycle is the fraction of wall time the engine spent computing, over a sliding
window: it is the number that says whether clients keep the accelerator busy while they
compute rewards.
"""

from __future__ import annotations

import collections
import threading
import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class DutyCycle:
    """Busy intervals of the engine thread, summarised over a sliding window."""

    def __init__(self, window_seconds: float = 60.0):
        self.window = window_seconds
        self._intervals: collections.deque[tuple[float, float]] = collections.deque()
        self._lock = threading.Lock()
        self._busy_since: float | None = None
        self.started = time.monotonic()

    def begin(self) -> None:
        self._busy_since = time.monotonic()

    def end(self) -> None:
        if self._busy_since is None:
            return
        now = time.monotonic()
        with self._lock:
            self._intervals.append((self._busy_since, now))
            while self._intervals and self._intervals[0][1] < now - self.window:
                self._intervals.popleft()
        self._busy_since = None

    def fraction(self, window: float | None = None, now: float | None = None) -> float:
        """Busy share of the last `window` seconds (counting a batch still running)."""
        now = time.monotonic() if now is None else now
        span = min(window or self.window, now - self.started)
        if span <= 0:
            return 0.0
        start = now - span
        with self._lock:
            intervals = list(self._intervals)
        if self._busy_since is not None:
            intervals.append((self._busy_since, now))
        busy = sum(max(0.0, min(b, now) - max(a, start)) for a, b in intervals)
        return min(1.0, busy / span)


def fallbacks_counter(registry: CollectorRegistry, reasons: tuple[str, ...] = ()) -> Counter:
    """`autoresearch_sampler_fallbacks_total{reason}`, the same series wherever vLLM samples (a
    sampler worker, the single process beside its engine); `reasons` start at zero."""
    counter = Counter(
        "autoresearch_sampler_fallbacks",
        "Sampling requests served by the torch sampler instead of vLLM, by reason",
        ["reason"],
        registry=registry,
    )
    for reason in reasons:
        counter.labels(reason)
    return counter


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.queue_depth = Gauge(
            "autoresearch_queue_depth", "Requests waiting, per training run", ["run_id"], registry=r
        )
        self.sampling_queue = Gauge(
            "autoresearch_sampling_queue_depth", "Sample requests waiting", registry=r
        )
        self.batch_rows = Histogram(
            "autoresearch_batch_rows",
            "Rows per engine batch",
            ["kind"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
            registry=r,
        )
        self.batch_runs = Histogram(
            "autoresearch_batch_runs",
            "Distinct runs fused per batch",
            ["kind"],
            buckets=(1, 2, 3, 4, 6, 8, 16, 32),
            registry=r,
        )
        self.tokens = Counter("autoresearch_tokens", "Tokens processed", ["kind"], registry=r)
        self.tokens_per_second = Gauge(
            "autoresearch_tokens_per_second",
            "Tokens per second over the last minute",
            ["kind"],
            registry=r,
        )
        self.duty_cycle = Gauge(
            "autoresearch_engine_duty_cycle",
            "Fraction of wall time the engine computed (last minute)",
            registry=r,
        )
        self.resident_adapters = Gauge(
            "autoresearch_resident_adapters",
            "Training runs whose adapter is in device memory",
            registry=r,
        )
        self.resident_samplers = Gauge(
            "autoresearch_resident_sampler_snapshots",
            "Sampler snapshots whose weights are in memory (older ones wait on disk)",
            registry=r,
        )
        self.evictions = Counter(
            "autoresearch_evictions", "Runs evicted from device memory", registry=r
        )
        self.freed_snapshots = Counter(
            "autoresearch_freed_snapshots",
            "Ephemeral sampler snapshots freed by the lifecycle policy",
            registry=r,
        )
        self.requests = Counter(
            "autoresearch_requests", "Completed requests", ["kind", "outcome"], registry=r
        )
        self.api_requests = Counter(
            "autoresearch_api_requests",
            "HTTP API requests received, by method and route template",
            ["method", "route"],
            registry=r,
        )
        self.rejections = Counter(
            "autoresearch_backpressure_rejections",
            "Requests refused with 429 by quota",
            ["reason"],
            registry=r,
        )
        self.sample_requests = Counter(
            "autoresearch_sample_requests",
            "Sample requests answered, by the backend that sampled them (torch engine or vLLM)",
            ["backend"],
            registry=r,
        )
        self.sampler_fallbacks = fallbacks_counter(r)
        # Labelled series exist only once touched: create the known ones at zero, so a scrape
        # (and a rate() over it) sees every documented series before the first event.
        for reason in ("max_runs", "queued_tokens"):
            self.rejections.labels(reason)
        for backend in ("torch", "vllm"):
            self.sample_requests.labels(backend)
        for kind in ("train", "sample"):
            self.tokens.labels(kind)
        self.duty = DutyCycle()
        self._events_lock = threading.Lock()
        self._token_events: dict[str, collections.deque[tuple[float, int]]] = {
            "train": collections.deque(),
            "sample": collections.deque(),
        }

    def count_fallback(self, reason: str, requests: int) -> None:
        self.sampler_fallbacks.labels(reason).inc(requests)

    def record_tokens(self, kind: str, count: int) -> None:
        """Called by the engine thread and, with vLLM beside it, by request threads."""
        self.tokens.labels(kind).inc(count)
        events = self._token_events[kind]
        now = time.monotonic()
        with self._events_lock:
            events.append((now, count))
            while events and events[0][0] < now - 60:
                events.popleft()

    def recent_tokens(self, seconds: float = 60.0) -> int:
        """Tokens processed (trained and sampled) over the last `seconds`."""
        cutoff = time.monotonic() - seconds
        return sum(c for events in list(self._token_events.values())
                   for t, c in list(events) if t >= cutoff)

    def refresh(self) -> None:
        """Update the derived gauges right before a scrape."""
        now = time.monotonic()
        for kind, events in self._token_events.items():
            span = min(60.0, now - self.duty.started) or 1.0
            self.tokens_per_second.labels(kind).set(
                sum(c for t, c in events if t >= now - 60) / span
            )
        self.duty_cycle.set(self.duty.fraction())

    def render(self) -> bytes:
        self.refresh()
        return generate_latest(self.registry)


class SamplerWorkerMetrics:
    """What a sampler worker exports on `/metrics`: requests its backend did not serve itself."""

    def __init__(self, reasons: tuple[str, ...]) -> None:
        self.registry = CollectorRegistry()
        self.fallbacks = fallbacks_counter(self.registry, reasons)

    def count_fallback(self, reason: str, requests: int) -> None:
        self.fallbacks.labels(reason).inc(requests)

    def render(self) -> bytes:
        return generate_latest(self.registry)
