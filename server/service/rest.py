"""The REST surface: training runs and checkpoints listed, deleted and published."""

from __future__ import annotations

import datetime as dt
from typing import Any

from server.service.core import ServiceCore
from server.service.errors import NotFound
from server.service.records import str_metadata
from server.service.request_fields import ttl_seconds


class RestQueries(ServiceCore):
    """The REST surface over runs and checkpoints: describe, list, delete, expire, publish."""

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
            "user_metadata": str_metadata(user_meta),
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

    def delete_checkpoint(self, owner: str, run_id: str, kind: str, name: str) -> None:
        path = self._owned_path(owner, run_id, kind, name)
        self.store.delete(path)
        self.adapters.drop(str(path))

    def set_ttl(self, owner: str, run_id: str, kind: str, name: str, ttl: int | None) -> None:
        path = self._owned_path(owner, run_id, kind, name)
        expires = None
        if ttl is not None:
            seconds = ttl_seconds(ttl)
            expires = (dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds)).isoformat()
        self.store.update_meta(path, expires_at=expires)

    def set_public(self, owner: str, run_id: str, kind: str, name: str, public: bool) -> None:
        self.store.update_meta(self._owned_path(owner, run_id, kind, name), public=public)


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
