"""Adapters on disk while they are not needed in memory: one format for runs and snapshots.

Both evicted training runs (`residency`) and old sampler snapshots (`sampler_cache`) leave
memory the same way: their LoRA weights (plus whatever else the caller adds) go to one file
under the data directory's `.spill/`, written atomically so a crash never leaves half a file
where a reload would look.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from server.engine.lora import AdapterWeights, LoraSpec


def spill_path(directory: Path, key: str) -> Path:
    """The file for a run or sampler id (ids hold ':' and '/', which paths cannot)."""
    return directory / (key.replace(":", "_").replace("/", "_") + ".pt")


def adapter_payload(adapter: AdapterWeights) -> dict[str, Any]:
    return {
        "spec": asdict(adapter.spec),
        "a": {k: v.detach().cpu() for k, v in adapter.a.items()},
        "b": {k: v.detach().cpu() for k, v in adapter.b.items()},
    }


def adapter_from_payload(payload: dict[str, Any]) -> AdapterWeights:
    return AdapterWeights(LoraSpec(**payload["spec"]), payload["a"], payload["b"])


def write_spill(payload: dict[str, Any], target: Path) -> Path:
    """Save atomically. torch.save names the archive after the file's stem, which must not be
    empty, so the temporary file gets a real name."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".spill-", suffix=".tmp", dir=target.parent)
    os.close(fd)
    torch.save(payload, tmp)
    os.replace(tmp, target)
    return target


def read_spill(path: Path, device: torch.device | str) -> dict[str, Any]:
    return torch.load(path, map_location=device, weights_only=True)
