"""The scheduler: one engine thread, many runs, a stated policy.

Policy (also in docs/scheduling.md):
- Each training run has an ordered stream. Its requests execute strictly in `seq_id` order; one
  that arrives early (the SDK sends a batch's first chunk last) is held until its turn.
- Control work (creating and loading runs) runs first: it is short and unblocks clients.
- Sampling and training alternate whenever both are waiting, so sampling never waits behind a
  long training queue and training never starves behind a stream of samples.
- Training is fair between runs: each turn takes the ready head of every run in round-robin
  order. With fusion on (the default), every ready forward_backward head joins one batch
  through the shared base model, each row through its own run's adapter.
- Pending sample requests from any run or snapshot are decoded together in one batch.

Nothing here touches tensors directly: it decides *what* runs together, the engine runs it.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from server.engine.engine import Engine, ForwardBackwardJob, SampleJob, UserError
from server.engine.engine_thread import start_loop
from server.engine.host_memory import release_above_budget, release_freed_memory
from server.observability.metrics import ServerMetrics
from server.scheduling.gradient_commit import all_or_nothing

log = logging.getLogger(__name__)

Callback = Callable[[object | None, BaseException | None], None]


@dataclass
class Work:
    """One unit of queued work. Exactly one of `job`, `sample`, `action` is set."""

    run_id: str | None
    label: str
    done: Callback
    job: ForwardBackwardJob | None = None
    sample: SampleJob | None = None
    action: Callable[[], object] | None = None
    seq_id: int | None = None
    tokens: int = 0
    owner: str = ""
    enqueued: float = field(default_factory=time.monotonic)


@dataclass
class RunStream:
    next_seq: int = 1
    pending: dict[int, Work] = field(default_factory=dict)

    def head(self) -> Work | None:
        return self.pending.get(self.next_seq)


class RunGone(LookupError):
    """The run was deleted while this request waited."""


RELEASE_MEMORY_AFTER_IDLE_S = 30.0
"""After this long with nothing to run, free host memory kept for the engine's temporaries goes
back to the kernel (`host_memory.release_freed_memory`): longer than the pauses inside a study
(scoring a group takes seconds), so busy periods keep their memory warm."""
MAX_SEQ_AHEAD = 4096
"""How far past a run's next `seq_id` a request may arrive. The SDK pipelines a handful of
requests; one thousands ahead would be held (with its data) until the gap fills, which may be
never."""
SAMPLE_QUIET_SECONDS = 0.1
SAMPLE_GATHER_SECONDS = 0.3
"""The batching window for sampling, the scheduler's and the split sampler worker's: wait for
100 ms of quiet, 300 ms at most. One client's burst of 48 requests mostly arrives within 15 ms,
but a pause in the client's process now and then opens a gap of 50-100 ms (measured with the
SDK in the server's process): a 50 ms quiet cut 6 rounds of 40 in two, 100 ms 2
(`bench/bench_arrival_gaps.py`), and a cut round decodes its stragglers in a second batch at
part width and without the prefix they share. A lone request waits the quiet before it
starts."""


class TooFarAhead(UserError):
    """A `seq_id` so far ahead of the run's order that it would wait indefinitely."""


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        fuse: bool = True,
        max_sample_rows: int = 128,
        max_fused_rows: int = 256,
        metrics: ServerMetrics | None = None,
        maintenance_seconds: float = 1.0,
        max_fused_runs: int | None = None,
        key_share_tokens: int = 4096,
    ):
        self.engine = engine
        self.fuse = fuse
        self.metrics = metrics or ServerMetrics()
        self.maintenance_seconds = maintenance_seconds
        self.max_fused_runs = max_fused_runs
        self.on_idle: Callable[[], None] | None = None
        self.before_batch: Callable[[str, list[Work]], None] | None = None
        self._queued_tokens: collections.Counter[str] = collections.Counter()
        self.max_sample_rows = max_sample_rows
        self.max_fused_rows = max_fused_rows
        self.key_share_tokens = key_share_tokens
        """Each key's share of one fused training batch, in tokens: past it, that key's further
        work waits for the next turn, so another key's request never rides in a batch a burst
        made arbitrarily large (every key still gets at least one request per turn)."""
        self._cond = threading.Condition()
        self._streams: dict[str, RunStream] = {}
        self._order: collections.deque[str] = collections.deque()
        self._control: collections.deque[Work] = collections.deque()
        self._samples: collections.deque[Work] = collections.deque()
        self._last_was_sampling = False
        self._stopping = False
        self.sample_quiet_seconds = SAMPLE_QUIET_SECONDS
        self.sample_gather_seconds = SAMPLE_GATHER_SECONDS
        self.actions_while_samples_gather = True
        """While sample requests are still arriving (the window above), ready actions of runs'
        streams (optimizer steps, weight saves) run first: they are often what lets another
        run send its samples in time to share the batch. Off: sampling starts at once whenever
        stream work is waiting (the earlier rule, kept as the reference
        `bench/bench_fused_runs.py` compares with)."""
        self.train_quiet_seconds = 0.005
        self.train_gather_seconds = 0.02
        """Batching window for an idle engine's first training work: 5 ms of quiet, 20 ms at
        most (runs that submit together then share one batch instead of one going first)."""
        self._wake_in: float | None = None
        self.last_tick = time.monotonic()
        """When the engine loop last came round (it does at least every `maintenance_seconds`)."""
        self.stall_limit = 120.0
        """Seconds without a tick while work waits after which the engine counts as stuck."""
        self.hang_limit = 1800.0
        """Seconds without a tick while work waits after which the engine counts as hung (the
        process should be restarted): far past any one batch's time."""
        self._thread = start_loop(engine, self._loop, "engine")  # where the model was loaded

    # ------------------------------------------------------------ submission
    def open_stream(self, run_id: str) -> None:
        with self._cond:
            if run_id not in self._streams:
                self._streams[run_id] = RunStream()
                self._order.append(run_id)

    def has_stream(self, run_id: str) -> bool:
        with self._cond:
            return run_id in self._streams

    def is_next(self, run_id: str, seq_id: int | None) -> bool:
        """Is this the request its run's stream is waiting for (so it must never be refused)?"""
        with self._cond:
            stream = self._streams.get(run_id)
            return stream is not None and seq_id == stream.next_seq

    def next_seq(self, run_id: str) -> int | None:
        """The seq_id the run's stream waits for next (None for an unknown run)."""
        with self._cond:
            stream = self._streams.get(run_id)
            return None if stream is None else stream.next_seq

    def queued_tokens(self, owner: str) -> int:
        with self._cond:
            return self._queued_tokens[owner]

    def queued_tokens_by_owner(self) -> dict[str, int]:
        """Every key's queued tokens (those with any), as of now."""
        with self._cond:
            return {owner: n for owner, n in self._queued_tokens.items() if n > 0}

    def _enqueued(self, work: Work) -> None:
        self._queued_tokens[work.owner] += work.tokens

    def _dequeued(self, work: Work) -> None:
        self._queued_tokens[work.owner] -= work.tokens
        if self._queued_tokens[work.owner] <= 0:
            del self._queued_tokens[work.owner]

    def submit_control(self, work: Work) -> None:
        with self._cond:
            self._enqueued(work)
            self._control.append(work)
            self._cond.notify()

    def submit_ordered(self, work: Work) -> bool:
        """Queue `work` at its seq_id; False if that seq_id was already taken (a duplicate)."""
        assert work.run_id is not None and work.seq_id is not None
        with self._cond:
            stream = self._streams.get(work.run_id)
            if stream is None:
                raise RunGone(f"unknown training run {work.run_id}")
            if work.seq_id < stream.next_seq or work.seq_id in stream.pending:
                return False
            if work.seq_id > stream.next_seq + MAX_SEQ_AHEAD:
                raise TooFarAhead(
                    f"seq_id {work.seq_id} is more than {MAX_SEQ_AHEAD} ahead of run "
                    f"{work.run_id}'s next request ({stream.next_seq})"
                )
            stream.pending[work.seq_id] = work
            self._enqueued(work)
            self._cond.notify()
            return True

    def submit_sample(self, work: Work) -> None:
        with self._cond:
            self._enqueued(work)
            self._samples.append(work)
            self._cond.notify()

    def close_stream(self, run_id: str, reason: str) -> None:
        """Forget a run: its pending requests fail cleanly, no other run is touched."""
        with self._cond:
            stream = self._streams.pop(run_id, None)
            if run_id in self._order:
                self._order.remove(run_id)
            if stream:
                for work in stream.pending.values():
                    self._dequeued(work)
        if stream:
            for work in stream.pending.values():
                work.done(None, RunGone(reason))

    def queue_depths(self) -> dict[str, int]:
        with self._cond:
            depths = {rid: len(s.pending) for rid, s in self._streams.items()}
            depths["_sampling"] = len(self._samples)
            depths["_control"] = len(self._control)
            return depths

    def stalled_seconds(self) -> float:
        """How long work has waited on an engine loop that has not come round (0 when idle)."""
        if not self._thread.is_alive():
            return float("inf")
        waiting = any(self.queue_depths().values())
        return time.monotonic() - self.last_tick if waiting else 0.0

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    # -------------------------------------------------------------- the loop
    def _ready_heads(self) -> list[Work]:
        heads = []
        for run_id in self._order:
            head = self._streams[run_id].head()
            if head is not None:
                heads.append(head)
        return heads

    def _take_turn(self) -> tuple[str, list[Work]] | None:
        """Choose the next batch of work (called with the lock held)."""
        if self._control:
            work = self._control.popleft()
            self._dequeued(work)
            return "control", [work]
        heads = self._ready_heads()
        want_sampling = bool(self._samples) and (not heads or not self._last_was_sampling)
        if want_sampling and (not heads or self.actions_while_samples_gather) \
                and self._gathering():
            # Sample requests are still arriving. A ready action (an optimizer step, a weight
            # save: milliseconds) runs meanwhile: it is often what lets another run send its
            # own samples, which then join this batch instead of decoding in one of their own.
            action = next((h for h in heads if h.job is None), None)
            if action is not None:
                self._advance(action)
                return "action", [action]
            if not heads:
                return None
        if want_sampling:
            return "sample", self._fair_samples()
        if not heads:
            return None
        if self.fuse and self._gathering_train(heads):
            return None
        if not self.fuse:
            head = heads[0]
            self._advance(head)
            return ("train" if head.job else "action"), [head]
        # Fused: every run's ready forward_backward head; other heads run on their own.
        action = next((h for h in heads if h.job is None), None)
        if action is not None:
            self._advance(action)
            return "action", [action]
        return "train", self._fair_training_batch(heads)

    def _fair_samples(self) -> list[Work]:
        """Sample requests for one batch, taken round-robin across keys (oldest first within a
        key) up to `max_sample_rows`: a key with a thousand queued requests gets one turn for
        each turn of a key with one."""
        by_key: dict[str, collections.deque[Work]] = {}
        for work in self._samples:
            by_key.setdefault(work.owner, collections.deque()).append(work)
        batch, rows = [], 0
        while by_key:
            for owner in list(by_key):
                queue = by_key[owner]
                work = queue[0]
                if batch and rows + work.sample.num_samples > self.max_sample_rows:
                    by_key.clear()
                    break
                queue.popleft()
                batch.append(work)
                rows += work.sample.num_samples
                if not queue:
                    del by_key[owner]
        taken = {id(w) for w in batch}
        self._samples = collections.deque(w for w in self._samples if id(w) not in taken)
        for work in batch:
            self._dequeued(work)
        return batch

    def _fair_training_batch(self, heads: list[Work]) -> list[Work]:
        """Every run's ready forward_backward work, within each key's share.

        Runs come in round-robin order; a run's consecutive chunks join while its key has
        share left, and every key gets at least its first ready request in, so a key whose
        burst fills its quota delays another key's call by at most one batch of its share.
        The share applies only while several keys have work ready: one key's runs alone (a
        study's parallel trials) fuse as fully as the batch limits allow.
        """
        batch, rows = [], 0
        used: collections.Counter[str] = collections.Counter()
        share = self.key_share_tokens if len({h.owner for h in heads}) > 1 else None
        for head in heads:
            if self.max_fused_runs is not None and len(batch) >= self.max_fused_runs:
                break
            stream, work = self._streams[head.run_id], head
            while work is not None and work.job is not None:
                count = len(work.job.data)
                if batch and rows + count > self.max_fused_rows:
                    break
                over = share is not None and used[work.owner] + work.tokens > share
                if used[work.owner] and over:
                    break
                batch.append(work)
                rows += count
                used[work.owner] += max(1, work.tokens)
                self._advance(work)
                work = stream.head()
            if rows >= self.max_fused_rows:
                break
        return batch

    def _gathering(self) -> bool:
        """Hold an idle engine a few milliseconds while sample requests are still arriving.

        A client submits a group's prompts as separate requests within milliseconds of each
        other; starting on the first alone would decode the rest in a second batch.
        """
        return self._window(
            first=self._samples[0].enqueued,
            last=self._samples[-1].enqueued,
            full=sum(w.sample.num_samples for w in self._samples) >= self.max_sample_rows,
            quiet_seconds=self.sample_quiet_seconds,
            gather_seconds=self.sample_gather_seconds,
        )

    def _gathering_train(self, heads: list[Work]) -> bool:
        """Hold an idle engine a few milliseconds while other runs' training work arrives.

        Only fresh work waits: a head that queued behind a running batch is already older than
        the window, so a busy engine never pauses.
        """
        if any(h.job is None for h in heads):
            return False
        return self._window(
            first=min(h.enqueued for h in heads),
            last=max(h.enqueued for h in heads),
            full=sum(len(h.job.data) for h in heads) >= self.max_fused_rows,
            quiet_seconds=self.train_quiet_seconds,
            gather_seconds=self.train_gather_seconds,
        )

    def _window(
        self, first: float, last: float, full: bool, quiet_seconds: float, gather_seconds: float
    ) -> bool:
        """True (and a wake-up set) while a batch is not full, its newest work arrived under
        `quiet_seconds` ago and its oldest under `gather_seconds` ago."""
        now = time.monotonic()
        quiet = now - last
        if not full and quiet < quiet_seconds and now - first < gather_seconds:
            self._wake_in = quiet_seconds - quiet
            return True
        return False

    def _advance(self, work: Work) -> None:
        """Pop a run's head and send the run to the back of the round-robin order."""
        stream = self._streams[work.run_id]
        del stream.pending[work.seq_id]
        self._dequeued(work)
        stream.next_seq += 1
        self._order.remove(work.run_id)
        self._order.append(work.run_id)

    def _loop(self) -> None:
        last_maintenance = time.monotonic()
        idle_since: float | None = None
        while True:
            self.last_tick = time.monotonic()
            with self._cond:
                turn = self._take_turn()
                while turn is None and not self._stopping:
                    timeout = self.maintenance_seconds
                    if self._wake_in is not None:
                        timeout, self._wake_in = min(timeout, max(self._wake_in, 0.001)), None
                    self._cond.wait(timeout=timeout)
                    turn = self._take_turn()
                    if turn is None and self._wake_in is None:
                        break
                if self._stopping:
                    return
            if time.monotonic() - last_maintenance >= self.maintenance_seconds or turn is None:
                last_maintenance = time.monotonic()
                self._maintain()
            if turn is None:
                idle_since = idle_since or time.monotonic()
                if time.monotonic() - idle_since >= RELEASE_MEMORY_AFTER_IDLE_S:
                    release_freed_memory()
                    idle_since = math.inf  # once per idle period
                continue
            idle_since = None
            kind, batch = turn
            self._last_was_sampling = kind == "sample"
            self.metrics.duty.begin()
            try:
                self._execute(kind, batch)
            finally:
                self.metrics.duty.end()
            release_above_budget()  # what the batch freed stays for the next, within a budget
            self._record(kind, batch)

    def _maintain(self) -> None:
        """Housekeeping on the engine thread (eviction), between batches or when idle."""
        if self.on_idle is None:
            return
        try:
            self.on_idle()
        except Exception:  # noqa: BLE001 - housekeeping must never stop the engine
            log.exception("maintenance failed")

    def _record(self, kind: str, batch: list[Work]) -> None:
        if kind == "train":
            rows = sum(len(w.job.data) for w in batch)
            self.metrics.record_tokens("train", sum(w.tokens for w in batch))
            runs = len({w.run_id for w in batch})
        elif kind == "sample":
            rows = sum(w.sample.num_samples for w in batch)
            # Sample work carries no run id: its distinct adapters (snapshots) are the runs.
            runs = len({id(w.sample.adapter) for w in batch})
        else:
            return
        self.metrics.batch_rows.labels(kind).observe(rows)
        self.metrics.batch_runs.labels(kind).observe(runs)

    def _execute(self, kind: str, batch: list[Work]) -> None:
        try:
            if self.before_batch is not None:
                self.before_batch(kind, batch)
            if kind == "train":
                jobs = [w.job for w in batch]
                # A failure anywhere leaves every run's gradients as they were, so the retry
                # below (or the client's) never adds a partial step twice.
                with all_or_nothing(job.state.adapter for job in jobs):
                    results = self.engine.forward_backward(jobs)
            elif kind == "sample":
                results = self.engine.sample([w.sample for w in batch])
            else:
                results = [batch[0].action()]
        except BaseException as exc:  # noqa: BLE001 - every failure goes back to its callers
            if len(batch) > 1 and kind in ("train", "sample"):
                # A fused batch failed: retry each alone so one bad request cannot fail others.
                # Training is all-or-nothing (above), so each retry starts from the gradients
                # its run had before the fused attempt, as an unfused run would.
                log.warning(
                    "fused %s batch of %d failed (%s); retrying one by one", kind, len(batch), exc
                )
                for work in batch:
                    self._execute(kind, [work])
                return
            log.debug("%s failed: %s", batch[0].label, exc, exc_info=True)
            batch[0].done(None, exc)
            return
        if kind == "sample":
            generated = sum(len(seq.tokens) for r in results for seq in r.sequences)
            self.metrics.record_tokens("sample", generated)
            self.metrics.sample_requests.labels("torch").inc(len(batch))
        for work, result in zip(batch, results):
            work.done(result, None)
