"""The training service: sessions, runs, samplers and checkpoints, and who owns each.

It turns validated protocol requests into scheduler work and JSON answers. HTTP lives in
`server.api.app`; tensors in `server.engine.engine`. Every lookup is scoped to the caller's owner
id: another key's run is indistinguishable from a run that does not exist.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from server.engine.engine import (
    Engine,
    ForwardBackwardJob,
    ForwardBackwardResult,
    RunState,
    SampleJob,
    SamplingParams,
    UserError,
)
from server.engine.lora import AdapterWeights, LoraSpec
from server.engine.loss_config import check_loss_config
from server.engine.losses import LOSSES, NEEDS_SAMPLING_RECORD, LossError
from server.observability.metrics import ServerMetrics
from server.protocol.codec import (
    ForwardBackwardCall,
    encode_forward_backward_output,
    encode_sample_response,
)
from server.protocol.futures import FutureRecord, FutureStore
from server.scheduling.scheduler import RunGone, Scheduler, Work
from server.service import session_search
from server.service.lifecycle import LifecyclePolicy, SnapshotLedger
from server.service.optim_params import parse_adam_params
from server.service.request_fields import flag, integer, number, optional_integer
from server.service.sampling_records import SamplingRecords, session_of
from server.storage.adapter_cache import AdapterCache
from server.storage.checkpoints import (
    CheckpointError,
    CheckpointStore,
    TinkerPath,
    now_iso,
    validate_name,
)
from server.storage.residency import Residency
from server.storage.sampler_cache import DEFAULT_MAX_RESIDENT, SamplerCache
from server.storage.weight_export import (
    ExportError,
    UrlSigner,
    downloadable_files,
    encrypt_in_place,
    owner_hash,
)

log = logging.getLogger(__name__)

USER_ERRORS = (UserError, LossError, CheckpointError, RunGone)
"""The client's fault (HTTP 400 / future category "user"); any other exception is a server
fault (HTTP 500 / category "server"), logged with its traceback."""


class NotFound(LookupError):
    """Unknown (or not yours) session, run, sampler or checkpoint."""


class QuotaExceeded(PermissionError):
    """A per-key limit that waiting will not lift (e.g. too many runs): HTTP 429, no retry."""


class SnapshotFreed(NotFound):
    """A sampler snapshot that existed but was freed under the lifecycle policy."""


class SessionGone(LookupError):
    """The session ended or expired: HTTP 410, which stops the SDK's heartbeat."""


class Backpressure(RuntimeError):
    """The key has too much work queued: HTTP 429, which the SDK retries after a pause."""


@dataclass
class Limits:
    """Per-key quotas and memory bounds; None means unlimited."""

    max_runs_per_key: int | None = None
    max_queued_tokens_per_key: int | None = None
    max_resident_runs: int | None = None
    idle_evict_seconds: float | None = None
    max_resident_samplers: int | None = DEFAULT_MAX_RESIDENT
    lifecycle: LifecyclePolicy = field(default_factory=LifecyclePolicy)


@dataclass
class Session:
    session_id: str
    owner: str
    tags: list[str]
    user_metadata: dict[str, Any]
    created: str = field(default_factory=now_iso)
    finished: str | None = None
    last_seen: float = field(default_factory=time.monotonic)
    """Last heartbeat or request; a session silent past the timeout expires."""
    ended_at: float | None = None
    run_ids: list[str] = field(default_factory=list)
    sampler_ids: list[str] = field(default_factory=list)
    display_name: str | None = None


@dataclass
class Run:
    run_id: str
    owner: str
    base_model: str
    spec: LoraSpec
    user_metadata: dict[str, Any]
    state: RunState | None = None
    last_request: str = field(default_factory=now_iso)
    spill_path: Path | None = None
    last_used: float = field(default_factory=time.monotonic)


@dataclass
class Sampler:
    sampler_id: str
    owner: str
    base_model: str
    model_path: str | None
    adapter: AdapterWeights | None
    """The snapshot's weights until registered; then they live in the `SamplerCache`."""
    tuned: bool = False
    """Whether the sampler has an adapter (else it samples the base model)."""
    run_id: str | None = None
    """The run of an ephemeral (unnamed) snapshot, which the lifecycle policy may free."""
    last_used: float = field(default_factory=time.monotonic)


def _str_metadata(meta: dict[str, Any] | None) -> dict[str, str] | None:
    return None if meta is None else {str(k): str(v) for k, v in meta.items()}


