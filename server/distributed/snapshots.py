"""Immutable adapter snapshots in shared storage, named by the hash of their contents.

A sampler worker (or the vLLM server behind it) only ever loads `<data_dir>/snapshots/<sha>/`,
a standard PEFT adapter directory that is written once under a temporary name and renamed into
place. A later training step produces a new hash, so a snapshot being served is never replaced.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from server.engine.lora import AdapterWeights
from server.storage.checkpoints import (
    adapter_from_tensors,
    adapter_tensors,
    peft_config,
    spec_from_peft,
)

WEIGHTS = "adapter_model.safetensors"
CONFIG = "adapter_config.json"


@dataclass
class StoredAdapter(AdapterWeights):
    """Adapter weights that also say which snapshot directory they were loaded from."""

    path: Path | None = None


def snapshot_root(data_dir: Path) -> Path:
    return Path(data_dir) / "snapshots"


def _digest(file: Path) -> str:
    sha = hashlib.sha256()
    with open(file, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
    return sha.hexdigest()[:32]


def _publish(staging: Path, root: Path) -> Path:
    """Rename a staged adapter dir to its content name (keeping an existing one)."""
    target = root / _digest(staging / WEIGHTS)
    if target.exists():
        shutil.rmtree(staging, ignore_errors=True)
        return target
    try:
        os.replace(staging, target)
    except OSError:  # another writer published the same content first
        shutil.rmtree(staging, ignore_errors=True)
    return target


def write_snapshot(data_dir: Path, adapter: AdapterWeights, base_model: str) -> Path:
    root = snapshot_root(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    save_file(adapter_tensors(adapter), str(staging / WEIGHTS))
    config = peft_config(adapter.spec, base_model, adapter.a)
    (staging / CONFIG).write_text(json.dumps(config, indent=2))
    return _publish(staging, root)


def snapshot_checkpoint(data_dir: Path, checkpoint_dir: Path) -> Path:
    """A checkpoint can be overwritten in place; sampling uses a copy under its content name."""
    root = snapshot_root(data_dir)
    root.mkdir(parents=True, exist_ok=True)
    target = root / _digest(checkpoint_dir / WEIGHTS)
    if target.exists():
        return target
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=root))
    for name in (WEIGHTS, CONFIG):
        shutil.copyfile(checkpoint_dir / name, staging / name)
    return _publish(staging, root)


def load_snapshot(path: Path, device: torch.device | str) -> StoredAdapter:
    config = json.loads((Path(path) / CONFIG).read_text())
    tensors = load_file(str(Path(path) / WEIGHTS), device=str(device))
    plain = adapter_from_tensors(spec_from_peft(config), tensors)
    return StoredAdapter(plain.spec, plain.a, plain.b, path=Path(path))
