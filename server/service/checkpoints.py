"""Saving and loading run state as checkpoints, in the run's order."""

from __future__ import annotations

import uuid
from typing import Any

from server.engine.dimuon import optimizer_type
from server.engine.engine import UserError
from server.engine.lora import LoraSpec
from server.protocol.futures import FutureRecord
from server.scheduling.scheduler import Work
from server.service.errors import NotFound
from server.service.optim_params import parse_optimizer_config
from server.service.ordering import RunOrdering
from server.service.records import Run, Sampler
from server.service.request_fields import flag, integer, metadata, optional_integer
from server.storage.checkpoints import TinkerPath, now_iso, validate_name


class CheckpointRequests(RunOrdering):
    """Saving and loading a run's weights, copying checkpoints and describing their weights."""

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

        return self._ordered_action(owner, run, seq_id, "save_weights", save)

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
            if body.get("kind") not in (None, "snapshot"):
                raise UserError(
                    f"kind {body['kind']!r} is not served by this server: a sampler here serves "
                    "a snapshot of the weights it was saved from (kind 'snapshot'); save again "
                    "after further steps"
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

        return self._ordered_action(
            owner, run, seq_id, "save_weights_for_sampler", save, work_kind="save_for_sampler"
        )

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
            run.state = self.engine.restore_run(adapter, opt_state, run.optimizer)
            run.optimizer = optimizer_type(opt_state) or run.optimizer
            self.residency.adopt(run)
            return {"path": str(path), "model_id": run.run_id, "type": "load_weights"}

        return self._ordered_action(owner, run, seq_id, "load_weights", load)

    def _load_source(self, owner: str, body: dict[str, Any]) -> tuple[TinkerPath, bool]:
        """The checkpoint a load_weights request reads, checked readable by the caller."""
        refuse_access_token(body)
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
        run_id = f"{session.session_id}:train:{integer(body['model_seq_id'], 'model_seq_id')}"
        if run_id in self.runs:
            raise UserError(f"model_seq_id {body['model_seq_id']} was already used in this session")
        self._check_run_quota(owner, run_id)
        source_meta = self.store.read_run(path.run_id) or {}
        user_metadata = metadata(body.get("user_metadata")) or source_meta.get("user_metadata")
        requested = parse_optimizer_config(body.get("optimizer_config"))
        run = Run(run_id, owner, self.base_model, LoraSpec(rank=1), dict(user_metadata or {}),
                  optimizer=requested)
        self.runs[run_id] = run
        session.run_ids.append(run_id)
        self.scheduler.open_stream(run_id)

        def load() -> dict[str, Any]:
            adapter, opt_state, _ = self.store.load(path, self.engine.device, with_optimizer)
            run.spec = adapter.spec
            run.state = self.engine.restore_run(adapter, opt_state, requested)
            run.optimizer = optimizer_type(opt_state) or requested
            self.residency.adopt(run)
            self._persist_run(run)
            return {"path": str(path), "model_id": run_id, "type": "load_weights"}

        record = self.futures.create(owner, "load_weights")
        self.scheduler.submit_control(
            Work(run_id, "load_weights", self._complete(record), action=load, owner=owner)
        )
        return record

    def weights_info(self, owner: str, tinker_path: str) -> dict[str, Any]:
        path = TinkerPath.parse(tinker_path)
        self._readable_checkpoint(owner, path)
        import json

        try:
            config = json.loads(
                (self.store.checkpoint_dir(path) / "adapter_config.json").read_text())
        except FileNotFoundError:  # expired or deleted between the check and the read
            raise NotFound(f"checkpoint {tinker_path!r} no longer exists") from None
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
        refuse_access_token(body)
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


ACCESS_TOKEN_REFUSAL = (
    "weights_access_token is not served by this server: a checkpoint is read with its owner's "
    "API key (or exported with save_weights_external); send the request without it"
)


def refuse_access_token(body: dict[str, Any]) -> None:
    """A `weights_access_token` asks to read another owner's weights with a grant the hosted
    service issues; here a checkpoint is readable by its owner's key alone (and through signed
    export URLs), so the request is refused by the field's name rather than served as if the
    token had been checked (`server.api.grants` refuses the same grant sent as a header)."""
    if body.get("weights_access_token"):
        raise UserError(ACCESS_TOKEN_REFUSAL)
