"""The request service's shared state and the helpers every concern uses."""

from __future__ import annotations

import collections
import datetime as dt
import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from server.engine.engine import Engine, RunState, UserError
from server.engine.lora import AdapterWeights
from server.observability.metrics import ServerMetrics
from server.protocol.futures import FutureRecord, FutureStore
from server.protocol.json_values import json_safe
from server.scheduling.scheduler import Scheduler, Work
from server.service.errors import USER_ERRORS, Backpressure, NotFound, QuotaExceeded
from server.service.lifecycle import SnapshotLedger
from server.service.records import Limits, Run, Sampler, Session, str_metadata
from server.service.request_fields import metadata, ttl_seconds
from server.service.sampling_records import SamplingRecords
from server.storage.adapter_cache import AdapterCache
from server.storage.checkpoints import CheckpointError, CheckpointStore, TinkerPath, now_iso
from server.storage.residency import Residency
from server.storage.sampler_cache import SamplerCache
from server.storage.weight_export import UrlSigner

if TYPE_CHECKING:
    from server.samplers.colocated import VLLMBeside

log = logging.getLogger(__name__)


class ServiceCore:
    """The state every concern shares (sessions, runs, samplers, the scheduler and the stores),
    the owner-scoped lookups, quotas and the completion of futures.

    The concern classes (`sessions`, `training`, `sampling`, `checkpoints`, `exports`, `rest`)
    extend it and call only what is here or in `ordering`; `_maintain`, the scheduler's idle
    hook, comes from `sessions`.
    """

    sampler_is_engine = True
    """Samples come from this process's engine, so sampler and trainer share its numerics. A
    split deployment's sampler workers (vLLM, or a torch engine on another machine) do not."""

    def __init__(
        self,
        engine: Engine,
        store: CheckpointStore,
        futures: FutureStore,
        fuse: bool = True,
        tokenizer_id: str | None = None,
        limits: Limits | None = None,
    ):
        self.engine = engine
        self.store = store
        self.futures = futures
        self.limits = limits or Limits()
        self.metrics = ServerMetrics()
        self.residency = Residency(
            engine,
            store.root / ".spill",
            self.metrics,
            self.limits.max_resident_runs,
            self.limits.idle_evict_seconds,
        )
        self.scheduler = Scheduler(
            engine, fuse=fuse, metrics=self.metrics, max_fused_runs=self.limits.max_resident_runs
        )
        self.scheduler.on_idle = self._maintain
        self.scheduler.before_batch = self._prepare_batch
        self.base_model = engine.model_name
        self.tokenizer_id = tokenizer_id or engine.model_name
        self.sessions: dict[str, Session] = {}
        self.runs: dict[str, Run] = {}
        self.samplers: dict[str, Sampler] = {}
        self.sampler_cache = SamplerCache(
            store.root / ".spill" / "samplers",
            engine.device,
            self.limits.max_resident_samplers,
            self.metrics.resident_samplers.set,
        )
        self.sampling_records = SamplingRecords()
        self.url_signer = UrlSigner()
        self._lock = threading.Lock()
        self._sample_ids = itertools.count()
        self._dedup: dict[tuple[str, int], FutureRecord] = {}
        self._dedup_order: dict[str, collections.deque[int]] = {}
        self._dedup_lock = threading.Lock()  # request threads add, the engine thread prunes
        self.policy = self.limits.lifecycle
        self.snapshots = SnapshotLedger(self.policy.snapshots_per_run)
        self.adapters = AdapterCache()
        self.vllm: VLLMBeside | None = None
        """vLLM beside the engine (`attach_vllm`): where servable sample requests go."""
        self._last_sweep = time.monotonic()

    def _session(self, owner: str, session_id: str) -> Session:
        session = self.sessions.get(session_id) if isinstance(session_id, str) else None
        if session is None or session.owner != owner:
            raise NotFound(f"unknown session {str(session_id)[:80]!r}")
        return session

    def _run(self, owner: str, run_id: str) -> Run:
        run = self.runs.get(run_id) if isinstance(run_id, str) else None
        if run is None or run.owner != owner:
            raise NotFound(f"unknown training run {str(run_id)[:80]!r}")
        run.last_request = now_iso()
        self._seen(run_id)
        return run

    def _retire_run(self, run_id: str, why: str) -> Run | None:
        """Take a run out of service: its pending requests fail with `why`, its order and
        dedup records go. Its resident state is the caller's to free (on the engine thread)."""
        run = self.runs.get(run_id)
        if run is None:
            return None
        self.scheduler.close_stream(run_id, why)
        del self.runs[run_id]
        with self._dedup_lock:
            for seq_id in self._dedup_order.pop(run_id, ()):
                self._dedup.pop((run_id, seq_id), None)
        return run

    def _remember_dedup(self, run_id: str, seq_id: int, record: FutureRecord) -> None:
        """Keep a queued request's future so a retry of its `seq_id` gets the same answer."""
        with self._dedup_lock:
            self._dedup[(run_id, seq_id)] = record
            self._dedup_order.setdefault(run_id, collections.deque()).append(seq_id)
        self._prune_dedup(run_id)

    def _prune_dedup(self, run_id: str) -> None:
        """Forget dedup records the run's order has passed by more than the window.

        Called when a request is queued and when one completes, so a run that goes quiet
        keeps only the window, not whatever was still queued at its last request.
        """
        next_seq = self.scheduler.next_seq(run_id)
        with self._dedup_lock:
            order = self._dedup_order.get(run_id)
            while order and (next_seq is None or order[0] < next_seq - self.policy.dedup_window):
                self._dedup.pop((run_id, order.popleft()), None)

    def _seen(self, scoped_id: str) -> None:
        """A request for a run or sampler keeps its session alive, like a heartbeat."""
        session = self.sessions.get(scoped_id.split(":", 1)[0])
        if session is not None:
            session.last_seen = time.monotonic()

    def _check_run_quota(self, owner: str, run_id: str) -> None:
        """Refuse a new run past the key's run limit (`run_id` is the run about to exist)."""
        limit = self.limits.max_runs_per_key
        if limit is not None and not self._admit_run(owner, run_id, limit):
            self.metrics.rejections.labels("max_runs").inc()
            raise QuotaExceeded(
                f"this key already has {limit} training runs (the limit); "
                "delete one to create another"
            )

    def _admit_run(self, owner: str, run_id: str, limit: int) -> bool:
        """Whether the key may have `run_id` too: here, its runs in this process."""
        return sum(r.owner == owner for r in self.runs.values()) < limit

    def attach_vllm(self, beside: VLLMBeside) -> None:
        """Sample on vLLM from now on, wherever it can serve the adapter: sampler and trainer
        then no longer share numerics."""
        self.vllm = beside
        self.sampler_is_engine = False

    def sampling_backend(self) -> str:
        """Where samples come from: `vllm` beside the engine, the `torch` engine itself, or
        a split deployment's sampler `workers`."""
        if self.vllm is not None:
            return "vllm"
        return "torch" if self.sampler_is_engine else "workers"

    def close(self) -> None:
        """Stop the engine's loop and vLLM beside it, if any."""
        self.scheduler.stop()
        if self.vllm is not None:
            self.vllm.close()

    def _queued_for_key(self, owner: str) -> int:
        """Tokens the key has queued: here, in this process's scheduler and sent to vLLM."""
        queued = self.scheduler.queued_tokens(owner)
        return queued + (self.vllm.queued_tokens(owner) if self.vllm is not None else 0)

    def _check_backlog(self, owner: str, tokens: int) -> None:
        limit = self.limits.max_queued_tokens_per_key
        if limit is None:
            return
        queued = self._queued_for_key(owner)
        if queued + tokens > limit:
            if queued == 0:
                raise UserError(
                    f"one request of {tokens} tokens exceeds this key's queue limit "
                    f"of {limit} tokens"
                )
            self.metrics.rejections.labels("queued_tokens").inc()
            raise Backpressure(
                f"this key has {queued} tokens queued (limit {limit}); retry shortly"
            )

    def _free_sampler(self, sampler_id: str, reason: str) -> None:
        """Forget a snapshot; its reason is recorded in the same step, so that a request
        arriving while its cached weights are dropped is told why, never "unknown"."""
        with self._lock:
            sampler = self.samplers.pop(sampler_id, None)
            session = self.sessions.get(sampler_id.split(":", 1)[0])
            if session is not None and sampler_id in session.sampler_ids:
                session.sampler_ids.remove(sampler_id)
            if sampler is not None:
                self.snapshots.remove(sampler.run_id or "", sampler_id, reason)
        if sampler is None:
            return
        self.sampler_cache.drop(sampler_id)
        self.metrics.freed_snapshots.inc()

    def _prepare_batch(self, kind: str, batch: list[Work]) -> None:
        """Make every run a batch needs resident before the engine starts on it."""
        pinned = {w.run_id for w in batch if w.run_id}
        for run_id in pinned:
            run = self.runs.get(run_id)
            if run is not None and (run.state is not None or run.spill_path is not None):
                self.residency.touch(run, pinned)

    def _state(self, run: Run) -> RunState:
        try:
            return self.residency.touch(run)
        except LookupError as exc:
            raise UserError(str(exc)) from None

    def _check_base_model(self, base_model: str | None) -> None:
        if base_model and base_model != self.base_model:
            raise UserError(
                f"unknown base model {base_model!r}; this server serves {self.base_model!r}"
            )

    def _readable_checkpoint(self, owner: str, path: TinkerPath) -> dict[str, Any]:
        """Checkpoint metadata if the caller owns it or it is published."""
        meta = self.store.read_meta(path)
        run_meta = self.store.read_run(path.run_id) or {}
        if run_meta.get("owner") != owner and not meta.get("public"):
            raise CheckpointError(f"no checkpoint at {path}")
        return meta

    def _complete(self, record: FutureRecord, to_json=None, to_proto=None):
        """A scheduler callback that resolves `record` from a result or an error."""

        def done(result: object | None, error: BaseException | None) -> None:
            if record.run_id is not None:  # before the caller can see the answer
                self._prune_dedup(record.run_id)
            fields = {
                "request_id": record.request_id,
                "run_id": record.run_id,
                "kind": record.kind,
                "seconds": round(time.monotonic() - record.created, 4),
            }
            if error is not None:
                category = "user" if isinstance(error, USER_ERRORS) else "server"
                if category == "server":
                    log.error(
                        "request failed",
                        exc_info=error,
                        extra={**fields, "outcome": "error", "category": category},
                    )
                else:
                    log.info(
                        "request rejected: %s",
                        error,
                        extra={**fields, "outcome": "error", "category": category},
                    )
                self.metrics.requests.labels(record.kind, "error").inc()
                self.futures.fail(record, str(error) or type(error).__name__, category)
                return
            log.info("request done", extra={**fields, "outcome": "ok"})
            self.metrics.requests.labels(record.kind, "ok").inc()
            try:
                if to_proto is not None:
                    self.futures.resolve_proto(record, to_proto(result))
                else:
                    self.futures.resolve_json(
                        record, json_safe(to_json(result) if to_json else result)
                    )
            except Exception as exc:  # noqa: BLE001
                log.exception("encoding result of %s failed", record.request_id)
                self.futures.fail(record, f"could not encode result: {exc}", "server")

        return done

    def _persist_run(self, run: Run) -> None:
        self.store.write_run(
            run.run_id,
            {
                "owner": run.owner,
                "base_model": run.base_model,
                "lora_rank": run.spec.rank,
                "train_attn": run.spec.train_attn,
                "train_mlp": run.spec.train_mlp,
                "train_unembed": run.spec.train_unembed,
                "optimizer": run.optimizer,
                "user_metadata": str_metadata(run.user_metadata),
                "created": now_iso(),
            },
        )

    def _require_state(self, run: Run) -> RunState:
        return self._state(run)

    def _ttl_meta(self, body: dict[str, Any]) -> dict[str, Any]:
        raw = body.get("user_metadata")
        meta: dict[str, Any] = {
            "user_metadata": None if raw is None else str_metadata(metadata(raw))
        }
        ttl = body.get("ttl_seconds")
        if ttl is not None:
            expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=ttl_seconds(ttl))
            meta["expires_at"] = expires.isoformat()
        return meta

    def _register_sampler(
        self, sampler: Sampler, reload: Callable[[], AdapterWeights] | None = None
    ) -> None:
        """Make a sampler known; its weights go to the bounded snapshot cache. `reload` rebuilds
        them after eviction (without it they are spilled to a file of their own, which a user
        deleting a checkpoint cannot take away)."""
        if sampler.adapter is not None:
            self.sampler_cache.put(sampler.sampler_id, sampler.adapter, reload)
            sampler.adapter, sampler.tuned = None, True
        with self._lock:
            self.samplers[sampler.sampler_id] = sampler
            session = self.sessions.get(sampler.sampler_id.split(":", 1)[0])
            if session is not None and sampler.sampler_id not in session.sampler_ids:
                session.sampler_ids.append(sampler.sampler_id)
        if sampler.run_id is not None:
            cap = self.policy.snapshots_per_run
            for old in self.snapshots.add(sampler.run_id, sampler.sampler_id):
                self._free_sampler(old, f"its run kept only its newest {cap} snapshots")
        if session is not None and session.finished is not None:
            self._free_sampler(sampler.sampler_id, f"its session {session.session_id} ended")

    def _checkpoint_adapter(self, path: TinkerPath) -> AdapterWeights:
        """A checkpoint's adapter, read from disk once and then served from the cache."""
        return self.adapters.get(
            str(path), lambda: self.store.load(path, self.engine.device, with_optimizer=False)[0]
        )

    def _owned_path(self, owner: str, run_id: str, kind: str, name: str) -> TinkerPath:
        path = TinkerPath.parse(f"tinker://{run_id}/{kind}/{name}")
        if (self.store.read_run(run_id) or {}).get("owner") != owner:
            raise NotFound(f"no checkpoint at {path}")
        self.store.read_meta(path)
        return path
