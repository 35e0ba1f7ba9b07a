"""The training service: sessions, runs, samplers and checkpoints, and who owns each.

It turns validated protocol requests into scheduler work and JSON answers. HTTP lives in
`server.api.app`; tensors in `server.engine.engine`. Every lookup is scoped to the caller's owner
id: another key's run is indistinguishable from a run that does not exist.
"""

from __future__ import annotations

import datetime as dt
import itertools
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from server.engine.engine import (
    AdamParams,
    Engine,
    ForwardBackwardJob,
    ForwardBackwardResult,
    RunState,
    SampleJob,
    SamplingParams,
    UserError,
)
from server.engine.lora import AdapterWeights, LoraSpec
from server.engine.losses import LossError
from server.observability.metrics import ServerMetrics
from server.protocol.codec import (
    ForwardBackwardCall,
    encode_forward_backward_output,
    encode_sample_response,
)
from server.protocol.futures import FutureRecord, FutureStore
from server.scheduling.scheduler import RunGone, Scheduler, Work
from server.storage.checkpoints import (
    CheckpointError,
    CheckpointStore,
    TinkerPath,
    now_iso,
    validate_name,
)
from server.storage.residency import Residency
from server.storage.sampler_cache import DEFAULT_MAX_RESIDENT, SamplerCache

log = logging.getLogger(__name__)

USER_ERRORS = (UserError, LossError, CheckpointError, RunGone, ValueError, KeyError)


class NotFound(LookupError):
    """Unknown (or not yours) session, run, sampler or checkpoint."""


class QuotaExceeded(PermissionError):
    """A per-key limit that waiting will not lift (e.g. too many runs): HTTP 429, no retry."""


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


