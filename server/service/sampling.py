"""Sampling sessions, snapshot lookups and sample requests."""

from __future__ import annotations

import time
from typing import Any

from server.engine.engine import Engine, SampleJob, SamplingParams, UserError
from server.engine.lora import AdapterWeights
from server.engine.losses import LOSSES, NEEDS_SAMPLING_RECORD
from server.protocol.codec import encode_sample_response
from server.protocol.futures import FutureRecord
from server.scheduling.scheduler import Work
from server.service.core import ServiceCore
from server.service.errors import NotFound, SnapshotFreed
from server.service.records import Sampler
from server.service.request_fields import flag, integer, number, optional_integer
from server.service.sampling_records import session_of
from server.storage.checkpoints import TinkerPath


class SamplingRequests(ServiceCore):
    """Sampling sessions on the base model, a checkpoint or a run's snapshot, and their samples."""

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
        if not isinstance(sampler_id, str):
            raise NotFound(f"unknown sampling session {str(sampler_id)[:80]!r}")
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
        refuse_unserved_fields(body)
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
            prompt_logprobs_last_n=optional_integer(
                body.get("prompt_logprobs_last_n"), "prompt_logprobs_last_n"
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
        work = Work(
            None,
            "sample",
            done,
            sample=job,
            tokens=(len(tokens) + Engine._max_new(job)) * num,
            owner=owner,
        )
        if self.vllm is None or not self.vllm.take(work, self.scheduler.submit_sample):
            self.scheduler.submit_sample(work)
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


UNSERVED_SAMPLE_FIELDS = {
    "topk_sample_logprobs": "top-k logprobs of sampled tokens",
    "target_prompt_logprobs": "logprobs of chosen tokens at prompt positions",
    "prompt_alt_tokens_k": "alternative tokens drawn at prompt positions",
}
"""Fields of SDK 0.38's `SampleRequest` this server does not serve. A request that asks for
one is refused with its name: answering without the data would let a client compute on
values that never came (the SDK itself only notices some of them)."""


def refuse_unserved_fields(body: dict[str, Any]) -> None:
    """Refuse a sample request that asks for what the server does not compute."""
    for name, what in UNSERVED_SAMPLE_FIELDS.items():
        value = body.get(name)
        if value is not None and value is not False and value != 0:
            raise UserError(
                f"{name} ({what}) is not served by this server; send the request without it "
                "(prompt_logprobs and topk_prompt_logprobs are served)"
            )
