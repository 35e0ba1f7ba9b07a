"""Checkpoints on disk: every checkpoint directory is a standard PEFT adapter.

Layout under the data directory::

    runs/<run>/run.json                          run metadata (owner, base model, LoRA spec)
    runs/<run>/<kind>/<name>/adapter_model.safetensors   PEFT tensors
    runs/<run>/<kind>/<name>/adapter_config.json          PEFT config
    runs/<run>/<kind>/<name>/optimizer.pt                 AdamW state (kind "weights" only)
    runs/<run>/<kind>/<name>/checkpoint.json              Tinker checkpoint metadata

`<run>` is the run id with the characters some OS cannot hold in a file name escaped
(`run_dir_name`: `sess-1:train:0` -> `sess-1%3Atrain%3A0`); directories written under the raw
id by earlier versions are still found and loaded.
`kind` is `weights` (training state), `sampler_weights` or `external_weights` (an export for
download, possibly age-encrypted, never loaded back). Every write goes to a temporary
sibling directory that is renamed into place, so a crash never leaves a half-written checkpoint
that a later load would trust, and a checkpoint saved by one server process loads in another.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import tempfile
import threading
import urllib.parse
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from server.engine.lora import ATTN_MODULES, MLP_MODULES, UNEMBED_MODULES, AdapterWeights, LoraSpec
from server.storage.ownership import ensure_writable_dir

KINDS = {"weights": "training", "sampler_weights": "sampler", "external_weights": "external"}
LOADABLE_KINDS = ("weights", "sampler_weights")
PEFT_PREFIX = "base_model.model."
LANGUAGE_MODEL = ".language_model."
"""Where a multimodal checkpoint's language model sits in its module names."""


class CheckpointError(ValueError):
    """A bad or unknown checkpoint path: a user error."""


@dataclass(frozen=True)
class TinkerPath:
    run_id: str
    kind: str
    name: str

    @classmethod
    def parse(cls, path: str) -> TinkerPath:
        if not isinstance(path, str) or not path.startswith("tinker://"):
            raise CheckpointError(
                f"checkpoint paths look like tinker://<run>/<kind>/<name>, got {path!r}"
            )
        parts = path[len("tinker://") :].split("/")
        if len(parts) != 3 or not all(parts):
            raise CheckpointError(
                f"checkpoint paths look like tinker://<run>/<kind>/<name>, got {path!r}"
            )
        run_id, kind, name = parts
        validate_run_id(run_id)
        if kind not in KINDS:
            raise CheckpointError(f"unknown checkpoint kind {kind!r} in {path!r}")
        validate_name(name)
        return cls(run_id, kind, name)

    def __str__(self) -> str:
        return f"tinker://{self.run_id}/{self.kind}/{self.name}"


MAX_NAME_BYTES = 200
"""Below every common file system's 255-byte limit on one path component, with room for the
temporary suffix a write uses."""