@dataclass
class Session:
    session_id: str
    owner: str
    tags: list[str]
    user_metadata: dict[str, Any]
    created: str = field(default_factory=now_iso)
    finished: str | None = None
    run_ids: list[str] = field(default_factory=list)
    sampler_ids: list[str] = field(default_factory=list)


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
        self._lock = threading.Lock()
        self._sample_ids = itertools.count()
        self._dedup: dict[tuple[str, int], FutureRecord] = {}

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
        return run

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
        return record

    # ----------------------------------------------------------- sessions
    def create_session(self, owner: str, body: dict[str, Any]) -> dict[str, Any]:
        session_id = f"sess-{uuid.uuid4().hex[:12]}"
        self.sessions[session_id] = Session(
            session_id, owner, list(body.get("tags") or []), dict(body.get("user_metadata") or {})
        )
        return {"session_id": session_id, "type": "create_session"}

    def heartbeat(self, owner: str, session_id: str) -> dict[str, Any]:
        self._session(owner, session_id)
        return {"type": "session_heartbeat"}

    def finish_session(self, owner: str, session_id: str, reason: str) -> dict[str, Any]:
        session = self._session(owner, session_id)
        session.finished = session.finished or reason
        return {"status": "ok"}

    # ---------------------------------------------------------- training
    def create_model(self, owner: str, body: dict[str, Any]) -> FutureRecord:
        session = self._session(owner, body["session_id"])
        self._check_base_model(body.get("base_model"))
        self._check_run_quota(owner)
        lora = body.get("lora_config") or {}
        spec = LoraSpec(
            rank=int(lora.get("rank", 32)),
            train_attn=bool(lora.get("train_attn", True)),
            train_mlp=bool(lora.get("train_mlp", True)),
            train_unembed=bool(lora.get("train_unembed", True)),
        )
        seed = lora.get("seed")
        seed = int(seed) if seed is not None else int(np.random.SeedSequence().entropy % 2**31)
        run_id = f"{session.session_id}:train:{int(body['model_seq_id'])}"
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
            },
            "is_lora": True,
            "lora_rank": run.spec.rank,
            "model_name": run.base_model,
            "optimizer_config": {"type": "adamw"},
            "type": "get_info",
        }

    def _require_state(self, run: Run) -> RunState:
        return self._state(run)

    def forward_backward(self, owner: str, call: ForwardBackwardCall) -> FutureRecord:
        run = self._run(owner, call.model_id)
        job = ForwardBackwardJob(
            None,
            call.data,
            call.loss_fn,
            call.loss_fn_config,  # type: ignore[arg-type]
            call.forward_only,
        )
        try:
            self.engine.validate(job)
            invalid = None
        except USER_ERRORS as exc:
            invalid = exc
        kind = "forward" if call.forward_only else "forward_backward"
        tokens = sum(len(d.tokens) for d in job.data)
        # The request a run's stream waits on is always admitted: the SDK sends a batch's later
        # chunks first, and refusing the first one while they hold the quota would deadlock.
        if not self.scheduler.is_next(run.run_id, call.seq_id):
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
        raw = body.get("adam_params") or body.get("optim_params") or {}
        if body.get("optimizer_params") and not raw:
            raise UserError("only AdamW is supported (optimizer_params type 'adamw' / adam_params)")
        params = AdamParams(
            **{k: float(v) for k, v in raw.items() if k in AdamParams.__dataclass_fields__}
        )
        if params.learning_rate < 0 or not 0 <= params.beta1 < 1 or not 0 <= params.beta2 < 1:
            raise UserError(f"invalid Adam parameters {raw}")

        def step() -> dict[str, Any]:
            return {"metrics": self.engine.optim_step(self._require_state(run), params)}

        return self._ordered(
            owner,
            run,
            body.get("seq_id"),
            "optim_step",
            lambda rec: Work(run.run_id, "optim_step", self._complete(rec), action=step),
        )

    def _ttl_meta(self, body: dict[str, Any]) -> dict[str, Any]:
        meta: dict[str, Any] = {"user_metadata": _str_metadata(body.get("user_metadata"))}
        ttl = body.get("ttl_seconds")
        if ttl is not None:
            expires = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=int(ttl))
            meta["expires_at"] = expires.isoformat()
        return meta

    def save_weights(self, owner: str, body: dict[str, Any]) -> FutureRecord:
        run = self._run(owner, body["model_id"])
        name = body.get("path") or f"step-{uuid.uuid4().hex[:8]}"
        validate_name(name)
        path = TinkerPath(run.run_id, "weights", name)
        meta = self._ttl_meta(body)
        overwrite = bool(body.get("overwrite", False))

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
            body.get("seq_id"),
            "save_weights",
            lambda rec: Work(run.run_id, "save_weights", self._complete(rec), action=save),
        )

    def save_weights_for_sampler(self, owner: str, body: dict[str, Any]) -> FutureRecord:
        run = self._run(owner, body["model_id"])
        name = body.get("path")
        session_seq = body.get("sampling_session_seq_id")
        if name is None and session_seq is None:
            raise UserError("save_weights_for_sampler needs a path or a sampling_session_seq_id")
        path = None
        if name is not None:
            validate_name(name)
            path = TinkerPath(run.run_id, "sampler_weights", name)
        session_id = run.run_id.split(":", 1)[0]
        meta = self._ttl_meta(body)

        def save() -> dict[str, Any]:
            state = self._require_state(run)
            snapshot = state.adapter.frozen_copy()  # immutable: later steps never touch it
            answer: dict[str, Any] = {"type": "save_weights_for_sampler"}
            if path is not None:
                self.store.save(path, snapshot, run.base_model, None, meta)
                answer["path"] = str(path)
            if session_seq is not None:
                sampler_id = f"{session_id}:sample:{int(session_seq)}"
                self._register_sampler(
                    Sampler(
                        sampler_id, owner, run.base_model, str(path) if path else None, snapshot
                    )
                )
                answer["sampling_session_id"] = sampler_id
            return answer

        return self._ordered(
            owner,
            run,
            body.get("seq_id"),
            "save_weights_for_sampler",
            lambda rec: Work(run.run_id, "save_for_sampler", self._complete(rec), action=save),
        )

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

    def load_weights(self, owner: str, body: dict[str, Any]) -> FutureRecord:
        path = TinkerPath.parse(body["path"])
        if path.kind != "weights" and body.get("optimizer"):
            raise UserError("optimizer state can only be loaded from a weights/ checkpoint")
        self._readable_checkpoint(owner, path)
        with_optimizer = bool(body.get("optimizer", False))
        if body.get("session_id") is not None:
            return self._load_as_new_run(owner, body, path, with_optimizer)
        run = self._run(owner, body["model_id"])

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
            body.get("seq_id"),
            "load_weights",
            lambda rec: Work(run.run_id, "load_weights", self._complete(rec), action=load),
        )

    def _load_as_new_run(
        self, owner: str, body: dict[str, Any], path: TinkerPath, with_optimizer: bool
    ) -> FutureRecord:
        session = self._session(owner, body["session_id"])
        self._check_base_model(body.get("base_model"))
        self._check_run_quota(owner)
        run_id = f"{session.session_id}:train:{int(body['model_seq_id'])}"
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
        sampler_id = f"{session.session_id}:sample:{int(body['sampling_session_seq_id'])}"
        model_path = body.get("model_path")
        if model_path:
            path = TinkerPath.parse(model_path)
            self._readable_checkpoint(owner, path)
            adapter, _, _ = self.store.load(path, self.engine.device, with_optimizer=False)
            sampler = Sampler(sampler_id, owner, self.base_model, model_path, adapter)
        else:
            self._check_base_model(body.get("base_model"))
            sampler = Sampler(sampler_id, owner, self.base_model, None, None)
        self._register_sampler(sampler)
        return {"sampling_session_id": sampler_id, "type": "create_sampling_session"}

    def get_sampler(self, owner: str, sampler_id: str) -> dict[str, Any]:
        sampler = self.samplers.get(sampler_id)
        if sampler is None or sampler.owner != owner:
            raise NotFound(f"unknown sampler {sampler_id!r}")
        answer = {"sampler_id": sampler_id, "base_model": sampler.base_model}
        if sampler.model_path:
            answer["model_path"] = sampler.model_path
        return answer

    def _sampler_for(self, owner: str, body: dict[str, Any]) -> AdapterWeights | None:
        sampler_id = body.get("sampling_session_id")
        if sampler_id:
            sampler = self.samplers.get(sampler_id)
            if sampler is None or sampler.owner != owner:
                raise NotFound(f"unknown sampling session {sampler_id!r}")
            return self.sampler_cache.get(sampler_id) if sampler.tuned else None
        if body.get("model_path"):
            path = TinkerPath.parse(body["model_path"])
            self._readable_checkpoint(owner, path)
            return self.store.load(path, self.engine.device, with_optimizer=False)[0]
        self._check_base_model(body.get("base_model"))
        return None

    def sample(self, owner: str, body: dict[str, Any]) -> tuple[FutureRecord, list[str]]:
        adapter = self._sampler_for(owner, body)
        tokens: list[int] = []
        for chunk in (body.get("prompt") or {}).get("chunks") or []:
            if chunk.get("type", "encoded_text") != "encoded_text":
                raise UserError(f"{chunk.get('type')} chunks are not supported by this text model")
            tokens.extend(int(t) for t in chunk.get("tokens") or [])
        raw = body.get("sampling_params") or {}
        stop = raw.get("stop")
        if isinstance(stop, str):
            stop = [stop]
        params = SamplingParams(
            max_tokens=raw.get("max_tokens"),
            temperature=float(raw.get("temperature", 1.0)),
            top_p=float(raw.get("top_p", 1.0)),
            top_k=int(raw.get("top_k", -1)),
            seed=raw.get("seed"),
            stop=stop,
        )
        num = int(body.get("num_samples", 1))
        job = SampleJob(
            adapter,
            tokens,
            num,
            params,
            prompt_logprobs=bool(body.get("prompt_logprobs")),
            topk_prompt_logprobs=int(body.get("topk_prompt_logprobs") or 0),
        )
        self.engine.validate_sample(job)
        self._check_backlog(owner, (len(tokens) + Engine._max_new(job)) * num)
        record = self.futures.create(owner, "sample")
        ids = [f"{record.request_id}:{i}" for i in range(num)]
        self.scheduler.submit_sample(
            Work(
                None,
                "sample",
                self._complete(record, to_proto=encode_sample_response),
                sample=job,
                tokens=(len(tokens) + Engine._max_new(job)) * num,
                owner=owner,
            )
        )
        return record, ids

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
        self.store.delete(self._owned_path(owner, run_id, kind, name))

    def set_ttl(self, owner: str, run_id: str, kind: str, name: str, ttl: int | None) -> None:
        path = self._owned_path(owner, run_id, kind, name)
        expires = None
        if ttl is not None:
            expires = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=int(ttl))).isoformat()
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
            run_id = f"{session.session_id}:train:{int(body['model_seq_id'])}"
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
