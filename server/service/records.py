"""The service's bookkeeping records: quotas, sessions, runs and samplers."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server.engine.engine import RunState
from server.engine.lora import AdapterWeights, LoraSpec
from server.service.lifecycle import LifecyclePolicy
from server.storage.checkpoints import now_iso
from server.storage.sampler_cache import DEFAULT_MAX_RESIDENT


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
    optimizer: str = "adamw"
    """The optimizer family chosen when the run was created (`adamw` or `dimuon`)."""


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


def str_metadata(meta: dict[str, Any] | None) -> dict[str, str] | None:
    """User metadata as the SDK returns it: every key and value a string."""
    return None if meta is None else {str(k): str(v) for k, v in meta.items()}