def validate_name(name: str) -> None:
    """A checkpoint name that is one safe path component on every OS."""
    if (
        not isinstance(name, str)
        or not name
        or "/" in name
        or "\\" in name
        or name in (".", "..")
        or name.startswith(".")
        or any(ord(c) < 32 or ord(c) == 127 for c in name)
        or len(name.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES
    ):
        raise CheckpointError(
            f"invalid checkpoint name {name[:80]!r}: one path component of at most "
            f"{MAX_NAME_BYTES} bytes, no control characters, not starting with '.'"
        )


def validate_run_id(run_id: str) -> None:
    """A run id whose directory name fits one path component."""
    if not run_id or len(run_dir_name(run_id).encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES:
        raise CheckpointError(f"invalid run id {run_id[:80]!r}")


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat()


def peft_config(spec: LoraSpec, base_model: str,
                module_names: Iterable[str] = ()) -> dict[str, Any]:
    """The adapter's PEFT config. Where the modules live in a multimodal checkpoint's language
    model (`module_names` say so), `target_modules` is a pattern that keeps PEFT off the vision
    tower, whose attention layers carry the same suffixes."""
    suffixes = sorted(spec.module_suffixes())
    targets: list[str] | str = suffixes
    if any(LANGUAGE_MODEL in name for name in module_names):
        inner = "|".join(s for s in suffixes if s not in UNEMBED_MODULES)
        alternatives = [rf"model\.language_model\..*\.({inner})"] if inner else []
        alternatives += [s for s in suffixes if s in UNEMBED_MODULES]
        targets = "^(" + "|".join(alternatives) + ")$"
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model,
        "r": spec.rank,
        "lora_alpha": spec.alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": targets,
        "fan_in_fan_out": False,
        "init_lora_weights": True,
        "use_rslora": False,
        "inference_mode": True,
    }


def spec_from_peft(config: dict[str, Any]) -> LoraSpec:
    raw = config.get("target_modules") or []
    if isinstance(raw, str):  # a pattern: the families it names
        targets = {m for m in ATTN_MODULES + MLP_MODULES + UNEMBED_MODULES if m in raw}
    else:
        targets = set(raw)
    return LoraSpec(
        rank=int(config["r"]),
        train_attn=bool(targets & set(ATTN_MODULES)),
        train_mlp=bool(targets & set(MLP_MODULES)),
        train_unembed=bool(targets & set(UNEMBED_MODULES)),
        alpha=float(config.get("lora_alpha", config["r"])),
    )


def adapter_tensors(adapter: AdapterWeights) -> dict[str, torch.Tensor]:
    tensors = {}
    for name in adapter.a:
        tensors[f"{PEFT_PREFIX}{name}.lora_A.weight"] = (
            adapter.a[name].detach().float().cpu().contiguous()
        )
        tensors[f"{PEFT_PREFIX}{name}.lora_B.weight"] = (
            adapter.b[name].detach().float().cpu().contiguous()
        )
    return tensors


def adapter_from_tensors(spec: LoraSpec, tensors: dict[str, torch.Tensor]) -> AdapterWeights:
    adapter = AdapterWeights(spec)
    for key, value in tensors.items():
        if not key.startswith(PEFT_PREFIX):
            continue
        module, _, which = key[len(PEFT_PREFIX) :].rpartition(".lora_")
        if which == "A.weight":
            adapter.a[module] = value
        elif which == "B.weight":
            adapter.b[module] = value
    if set(adapter.a) != set(adapter.b) or not adapter.a:
        raise CheckpointError("checkpoint tensors are incomplete")
    return adapter


UNPORTABLE = set('<>:"\\|?*%')
"""Characters some supported OS cannot hold in a file name (Windows; Finder shows ":" as "/"),
and "%", which escapes them."""


MAX_NAME_BYTES = 255
"""The longest file name ext4, APFS and most file systems hold: a longer run id is no run's."""


def run_dir_name(run_id: str) -> str:
    """The directory name of a run: its id with unportable characters percent-escaped
    (`sess-1:train:0` -> `sess-1%3Atrain%3A0`), so every OS can hold it; reversible."""
    return "".join(f"%{ord(c):02X}" if c in UNPORTABLE or ord(c) < 32 else c for c in run_id)


def run_id_of(directory_name: str) -> str:
    """The run id a directory name stands for (an unescaped legacy name stands for itself)."""
    return urllib.parse.unquote(directory_name)


class CheckpointStore:
    """Reads and writes run metadata and checkpoints under one data directory."""

    def __init__(self, data_dir: str | Path):
        self.root = Path(data_dir)
        ensure_writable_dir(self.root / "runs")
        self._lock = threading.Lock()

    def run_dir(self, run_id: str) -> Path:
        if "/" in run_id or run_id in (".", "..") or not run_id:
            raise CheckpointError(f"invalid run id {run_id!r}")
        if len(run_dir_name(run_id).encode()) > MAX_NAME_BYTES:
            raise CheckpointError(f"invalid run id {run_id[:80]!r}...: longer than any run's")
        directory = self.root / "runs" / run_dir_name(run_id)
        if not directory.exists():
            legacy = self.root / "runs" / run_id  # written before names were made portable
            with contextlib.suppress(OSError, ValueError):
                if legacy != directory and legacy.exists():
                    return legacy
        return directory

    def checkpoint_dir(self, path: TinkerPath) -> Path:
        return self.run_dir(path.run_id) / path.kind / path.name

    # ---------------------------------------------------------------- runs
    def write_run(self, run_id: str, meta: dict[str, Any]) -> None:
        directory = self.run_dir(run_id)
        directory.mkdir(parents=True, exist_ok=True)
        _atomic_write_text(directory / "run.json", json.dumps(meta, indent=2))

    def read_run(self, run_id: str) -> dict[str, Any] | None:
        try:
            return json.loads((self.run_dir(run_id) / "run.json").read_text())
        except (FileNotFoundError, CheckpointError):
            return None

    def list_runs(self) -> list[str]:
        return sorted({run_id_of(p.parent.name)
                       for p in (self.root / "runs").glob("*/run.json")})

    # --------------------------------------------------------- checkpoints
    def save(
        self,
        path: TinkerPath,
        adapter: AdapterWeights,
        base_model: str,
        optimizer_state: dict | None,
        meta: dict[str, Any],
        overwrite: bool = True,
        prepare: Callable[[Path], None] | None = None,
    ) -> dict[str, Any]:
        """Write a checkpoint atomically; `prepare` may transform the staged files first
        (e.g. encrypt an export) before the size and metadata are recorded."""
        target = self.checkpoint_dir(path)
        with self._lock:
            if target.exists() and not overwrite:
                raise CheckpointError(f"checkpoint {path} already exists")
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
        try:
            save_file(adapter_tensors(adapter), str(staging / "adapter_model.safetensors"))
            (staging / "adapter_config.json").write_text(
                json.dumps(peft_config(adapter.spec, base_model, adapter.a), indent=2)
            )
            if optimizer_state is not None:
                torch.save(optimizer_state, staging / "optimizer.pt")
            if prepare is not None:
                prepare(staging)
            size = sum(f.stat().st_size for f in staging.iterdir())
            record = {
                "checkpoint_id": f"{path.kind}/{path.name}",
                "checkpoint_type": KINDS[path.kind],
                "time": now_iso(),
                "tinker_path": str(path),
                "size_bytes": size,
                "public": False,
                **meta,
            }
            (staging / "checkpoint.json").write_text(json.dumps(record, indent=2))
            with self._lock:
                if target.exists():
                    trash = Path(tempfile.mkdtemp(prefix=".trash-", dir=target.parent))
                    os.replace(target, trash / "old")
                    shutil.rmtree(trash, ignore_errors=True)
                os.replace(staging, target)
            return record
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)

    def load(
        self, path: TinkerPath, device: torch.device, with_optimizer: bool
    ) -> tuple[AdapterWeights, dict | None, dict[str, Any]]:
        directory = self.checkpoint_dir(path)
        if not (directory / "checkpoint.json").exists():
            raise CheckpointError(f"no checkpoint at {path}")
        if path.kind not in LOADABLE_KINDS:
            raise CheckpointError(f"{path} is an export for download; load a weights/ checkpoint")
        config = json.loads((directory / "adapter_config.json").read_text())
        tensors = load_file(str(directory / "adapter_model.safetensors"), device=str(device))
        adapter = adapter_from_tensors(spec_from_peft(config), tensors)
        optimizer_state = None
        if with_optimizer:
            opt_file = directory / "optimizer.pt"
            if not opt_file.exists():
                raise CheckpointError(
                    f"{path} has no optimizer state (sampler checkpoints never do)"
                )
            optimizer_state = torch.load(opt_file, map_location=device, weights_only=True)
        return adapter, optimizer_state, self.read_meta(path)

    def read_meta(self, path: TinkerPath) -> dict[str, Any]:
        try:
            return json.loads((self.checkpoint_dir(path) / "checkpoint.json").read_text())
        except FileNotFoundError:
            raise CheckpointError(f"no checkpoint at {path}") from None

    def update_meta(self, path: TinkerPath, **changes: Any) -> dict[str, Any]:
        with self._lock:
            meta = self.read_meta(path)
            meta.update(changes)
            _atomic_write_text(
                self.checkpoint_dir(path) / "checkpoint.json", json.dumps(meta, indent=2)
            )
            return meta

    def list(self, run_id: str) -> list[dict[str, Any]]:
        records = []
        directory = self.run_dir(run_id)
        for kind in KINDS:
            for meta_file in sorted((directory / kind).glob("*/checkpoint.json")):
                records.append(json.loads(meta_file.read_text()))
        return sorted(records, key=lambda r: r["time"])

    def delete(self, path: TinkerPath) -> None:
        directory = self.checkpoint_dir(path)
        if not directory.exists():
            raise CheckpointError(f"no checkpoint at {path}")
        with self._lock:
            trash = Path(tempfile.mkdtemp(prefix=".trash-", dir=directory.parent))
            os.replace(directory, trash / "old")
        shutil.rmtree(trash, ignore_errors=True)

    def expire(self, now: dt.datetime | None = None) -> list[str]:
        """Delete checkpoints whose TTL has passed; returns their paths."""
        now = now or dt.datetime.now(dt.UTC)
        removed = []
        for run_id in self.list_runs():
            for record in self.list(run_id):
                expires = record.get("expires_at")
                if expires and dt.datetime.fromisoformat(expires) <= now:
                    self.delete(TinkerPath.parse(record["tinker_path"]))
                    removed.append(record["tinker_path"])
        return removed


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
