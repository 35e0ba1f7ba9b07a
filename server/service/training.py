"""Training runs: creation, forward/backward passes, optimizer steps, deletion."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

from server.engine.engine import ForwardBackwardJob, ForwardBackwardResult, UserError
from server.engine.lora import LoraSpec
from server.engine.loss_config import check_loss_config
from server.engine.losses import NEEDS_SAMPLING_RECORD, LossError
from server.protocol.codec import ForwardBackwardCall, encode_forward_backward_output
from server.protocol.futures import FutureRecord
from server.scheduling.scheduler import Work
from server.service.core import ServiceCore
from server.service.errors import USER_ERRORS
from server.service.optim_params import (
    optimizer_config,
    parse_optim_params,
    parse_optimizer_config,
)
from server.service.ordering import RunOrdering
from server.service.records import Run
from server.service.request_fields import flag, integer, metadata, optional_integer
from server.service.sampling_records import session_of

log = logging.getLogger(__name__)


class TrainingRequests(RunOrdering):
    """Training runs: created, described, trained (forward, forward_backward, optim_step)
    and deleted."""

    def create_model(self, owner: str, body: dict[str, Any]) -> FutureRecord:
        session = self._session(owner, body["session_id"])
        self._check_base_model(body.get("base_model"))
        lora = body.get("lora_config") or {}
        spec = LoraSpec(
            rank=integer(lora.get("rank", 32), "lora_config.rank"),
            train_attn=flag(lora.get("train_attn", True), "lora_config.train_attn"),
            train_mlp=flag(lora.get("train_mlp", True), "lora_config.train_mlp"),
            train_unembed=flag(lora.get("train_unembed", True), "lora_config.train_unembed"),
        )
        optimizer = parse_optimizer_config(body.get("optimizer_config"))
        seed = optional_integer(lora.get("seed"), "lora_config.seed")
        if seed is None:
            seed = int(np.random.SeedSequence().entropy % 2**31)
        run_id = f"{session.session_id}:train:{integer(body['model_seq_id'], 'model_seq_id')}"
        if run_id in self.runs:
            raise UserError(f"model_seq_id {body['model_seq_id']} was already used in this session")
        self._check_run_quota(owner, run_id)
        self._say_where_it_samples(run_id, spec)
        run = Run(run_id, owner, self.base_model, spec, metadata(body.get("user_metadata")),
                  optimizer=optimizer)
        self.runs[run_id] = run
        session.run_ids.append(run_id)
        self.scheduler.open_stream(run_id)

        def create() -> dict[str, Any]:
            run.state = self.engine.create_run(spec, seed, optimizer)
            self.residency.adopt(run)
            self._persist_run(run)
            return {"model_id": run_id, "type": "create_model"}

        def make(record: FutureRecord) -> Work:
            return Work(run_id, "create_model", self._complete(record), action=create, owner=owner)

        record = self.futures.create(owner, "create_model")
        self.scheduler.submit_control(make(record))
        return record

    def _say_where_it_samples(self, run_id: str, spec: LoraSpec) -> None:
        """With vLLM beside the engine, a run whose adapter vLLM cannot serve is told apart at
        creation (its rank against vLLM's limit, its modules), not at its first sample."""
        if self.vllm is None:
            return
        modules = set(spec.module_suffixes())
        why = self.vllm.why_not(spec.rank, modules)
        if why is not None:
            log.warning("run %s will sample on the torch engine, not vLLM: %s", run_id, why)

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
            "optimizer_config": optimizer_config(run.optimizer),
            "type": "get_info",
        }

    def base_model_facts(self) -> dict[str, str | bool | int]:
        """What the resident base model really is: where its weights came from, its dtype, and
        whether a run's bits are its own (batch invariance; sampler and trainer bitwise equal
        at temperature 1 without top-k or top-p when so)."""
        engine = self.engine
        invariant = engine.invariance_guaranteed
        return {
            "base_model_origin": engine.model_origin,
            "dtype": str(engine.dtype).removeprefix("torch."),
            "dtype_reason": engine.dtype_reason,
            "device": engine.layout.kind,
            "emulated": engine.layout.emulated,
            "batch_invariant": invariant,
            "sampler_trainer_bitwise": invariant and self.sampler_is_engine,
            "sampling_backend": self.sampling_backend(),
            "deterministic": invariant or engine.deterministic,
            "fused_optimizer": engine.fused_optimizer,
            "threads": torch.get_num_threads(),
        }

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
        invalid: BaseException | None = call.error
        if invalid is None and call.loss_fn in NEEDS_SAMPLING_RECORD:
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
            except Exception as exc:  # noqa: BLE001 - any refusal keeps the request's place
                invalid = exc
        kind = "forward" if call.forward_only else "forward_backward"
        tokens = _work_units(job.data)
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

        # The run's state is resolved when the job executes, not when it is queued (a
        # load_weights queued before it must take effect first), but the binding must exist
        # before the job is queued: the scheduler's thread can start it at once.
        job.state = _LazyState(self, run)  # type: ignore[assignment]
        return self._ordered(owner, run, call.seq_id, kind, make)

    def optim_step(self, owner: str, body: dict[str, Any]) -> FutureRecord:
        run = self._run(owner, body["model_id"])
        seq_id = optional_integer(body.get("seq_id"), "seq_id")
        with self._refusal_keeps_order(owner, run, seq_id, "optim_step"):
            params = parse_optim_params(body, run.optimizer)

        def step() -> dict[str, Any]:
            return {"metrics": self.engine.optim_step(self._require_state(run), params)}

        return self._ordered_action(owner, run, seq_id, "optim_step", step)

    def delete_run(self, owner: str, run_id: str) -> None:
        """Free a run: pending requests fail, memory is released, checkpoints stay."""
        run = self._run(owner, run_id)
        self._retire_run(run_id, f"training run {run_id} was deleted")

        def free() -> None:
            self.residency.forget(run)

        self.scheduler.submit_control(
            Work(run_id, "delete_run", lambda *_: None, action=free, owner=owner)
        )


class _LazyState:
    """Resolves a run's engine state at execution time (after earlier loads in its stream),
    reloading it first if it was evicted."""

    def __init__(self, service: ServiceCore, run: Run):
        self._service = service
        self._run = run

    def __getattr__(self, name: str):
        return getattr(self._service._state(self._run), name)


def _work_units(data: list) -> int:
    """What a forward_backward costs against a key's queue quota: positions times the widest
    per-position input (2-D targets cost their width), at least the tokens."""
    return sum(
        len(d.tokens) * max([1, *(a.shape[1] for a in d.inputs.values() if a.ndim == 2)])
        for d in data
    )


def _encode_fb(result: ForwardBackwardResult) -> bytes:
    return encode_forward_backward_output(result.outputs, result.metrics)
