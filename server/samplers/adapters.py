"""Adapters for an external sampler: immutable, content-addressed PEFT directories, and which of
them the inference server currently holds.

An inference server that hot-loads LoRA adapters caches them *by name*, so a name must never be
reused for different weights. `AdapterPublisher` therefore publishes every adapter under a name
derived from a SHA-256 of its tensors and PEFT config (`<root>/adapters/<name>/`), written into a
staging directory and renamed into place: a reader never sees a half-written adapter, and two
publishers of the same weights agree on the name. `LoadedAdapters` remembers which names the
server holds, loads each name once, and unloads the least recently used ones beyond a cap, never
one that a request in flight is using. Nothing here speaks HTTP: loading and unloading are
callables handed in.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file

from server.engine.lora import AdapterWeights
from server.storage.checkpoints import adapter_tensors, peft_config
from server.storage.ownership import ensure_writable_dir

log = logging.getLogger(__name__)

NAME_PREFIX = "lora-"
DIGEST_CHARS = 32
"""128 bits of the SHA-256: collisions are out of reach, and names stay readable in logs."""
TENSORS_FILE = "adapter_model.safetensors"
CONFIG_FILE = "adapter_config.json"


@dataclass(frozen=True)
class PublishedAdapter:
    """An adapter on shared storage: the name the inference server knows it by, and its path."""

    name: str
    path: Path


def content_digest(tensors: dict[str, torch.Tensor], config: dict) -> str:
    """SHA-256 over the PEFT config and every tensor's name, dtype, shape and bytes."""
    digest = hashlib.sha256()
    digest.update(json.dumps(config, sort_keys=True).encode())
    for key in sorted(tensors):
        tensor = tensors[key].detach().cpu().contiguous()
        digest.update(f"\0{key}\0{tensor.dtype}\0{tuple(tensor.shape)}\0".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def _fingerprint(adapter: AdapterWeights) -> tuple:
    """Changes whenever a tensor is replaced or modified in place (torch bumps `_version`)."""
    return (adapter.spec,) + tuple(
        (name, t.data_ptr(), t._version) for name in sorted(adapter.a)
        for t in (adapter.a[name], adapter.b[name])
    )


class AdapterPublisher:
    """Writes adapters as PEFT directories named by their content; idempotent and thread-safe."""

    def __init__(self, root: str | Path, base_model: str):
        self.directory = ensure_writable_dir(Path(root) / "adapters")
        self.base_model = base_model
        self._lock = threading.Lock()
        self._known: dict[int, tuple[weakref.ref, tuple, PublishedAdapter]] = {}

    def publish(self, adapter: AdapterWeights) -> PublishedAdapter:
        """The adapter's versioned directory, written now unless these weights already were."""
        key = id(adapter)
        fingerprint = _fingerprint(adapter)
        with self._lock:
            known = self._known.get(key)
            if known is not None and known[0]() is adapter and known[1] == fingerprint:
                return known[2]
        tensors = adapter_tensors(adapter)
        config = peft_config(adapter.spec, self.base_model, adapter.a)
        name = NAME_PREFIX + content_digest(tensors, config)[:DIGEST_CHARS]
        published = PublishedAdapter(name, self.directory / name)
        if not self._complete(published.path):
            self._write(published.path, tensors, config)
        else:
            os.utime(published.path)  # recency, for `prune`
        with self._lock:
            self._known[key] = (weakref.ref(adapter, lambda _, k=key: self._forget(k)),
                                fingerprint, published)
        return published

    def prune(self, keep: int, protected: set[str]) -> list[str]:
        """Delete the least recently published directories beyond the newest `keep`, never a
        `protected` one (loaded in the inference server, or in use by a request). An RL loop
        publishes one adapter per step; without this the directory grows by one per step.
        Returns the names deleted. A pruned adapter is simply written again if used again."""
        entries = []
        for path in self.directory.iterdir():
            if path.name.startswith(NAME_PREFIX) and path.is_dir():
                with contextlib.suppress(FileNotFoundError):
                    entries.append((path.stat().st_mtime, path))
        entries.sort(reverse=True)
        pruned = []
        for _, path in entries[keep:]:
            if path.name in protected:
                continue
            shutil.rmtree(path, ignore_errors=True)
            pruned.append(path.name)
        if pruned:
            gone = set(pruned)
            with self._lock:
                for key in [k for k, v in self._known.items() if v[2].name in gone]:
                    del self._known[key]
            log.info("pruned %d published adapters", len(pruned))
        return pruned

    def _forget(self, key: int) -> None:
        with self._lock:
            self._known.pop(key, None)

    @staticmethod
    def _complete(path: Path) -> bool:
        return (path / TENSORS_FILE).is_file() and (path / CONFIG_FILE).is_file()

    def _write(self, target: Path, tensors: dict[str, torch.Tensor], config: dict) -> None:
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=self.directory))
        try:
            save_file(tensors, str(staging / TENSORS_FILE))
            (staging / CONFIG_FILE).write_text(json.dumps(config, indent=2))
            for file in staging.iterdir():
                with open(file, "rb") as handle:
                    os.fsync(handle.fileno())
            try:
                os.rename(staging, target)
            except OSError:
                if not self._complete(target):
                    raise
                # Another writer published the same content first; its copy is identical.
            log.info("published adapter %s", target.name)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)