class TrainingService:
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
        self.policy = self.limits.lifecycle
        self.snapshots = SnapshotLedger(self.policy.snapshots_per_run)
        self.adapters = AdapterCache()
        self._last_sweep = time.monotonic()

    # ------------------------------------------------------------ helpers
    def _session(self, owner: str, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None or session.owner != owner:
            raise NotFound(f"unknown session {session_id!r}")
        return session

    def _run(self, owner: str, run_id: str) -> Run:
        run = self.runs.get(run_id)
        if run is None or run.owner != owner:
            raise NotFound(f"unknown training run {run_id!r}")
        run.last_request = now_iso()
        self._seen(run_id)
        return run

    def _seen(self, scoped_id: str) -> None:
        """A request for a run or sampler keeps its session alive, like a heartbeat."""
        session = self.sessions.get(scoped_id.split(":", 1)[0])
        if session is not None:
            session.last_seen = time.monotonic()

    def _check_run_quota(self, owner: str) -> None:
        limit = self.limits.max_runs_per_key
        if limit is not None and sum(r.owner == owner for r in self.runs.values()) >= limit:
            self.metrics.rejections.labels("max_runs").inc()
            raise QuotaExceeded(
                f"this key already has {limit} training runs (the limit); "
                "delete one to create another"
            )

    def _check_backlog(self, owner: str, tokens: int) -> None:
        limit = self.limits.max_queued_tokens_per_key
        if limit is not None and self.scheduler.queued_tokens(owner) + tokens > limit:
            if self.scheduler.queued_tokens(owner) == 0:
                raise UserError(
                    f"one request of {tokens} tokens exceeds this key's queue limit "
                    f"of {limit} tokens"
                )
            self.metrics.rejections.labels("queued_tokens").inc()
            raise Backpressure(
                f"this key has {self.scheduler.queued_tokens(owner)} tokens queued "
                f"(limit {limit}); retry shortly"
            )

    def _maintain(self) -> None:
        busy = {rid for rid, depth in self.scheduler.queue_depths().items() if depth}
        self.residency.evict_idle(busy)
        self._expire_sessions()
        self._expire_snapshots()
        if time.monotonic() - self._last_sweep >= self.policy.checkpoint_sweep_seconds:
            self._last_sweep = time.monotonic()
            for path in self.store.expire():
                self.adapters.drop(path)

    # ---------------------------------------------------------- lifecycles
    def _expire_sessions(self) -> None:
        """End sessions that stopped heartbeating; forget ended ones after their retention."""
        timeout, now = self.policy.session_timeout_seconds, time.monotonic()
        for session in list(self.sessions.values()):
            if session.finished is None and timeout is not None:
                if now - session.last_seen > timeout:
                    log.info("session %s expired (no heartbeat for %.0f s)",
                             session.session_id, now - session.last_seen)
                    self._end_session(session, "expired")
            elif (
                session.ended_at is not None
                and now - session.ended_at > self.policy.ended_session_retention_seconds
            ):
                with self._lock:
                    self.sessions.pop(session.session_id, None)

    def _end_session(self, session: Session, reason: str) -> None:
        """An ended session's samplers go (snapshots and all); its runs and checkpoints stay."""
        session.finished = session.finished or reason
        session.ended_at = session.ended_at or time.monotonic()
        for sampler_id in list(session.sampler_ids):
            self._free_sampler(sampler_id, f"its session {session.session_id} ended ({reason})")

    def _expire_snapshots(self) -> None:
        ttl = self.policy.snapshot_ttl_seconds
        if ttl is None:
            return
        cutoff = time.monotonic() - ttl
        stale = [s.sampler_id for s in list(self.samplers.values())
                 if s.run_id is not None and s.last_used < cutoff]
        for sampler_id in stale:
            self._free_sampler(sampler_id, f"it was unused for {ttl:.0f} s")

    def _free_sampler(self, sampler_id: str, reason: str) -> None:
        with self._lock:
            sampler = self.samplers.pop(sampler_id, None)
            session = self.sessions.get(sampler_id.split(":", 1)[0])
            if session is not None and sampler_id in session.sampler_ids:
                session.sampler_ids.remove(sampler_id)
        if sampler is None:
            return
        self.sampler_cache.drop(sampler_id)
        self.snapshots.remove(sampler.run_id or "", sampler_id, reason)
        self.metrics.freed_snapshots.inc()

    def _prune_dedup(self, run_id: str) -> None:
        """Forget dedup records the run's order has passed by more than the window."""
        order = self._dedup_order.get(run_id)
        next_seq = self.scheduler.next_seq(run_id)
        while order and (next_seq is None or order[0] < next_seq - self.policy.dedup_window):
            self._dedup.pop((run_id, order.popleft()), None)

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
                    self.futures.resolve_json(record, to_json(result) if to_json else result)
            except Exception as exc:  # noqa: BLE001
                log.exception("encoding result of %s failed", record.request_id)
                self.futures.fail(record, f"could not encode result: {exc}", "server")

        return done

    @contextlib.contextmanager
    def _refusal_keeps_order(
        self, owner: str, run: Run, seq_id: int | None, kind: str
    ) -> Iterator[None]:
        """A request refused before it is queued still takes its place in the run's order.

        Without this, a refused `seq_id` would never execute and every later request of the
        run would wait for it forever. The refusal is queued at that `seq_id` as work that
        fails with the same error, so the stream moves past it (and a retry of the same
        `seq_id` gets the same answer). Backpressure is not a refusal: the SDK retries it.
        """
        try:
            yield
        except USER_ERRORS as exc:
            if seq_id is not None and self.scheduler.has_stream(run.run_id):
                error = exc

                def refuse() -> None:
                    raise error

                self._ordered(
                    owner,
                    run,
                    seq_id,
                    kind,
                    lambda rec: Work(run.run_id, kind, self._complete(rec), action=refuse),
                )
            raise

    def _ordered(
        self, owner: str, run: Run, seq_id: int | None, kind: str, make_work
    ) -> FutureRecord:
        """Queue work on a run's ordered stream, answering duplicates with the first future."""
        if seq_id is not None:
            existing = self._dedup.get((run.run_id, seq_id))
            if existing is not None:
                return existing
        record = self.futures.create(owner, kind)
        record.run_id = run.run_id
        work: Work = make_work(record)
        work.run_id, work.seq_id, work.owner = run.run_id, seq_id, owner
        if seq_id is None:
            self.scheduler.submit_control(work)
            return record
        if not self.scheduler.submit_ordered(work):
            self.futures.fail(record, f"seq_id {seq_id} was already used for {run.run_id}")
            return record
        self._dedup[(run.run_id, seq_id)] = record
        self._dedup_order.setdefault(run.run_id, collections.deque()).append(seq_id)
        self._prune_dedup(run.run_id)
        return record

    # ----------------------------------------------------------- sessions
    def create_session(self, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        session_id = f"sess-{uuid.uuid4().hex[:12]}"
        self.sessions[session_id] = Session(
            session_id,
            owner,
            list(body.get("tags") or []),
            dict(body.get("user_metadata") or {}),
            display_name=body.get("display_name"),
        )
        return {"session_id": session_id, "type": "create_session"}

    def heartbeat(self, owner: str, session_id: str) -> dict[str, Any]:
        session = self._session(owner, session_id)
        if session.finished is not None:
            raise SessionGone(f"session {session_id} has ended ({session.finished})")
        session.last_seen = time.monotonic()
        return {"type": "session_heartbeat"}

    def finish_session(self, owner: str, session_id: str, reason: str) -> dict[str, Any]:
        self._end_session(self._session(owner, session_id), reason)
        return {"status": "ok"}

    # ---------------------------------------------------------- training
    def create_model(self, owner: str, body: dict[str, Any]) -> FutureRecord:
        session = self._session(owner, body["session_id"])
        self._check_base_model(body.get("base_model"))
        self._check_run_quota(owner)
        lora = body.get("lora_config") or {}
        spec = LoraSpec(
            rank=integer(lora.get("rank", 32), "lora_config.rank"),
            train_attn=flag(lora.get("train_attn", True), "lora_config.train_attn"),
            train_mlp=flag(lora.get("train_mlp", True), "lora_config.train_mlp"),
            train_unembed=flag(lora.get("train_unembed", True), "lora_config.train_unembed"),
        )
        seed = optional_integer(lora.get("seed"), "lora_config.seed")
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % 2**31)
        run_id = f"{session.session_id}:train:{integer(body['model_seq_id'], 'model_seq_id')}"
        if run_id in self.runs:
            raise UserError(f"model_seq_id {body['model_seq_id']} was already used in this session")
        run = Run(run_id, owner, self.base_model, spec, dict(body.get("user_metadata") or {}))
        self.runs[run_id] = run
        session.run_ids.append(run_id)
        self.scheduler.open_stream(run_id)

        def create() -> dict[str, Any]:
            run.state = self.engine.create_run(spec, seed)
            self.residency.adopt(run)
            self._persist_run(run)
            return {"model_id": run_id, "type": "create_model"}

        def make(record: FutureRecord) -> Work:
            return Work(run_id, "create_model", self._complete(record), action=create, owner=owner)

        record = self.futures.create(owner, "create_model")
        self.scheduler.submit_control(make(record))
        return record

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
                "user_metadata": _str_metadata(run.user_metadata),
                "created": now_iso(),
            },
        )

    def get_info(self, owner: str, model_id: str) -> dict[str, Any]:
        run = self._run(owner, model_id)
        return {
            "model_id": run.run_id,
            "model_data": {
                "arch": self.engine.model.config.model_type,
                "model_name": run.base_model,
                "tokenizer_id": self.tokenizer_id,
                **self.base_model_facts(),
            },
            "is_lora": True,
            "lora_rank": run.spec.rank,
            "model_name": run.base_model,
            "optimizer_config": {"type": "adamw"},
            "type": "get_info",
        }

    def base_model_facts(self) -> dict[str, str]:
        """What the resident base model really is: where its weights came from, its dtype."""
        return {
            "base_model_origin": self.engine.model_origin,
            "dtype": str(self.engine.dtype).removeprefix("torch."),
        }

    def _require_state(self, run: Run) -> RunState:
        return self._state(run)

    def _attach_sampling_records(self, owner: str, call: ForwardBackwardCall) -> None:
        """Fill the recorded inputs a loss like `stable_reinforce` reads from provenance."""
        for i, datum in enumerate(call.data):
            if datum.loss_spans is None:
                raise LossError(
                    f"data[{i}]: loss {call.loss_fn!r} needs provenance (loss_fn_input_spans) "
                    "naming sequences sampled with record_stability_info=True; attach it with "
                    "Datum.with_provenance"
                )
            targets = datum.inputs.get("target_tokens")
            if targets is None or targets.ndim != 1:
                raise LossError(f"data[{i}]: loss {call.loss_fn!r} needs 1-D target_tokens")
            datum.inputs.update(
                self.sampling_records.resolve(
                    owner, session_of(call.model_id), i, targets, datum.loss_spans
                )
            )

    def forward_backward(self, owner: str, call: ForwardBackwardCall) -> FutureRecord:
        run = self._run(owner, call.model_id)
        invalid: BaseException | None = None
        if call.loss_fn in NEEDS_SAMPLING_RECORD:
            try:
                self._attach_sampling_records(owner, call)
            except USER_ERRORS as exc:
                invalid = exc
        job = ForwardBackwardJob(
            None,
            call.data,
            call.loss_fn,
            call.loss_fn_config,  # type: ignore[arg-type]
            call.forward_only,
        )
        if invalid is None:
            try:
                check_loss_config(call.loss_fn, call.loss_fn_config)
                self.engine.validate(job)
            except USER_ERRORS as exc:
                invalid = exc
        kind = "forward" if call.forward_only else "forward_backward"
        tokens = sum(len(d.tokens) for d in job.data)
        # The request a run's stream waits on is always admitted: the SDK sends a batch's later
        # chunks first, and refusing the first one while they hold the quota would deadlock.
        if not self.scheduler.is_next(run.run_id, call.seq_id):
            with self._refusal_keeps_order(owner, run, call.seq_id, kind):
                self._check_backlog(owner, tokens)

        def make(record: FutureRecord) -> Work:
            done = self._complete(record, to_proto=_encode_fb)
            if invalid is not None:

                def reject() -> None:
                    raise invalid

                return Work(run.run_id, kind, done, action=reject, owner=owner)
            return Work(run.run_id, kind, done, job=job, tokens=tokens, owner=owner)

        record = self._ordered(owner, run, call.seq_id, kind, make)
        # The run's state is bound when the job executes, not when it is queued: a load_weights
        # queued before it must take effect first.
        job.state = _LazyState(self, run)  # type: ignore[assignment]
        return record

    def optim_step(self, owner: str, body: dict[str, Any]) -> FutureRecord:
        run = self._run(owner, body["model_id"])
        seq_id = optional_integer(body.get("seq_id"), "seq_id")
        with self._refusal_keeps_order(owner, run, seq_id, "optim_step"):
            params = parse_adam_params(body)

        def step() -> dict[str, Any]:
            return {"metrics": self.engine.optim_step(self._require_state(run), params)}

        return self._ordered(
            owner,
            run,
            seq_id,
            "optim_step",
            lambda rec: Work(run.run_id, "optim_step", self._complete(rec), action=step),
        )

    def _ttl_meta(self, body: dict[str, Any]) -> dict[str, Any]:
        meta: dict[str, Any] = {"user_metadata": _str_metadata(body.get("user_metadata"))}
        ttl = body.get("ttl_seconds")
        if ttl is not None:
            expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=integer(ttl, "ttl_seconds"))
            meta["expires_at"] = expires.isoformat()
        return meta

    def save_weights(self, owner: str, body: dict[str, Any]) -> FutureRecord:
        run = self._run(owner, body["model_id"])
        seq_id = optional_integer(body.get("seq_id"), "seq_id")
        with self._refusal_keeps_order(owner, run, seq_id, "save_weights"):
            name = body.get("path") or f"step-{uuid.uuid4().hex[:8]}"
            validate_name(name)
            path = TinkerPath(run.run_id, "weights", name)
            meta = self._ttl_meta(body)
            overwrite = flag(body.get("overwrite", False), "overwrite")

        def save() -> dict[str, Any]:
            state = self._require_state(run)
            self.store.save(
                path,
                state.adapter,
                run.base_model,
                state.optimizer.state_dict(),
                meta,
                overwrite=overwrite,
            )
            return {"path": str(path), "type": "save_weights"}

        return self._ordered(
            owner,
            run,
            seq_id,
            "save_weights",
            lambda rec: Work(run.run_id, "save_weights", self._complete(rec), action=save),
        )

    def save_weights_for_sampler(self, owner: str, body: dict[str, Any]) -> FutureRecord:
        run = self._run(owner, body["model_id"])
        seq_id = optional_integer(body.get("seq_id"), "seq_id")
        with self._refusal_keeps_order(owner, run, seq_id, "save_weights_for_sampler"):
            name = body.get("path")
            session_seq = optional_integer(
                body.get("sampling_session_seq_id"), "sampling_session_seq_id"
            )
            if name is None and session_seq is None:
                raise UserError(
                    "save_weights_for_sampler needs a path or a sampling_session_seq_id"
                )
            path = None
            if name is not None:
                validate_name(name)
                path = TinkerPath(run.run_id, "sampler_weights", name)
            meta = self._ttl_meta(body)
        session_id = run.run_id.split(":", 1)[0]

        def save() -> dict[str, Any]:
            state = self._require_state(run)
            snapshot = state.adapter.frozen_copy()  # immutable: later steps never touch it
            answer: dict[str, Any] = {"type": "save_weights_for_sampler"}
            if path is not None:
                self.store.save(path, snapshot, run.base_model, None, meta)
                answer["path"] = str(path)
            if session_seq is not None:
                sampler_id = f"{session_id}:sample:{session_seq}"
                self._register_sampler(
                    Sampler(
                        sampler_id,
                        owner,
                        run.base_model,
                        str(path) if path else None,
                        snapshot,
                        run_id=run.run_id if path is None else None,
                    )
                )
                answer["sampling_session_id"] = sampler_id
            return answer

        return self._ordered(
            owner,
            run,
            seq_id,
            "save_weights_for_sampler",
            lambda rec: Work(run.run_id, "save_for_sampler", self._complete(rec), action=save),
        )

    def save_weights_external(self, owner: str, body: dict[str, Any]) -> FutureRecord:
        """Export the run's adapter as it is (a PEFT adapter), for download over signed URLs."""
        run = self._run(owner, body["model_id"])
        name = body.get("path")
        if not name:
            raise UserError("save_weights_external needs a name (path)")
        validate_name(name)
        path = TinkerPath(run.run_id, "external_weights", name)
        recipients = body.get("age_encryption_recipients")
        if recipients is not None and (
            not isinstance(recipients, list) or not 1 <= len(recipients) <= 10
        ):
            raise UserError("age_encryption_recipients takes a list of 1 to 10 recipients")
        prepare = None if not recipients else lambda d: encrypt_in_place(d, list(recipients))
        meta = self._ttl_meta(body)

        def save() -> dict[str, Any]:
            state = self._require_state(run)
            record = self.store.save(
                path, state.adapter, run.base_model, None, meta, prepare=prepare
            )
            return {
                "path": str(path),
                "size_bytes": record["size_bytes"],
                "type": "save_weights_external",
            }

        return self._ordered(
            owner,
            run,
            body.get("seq_id"),
            "save_weights_external",
            lambda rec: Work(run.run_id, "save_weights_external", self._complete(rec),
                             action=save),
        )

    def external_weights_urls(
        self, owner: str, run_id: str, kind: str, name: str, base_url: str
    ) -> dict[str, Any]:
        """Signed, expiring download URLs for each file of an export the caller owns."""
        if kind != "external_weights":
            raise UserError(
                "download URLs exist only for external weights "
                "(tinker://<run>/external_weights/<name>); export with save_weights_external"
            )
        path = self._owned_path(owner, run_id, kind, name)
        expires = time.time() + self.url_signer.lifetime
        urls = {
            file: f"{base_url.rstrip('/')}/api/v1/external_weights/"
            f"{self.url_signer.sign(owner, str(path), file, expires)}/{file}"
            for file in downloadable_files(self.store.checkpoint_dir(path))
        }
        expiry = dt.datetime.fromtimestamp(int(expires), dt.UTC)
        return {"urls": urls, "expires": expiry.isoformat()}

    def external_weights_file(self, token: str, file: str) -> Path:
        """The file a signed URL names, if the link is valid and its owner still owns it."""
        signed_owner, tinker_path, signed_file = self.url_signer.verify(token)
        if file != signed_file:
            raise ExportError("this download link is for another file")
        path = TinkerPath.parse(tinker_path)
        run_owner = (self.store.read_run(path.run_id) or {}).get("owner")
        directory = self.store.checkpoint_dir(path)
        if run_owner is None or owner_hash(run_owner) != signed_owner:
            raise NotFound("no such export")
        if file not in (downloadable_files(directory) if directory.is_dir() else []):
            raise NotFound("no such export (it was deleted or has expired)")
        expires_at = self.store.read_meta(path).get("expires_at")
        if expires_at and dt.datetime.fromisoformat(expires_at) <= dt.datetime.now(dt.UTC):
            raise NotFound("this export has expired")
        return directory / file

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

    def load_weights(self, owner: str, body: dict[str, Any]) -> FutureRecord:
        if body.get("session_id") is not None:
            path, with_optimizer = self._load_source(owner, body)
            return self._load_as_new_run(owner, body, path, with_optimizer)
        run = self._run(owner, body["model_id"])
        seq_id = optional_integer(body.get("seq_id"), "seq_id")
        with self._refusal_keeps_order(owner, run, seq_id, "load_weights"):
            path, with_optimizer = self._load_source(owner, body)

        def load() -> dict[str, Any]:
            adapter, opt_state, _ = self.store.load(path, self.engine.device, with_optimizer)
            self.residency.forget(run)
            run.spec = adapter.spec
            run.state = self.engine.restore_run(adapter, opt_state)
            self.residency.adopt(run)
            return {"path": str(path), "model_id": run.run_id, "type": "load_weights"}

        return self._ordered(
            owner,
            run,
            seq_id,
            "load_weights",
            lambda rec: Work(run.run_id, "load_weights", self._complete(rec), action=load),
        )

    def _load_source(self, owner: str, body: dict[str, Any]) -> tuple[TinkerPath, bool]:
        """The checkpoint a load_weights request reads, checked readable by the caller."""
        path = TinkerPath.parse(body["path"])
        with_optimizer = flag(body.get("optimizer", False), "optimizer")
        if path.kind != "weights" and with_optimizer:
            raise UserError("optimizer state can only be loaded from a weights/ checkpoint")
        self._readable_checkpoint(owner, path)
        return path, with_optimizer

    def _load_as_new_run(
        self, owner: str, body: dict[str, Any], path: TinkerPath, with_optimizer: bool
    ) -> FutureRecord:
        session = self._session(owner, body["session_id"])
        self._check_base_model(body.get("base_model"))
        self._check_run_quota(owner)
        run_id = f"{session.session_id}:train:{integer(body['model_seq_id'], 'model_seq_id')}"
        if run_id in self.runs:
            raise UserError(f"model_seq_id {body['model_seq_id']} was already used in this session")
        source_meta = self.store.read_run(path.run_id) or {}
        user_metadata = body.get("user_metadata") or source_meta.get("user_metadata") or {}
        run = Run(run_id, owner, self.base_model, LoraSpec(rank=1), dict(user_metadata))
        self.runs[run_id] = run
        session.run_ids.append(run_id)
        self.scheduler.open_stream(run_id)

        def load() -> dict[str, Any]:
            adapter, opt_state, _ = self.store.load(path, self.engine.device, with_optimizer)
            run.spec = adapter.spec
            run.state = self.engine.restore_run(adapter, opt_state)
            self.residency.adopt(run)
            self._persist_run(run)
            return {"path": str(path), "model_id": run_id, "type": "load_weights"}

        record = self.futures.create(owner, "load_weights")
        self.scheduler.submit_control(
            Work(run_id, "load_weights", self._complete(record), action=load, owner=owner)
        )
        return record

    # ---------------------------------------------------------- sampling
    def create_sampling_session(self, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        session = self._session(owner, body["session_id"])
        seq = integer(body["sampling_session_seq_id"], "sampling_session_seq_id")
        sampler_id = f"{session.session_id}:sample:{seq}"
        model_path = body.get("model_path")
        if model_path:
            path = TinkerPath.parse(model_path)
            self._readable_checkpoint(owner, path)
            adapter = self._checkpoint_adapter(path)
            sampler = Sampler(sampler_id, owner, self.base_model, model_path, adapter)
        else:
            self._check_base_model(body.get("base_model"))
            sampler = Sampler(sampler_id, owner, self.base_model, None, None)
        self._register_sampler(sampler)
        return {"sampling_session_id": sampler_id, "type": "create_sampling_session"}

    def get_sampler(self, owner: str, sampler_id: str) -> dict[str, Any]:
        sampler = self._lookup_sampler(owner, sampler_id)
        answer = {"sampler_id": sampler_id, "base_model": sampler.base_model}
        if sampler.model_path:
            answer["model_path"] = sampler.model_path
        return answer

    def _lookup_sampler(self, owner: str, sampler_id: str) -> Sampler:
        sampler = self.samplers.get(sampler_id)
        if sampler is None or sampler.owner != owner:
            reason = self.snapshots.why_freed(sampler_id)
            if reason is not None and sampler_id.split(":", 1)[0] in self._owned_sessions(owner):
                raise SnapshotFreed(
                    f"sampler snapshot {sampler_id!r} was freed because {reason}; take a new "
                    "one (save_weights_and_get_sampling_client), or save a named checkpoint "
                    "to keep one"
                )
            raise NotFound(f"unknown sampling session {sampler_id!r}")
        sampler.last_used = time.monotonic()
        self._seen(sampler_id)
        return sampler

    def _owned_sessions(self, owner: str) -> set[str]:
        sessions = {sid for sid, s in self.sessions.items() if s.owner == owner}
        return sessions | {rid.split(":", 1)[0] for rid, r in self.runs.items() if r.owner == owner}

    def _checkpoint_adapter(self, path: TinkerPath) -> AdapterWeights:
        """A checkpoint's adapter, read from disk once and then served from the cache."""
        return self.adapters.get(
            str(path), lambda: self.store.load(path, self.engine.device, with_optimizer=False)[0]
        )

    def _sampler_for(self, owner: str, body: dict[str, Any]) -> AdapterWeights | None:
        sampler_id = body.get("sampling_session_id")
        if sampler_id:
            sampler = self._lookup_sampler(owner, sampler_id)
            return self.sampler_cache.get(sampler_id) if sampler.tuned else None
        if body.get("model_path"):
            path = TinkerPath.parse(body["model_path"])
            self._readable_checkpoint(owner, path)
            return self._checkpoint_adapter(path)
        self._check_base_model(body.get("base_model"))
        return None

    def sample(self, owner: str, body: dict[str, Any]) -> tuple[FutureRecord, list[str]]:
        adapter = self._sampler_for(owner, body)
        tokens: list[int] = []
        for chunk in (body.get("prompt") or {}).get("chunks") or []:
            if chunk.get("type", "encoded_text") != "encoded_text":
                raise UserError(f"{chunk.get('type')} chunks are not supported by this text model")
            tokens.extend(integer(t, "prompt token") for t in chunk.get("tokens") or [])
        raw = body.get("sampling_params") or {}
        stop = raw.get("stop")
        if isinstance(stop, str):
            stop = [stop]
        params = SamplingParams(
            max_tokens=optional_integer(raw.get("max_tokens"), "sampling_params.max_tokens"),
            temperature=number(raw.get("temperature", 1.0), "sampling_params.temperature"),
            top_p=number(raw.get("top_p", 1.0), "sampling_params.top_p"),
            top_k=integer(raw.get("top_k", -1), "sampling_params.top_k"),
            seed=optional_integer(raw.get("seed"), "sampling_params.seed"),
            stop=stop,
        )
        num = integer(body.get("num_samples", 1), "num_samples")
        job = SampleJob(
            adapter,
            tokens,
            num,
            params,
            prompt_logprobs=flag(body.get("prompt_logprobs") or False, "prompt_logprobs"),
            topk_prompt_logprobs=integer(
                body.get("topk_prompt_logprobs") or 0, "topk_prompt_logprobs"
            ),
        )
        recording = bool(body.get("record_stability_info"))
        if recording and not NEEDS_SAMPLING_RECORD & LOSSES.keys():
            # Refused before any rollout is sampled: nothing here could train on the record.
            raise UserError(
                "record_stability_info=True is for stable_reinforce, which this server does "
                "not support; sample without it and train with another loss_fn"
            )
        if recording and not body.get("sampling_session_id"):
            raise UserError(
                "record_stability_info=True needs a sampling session: records belong to the "
                "session that sampled them"
            )
        self.engine.validate_sample(job)
        self._check_backlog(owner, (len(tokens) + Engine._max_new(job)) * num)
        record = self.futures.create(owner, "sample")
        ids = [f"{record.request_id}:{i}" for i in range(num)]
        done = self._complete(record, to_proto=encode_sample_response)
        if recording:
            done = self._recording(done, owner, body["sampling_session_id"], len(tokens), ids)
        self.scheduler.submit_sample(
            Work(
                None,
                "sample",
                done,
                sample=job,
                tokens=(len(tokens) + Engine._max_new(job)) * num,
                owner=owner,
            )
        )
        return record, ids

    def _recording(self, done, owner: str, sampler_id: str, prompt_length: int, ids: list[str]):
        """Wrap a sample's completion so its sequences are recorded before the client sees them
        (so a training request sent right after the result can always name them)."""

        def record_then_finish(result: object | None, error: BaseException | None) -> None:
            if error is None and result is not None:
                for sequence_id, seq in zip(ids, result.sequences):  # type: ignore[attr-defined]
                    self.sampling_records.add(
                        owner, session_of(sampler_id), sequence_id, prompt_length,
                        list(seq.tokens), list(seq.logprobs),
                    )
            done(result, error)

        return record_then_finish

    # ------------------------------------------------------ rest surface
    def training_run(self, owner: str, run_id: str) -> dict[str, Any]:
        meta = self.store.read_run(run_id)
        run = self.runs.get(run_id)
        if run is not None and run.owner == owner:
            base, rank, user_meta, last = (
                run.base_model,
                run.spec.rank,
                run.user_metadata,
                run.last_request,
            )
        elif meta is not None and meta.get("owner") == owner:
            base, rank, user_meta, last = (
                meta["base_model"],
                meta["lora_rank"],
                meta.get("user_metadata"),
                meta["created"],
            )
        else:
            raise NotFound(f"unknown training run {run_id!r}")
        checkpoints = self.store.list(run_id) if meta is not None else []
        latest = {kind: None for kind in ("training", "sampler")}
        for ckpt in checkpoints:
            latest[ckpt["checkpoint_type"]] = ckpt
        return {
            "training_run_id": run_id,
            "base_model": base,
            "model_owner": owner,
            "is_lora": True,
            "corrupted": False,
            "lora_rank": rank,
            "last_request_time": last,
            "last_checkpoint": _public_checkpoint(latest["training"]),
            "last_sampler_checkpoint": _public_checkpoint(latest["sampler"]),
            "user_metadata": _str_metadata(user_meta),
        }

    def owned_run_ids(self, owner: str) -> list[str]:
        ids = {rid for rid, run in self.runs.items() if run.owner == owner}
        for rid in self.store.list_runs():
            if (self.store.read_run(rid) or {}).get("owner") == owner:
                ids.add(rid)
        return sorted(ids)

    def list_training_runs(self, owner: str, limit: int, offset: int) -> dict[str, Any]:
        ids = self.owned_run_ids(owner)
        page = ids[offset : offset + limit]
        return {
            "training_runs": [self.training_run(owner, rid) for rid in page],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(ids)},
        }

    def list_checkpoints(self, owner: str, run_id: str) -> dict[str, Any]:
        self.training_run(owner, run_id)  # ownership check
        return {
            "checkpoints": [_public_checkpoint(c) for c in self.store.list(run_id)],
            "cursor": None,
        }

    def list_user_checkpoints(self, owner: str, limit: int, offset: int) -> dict[str, Any]:
        every = [c for rid in self.owned_run_ids(owner) for c in self.store.list(rid)]
        every.sort(key=lambda c: c["time"], reverse=True)
        return {
            "checkpoints": [_public_checkpoint(c) for c in every[offset : offset + limit]],
            "cursor": {"offset": offset, "limit": limit, "total_count": len(every)},
        }

    def _owned_path(self, owner: str, run_id: str, kind: str, name: str) -> TinkerPath:
        path = TinkerPath.parse(f"tinker://{run_id}/{kind}/{name}")
        if (self.store.read_run(run_id) or {}).get("owner") != owner:
            raise NotFound(f"no checkpoint at {path}")
        self.store.read_meta(path)
        return path

    def delete_checkpoint(self, owner: str, run_id: str, kind: str, name: str) -> None:
        path = self._owned_path(owner, run_id, kind, name)
        self.store.delete(path)
        self.adapters.drop(str(path))

    def set_ttl(self, owner: str, run_id: str, kind: str, name: str, ttl: int | None) -> None:
        path = self._owned_path(owner, run_id, kind, name)
        expires = None
        if ttl is not None:
            seconds = integer(ttl, "ttl_seconds")
            expires = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)).isoformat()
        self.store.update_meta(path, expires_at=expires)

    def set_public(self, owner: str, run_id: str, kind: str, name: str, public: bool) -> None:
        self.store.update_meta(self._owned_path(owner, run_id, kind, name), public=public)

    def weights_info(self, owner: str, tinker_path: str) -> dict[str, Any]:
        path = TinkerPath.parse(tinker_path)
        self._readable_checkpoint(owner, path)
        import json

        config = json.loads((self.store.checkpoint_dir(path) / "adapter_config.json").read_text())
        from server.storage.checkpoints import spec_from_peft

        spec = spec_from_peft(config)
        return {
            "base_model": config.get("base_model_name_or_path") or self.base_model,
            "is_lora": True,
            "lora_rank": spec.rank,
            "train_attn": spec.train_attn,
            "train_mlp": spec.train_mlp,
            "train_unembed": spec.train_unembed,
            "optimizer_config": {"type": "adamw"},
        }

    def copy_weights(self, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        """Copy a readable checkpoint into a new run of the caller's that cannot be trained on.

        Projects are not modelled: the copy belongs to the caller's key, and a
        `destination_project_id` is only recorded on the new run.
        """
        source = TinkerPath.parse(body["source_path"])
        self._readable_checkpoint(owner, source)
        if body.get("session_id") is not None:
            session = self._session(owner, body["session_id"])
            run_id = f"{session.session_id}:train:{integer(body['model_seq_id'], 'model_seq_id')}"
            if run_id in self.runs or self.store.read_run(run_id) is not None:
                raise UserError(f"model_seq_id {body['model_seq_id']} was already used")
        else:
            run_id = f"copy-{uuid.uuid4().hex[:12]}"
        with_optimizer = source.kind == "weights"
        adapter, opt_state, meta = self.store.load(source, self.engine.device, with_optimizer)
        source_run = self.store.read_run(source.run_id) or {}
        base_model = source_run.get("base_model", self.base_model)
        self.store.write_run(
            run_id,
            {
                **source_run,
                "owner": owner,
                "base_model": base_model,
                "lora_rank": adapter.spec.rank,
                "created": now_iso(),
                "copied_from": str(source),
                "project_id": body.get("destination_project_id"),
            },
        )
        target = TinkerPath(run_id, source.kind, source.name)
        ttl = {"ttl_seconds": body.get("ttl_seconds"), "user_metadata": meta.get("user_metadata")}
        self.store.save(target, adapter, base_model, opt_state, self._ttl_meta(ttl))
        return {"tinker_path": str(target)}

    def list_sessions(self, owner: str, limit: int, offset: int) -> dict[str, Any]:
        ids = [sid for sid, s in self.sessions.items() if s.owner == owner]
        return {"sessions": ids[offset : offset + limit]}

    def search_sessions(self, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        def checkpoints_of(session: Any) -> int:
            return sum(len(self.store.list(rid)) for rid in session.run_ids
                       if self.store.read_run(rid) is not None)

        return session_search.search(list(self.sessions.values()), owner, body, checkpoints_of)

    def get_session(self, owner: str, session_id: str) -> dict[str, Any]:
        session = self._session(owner, session_id)
        return {
            "training_run_ids": list(session.run_ids),
            "sampler_ids": list(session.sampler_ids),
            "user_metadata": _str_metadata(session.user_metadata),
        }

    def delete_run(self, owner: str, run_id: str) -> None:
        """Free a run: pending requests fail, memory is released, checkpoints stay."""
        run = self._run(owner, run_id)
        self.scheduler.close_stream(run_id, f"training run {run_id} was deleted")
        del self.runs[run_id]
        for seq_id in self._dedup_order.pop(run_id, ()):
            self._dedup.pop((run_id, seq_id), None)

        def free() -> None:
            self.residency.forget(run)

        self.scheduler.submit_control(
            Work(run_id, "delete_run", lambda *_: None, action=free, owner=owner)
        )


class _LazyState:
    """Resolves a run's engine state at execution time (after earlier loads in its stream),
    reloading it first if it was evicted."""

    def __init__(self, service: TrainingService, run: Run):
        self._service = service
        self._run = run

    def __getattr__(self, name: str):
        return getattr(self._service._state(self._run), name)


def _encode_fb(result: ForwardBackwardResult) -> bytes:
    return encode_forward_backward_output(result.outputs, result.metrics)


def _public_checkpoint(record: dict[str, Any] | None) -> dict[str, Any] | None:
    if record is None:
        return None
    keys = (
        "checkpoint_id",
        "checkpoint_type",
        "time",
        "tinker_path",
        "size_bytes",
        "public",
        "user_metadata",
        "expires_at",
    )
    return {k: record.get(k) for k in keys if record.get(k) is not None or k == "public"}