@dataclass
class _Entry:
    refs: int = 0
    loaded: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class LoadedAdapters:
    """Which adapter names the inference server holds, most recently used last.

    `use(name, path)` loads a name once (concurrent users of one name wait for a single load)
    and pins it while the caller's request runs. Beyond `capacity` loaded names, the least
    recently used unpinned ones are unloaded.
    """

    def __init__(self, capacity: int, load: Callable[[str, str], None],
                 unload: Callable[[str], None]):
        if capacity < 1:
            raise ValueError("the adapter cap must be at least 1")
        self.capacity = capacity
        self._load, self._unload = load, unload
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def names(self) -> list[str]:
        """Loaded names, least recently used first."""
        with self._lock:
            return [name for name, entry in self._entries.items() if entry.loaded]

    def held(self) -> set[str]:
        """Names loaded, being loaded or in use by a request: not to be deleted from disk."""
        with self._lock:
            return {name for name, entry in self._entries.items() if entry.loaded or entry.refs}

    @contextlib.contextmanager
    def use(self, name: str, path: str | Path) -> Iterator[None]:
        with self._lock:
            entry = self._entries.setdefault(name, _Entry())
            entry.refs += 1
            self._entries.move_to_end(name)
        try:
            with entry.lock:
                if not entry.loaded:
                    self._load(name, str(path))
                    entry.loaded = True
            self._evict()
            yield
        finally:
            with self._lock:
                entry.refs -= 1
                if entry.refs == 0 and not entry.loaded and self._entries.get(name) is entry:
                    del self._entries[name]
            self._evict()

    def forget(self, name: str) -> None:
        """The server no longer holds `name` (it restarted): load it again on next use."""
        with self._lock:
            entry = self._entries.get(name)
        if entry is not None:
            with entry.lock:
                entry.loaded = False

    def _evict(self) -> None:
        with self._lock:
            loaded = [(n, e) for n, e in self._entries.items() if e.loaded]
            excess = len(loaded) - self.capacity
            victims = [(n, e) for n, e in loaded if e.refs == 0][: max(excess, 0)]
        for name, entry in victims:
            with entry.lock:
                with self._lock:
                    if entry.refs > 0 or not entry.loaded:
                        continue  # picked up again meanwhile: keep it
                try:
                    self._unload(name)
                except Exception as exc:  # noqa: BLE001 - a failed unload only costs memory
                    log.warning("unloading adapter %s failed: %s", name, exc)
                entry.loaded = False
                with self._lock:
                    if entry.refs == 0 and self._entries.get(name) is entry:
                        del self._entries[name]
