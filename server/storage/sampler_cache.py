"""Sampler snapshots in bounded memory: the most recently used stay resident, the rest on disk.

An RL loop takes a new sampler snapshot every step (`save_weights_and_get_sampling_client`),
and every snapshot stays valid for as long as the server runs. Kept in memory, a study of a few
hundred steps holds gigabytes of adapters that nobody samples from again. So at most
`max_resident` snapshots keep their weights in memory; an older one is written once to
`<data-dir>/.spill/samplers/` (or, when it is a saved checkpoint, simply dropped, as the
checkpoint is on disk already) and read back on its next request. Snapshots are immutable, so a
reloaded one samples exactly as before.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from pathlib import Path

import torch

from server.engine.lora import AdapterWeights
from server.storage.spill import (
    adapter_from_payload,
    adapter_payload,
    read_spill,
    spill_path,
    write_spill,
)

DEFAULT_MAX_RESIDENT = 32


class SamplerCache:
    """Adapter weights of sampler snapshots by sampler id, with an LRU bound on memory."""

    def __init__(self, spill_dir: Path, device: torch.device | str,
                 max_resident: int | None = DEFAULT_MAX_RESIDENT,
                 on_change: Callable[[int], None] | None = None):
        self.spill_dir = spill_dir
        self.device = device
        self.max_resident = max_resident
        self.on_change = on_change
        self._resident: collections.OrderedDict[str, AdapterWeights] = collections.OrderedDict()
        self._reloaders: dict[str, Callable[[], AdapterWeights]] = {}
        self._lock = threading.Lock()
        self.evictions = 0

    def put(self, sampler_id: str, adapter: AdapterWeights,
            reload: Callable[[], AdapterWeights] | None = None) -> None:
        """Hold a new snapshot; `reload` rebuilds it from a checkpoint (else it spills to disk)."""
        with self._lock:
            self._resident[sampler_id] = adapter
            self._resident.move_to_end(sampler_id)
            if reload is not None:
                self._reloaders[sampler_id] = reload
            self._enforce_cap()

    def put_on_disk(self, sampler_id: str, reload: Callable[[], AdapterWeights]) -> None:
        """Know a snapshot whose weights stay on disk until first asked for (after a restart,
        say): nothing is read now, and its first `get` counts against the cap like any other."""
        with self._lock:
            self._reloaders[sampler_id] = reload

    def get(self, sampler_id: str) -> AdapterWeights:
        """The snapshot's weights, read back from disk if they were evicted."""
        with self._lock:
            adapter = self._resident.get(sampler_id)
            if adapter is not None:
                self._resident.move_to_end(sampler_id)
                return adapter
            reload = self._reloaders.get(sampler_id)
        adapter = reload() if reload is not None else self._load(sampler_id)
        with self._lock:
            adapter = self._resident.setdefault(sampler_id, adapter)
            self._resident.move_to_end(sampler_id)
            self._enforce_cap()
        return adapter

    def drop(self, sampler_id: str) -> None:
        """Forget a snapshot for good: its memory, its reloader and its spill file."""
        with self._lock:
            self._resident.pop(sampler_id, None)
            self._reloaders.pop(sampler_id, None)
            if self.on_change is not None:
                self.on_change(len(self._resident))
        spill_path(self.spill_dir, sampler_id).unlink(missing_ok=True)

    def resident_count(self) -> int:
        with self._lock:
            return len(self._resident)

    def _enforce_cap(self) -> None:
        while self.max_resident is not None and len(self._resident) > self.max_resident:
            sampler_id, adapter = self._resident.popitem(last=False)
            if sampler_id not in self._reloaders:
                self._spill(sampler_id, adapter)
                self._reloaders[sampler_id] = lambda s=sampler_id: self._load(s)
            self.evictions += 1
        if self.on_change is not None:
            self.on_change(len(self._resident))

    def _spill(self, sampler_id: str, adapter: AdapterWeights) -> None:
        write_spill(adapter_payload(adapter), spill_path(self.spill_dir, sampler_id))

    def _load(self, sampler_id: str) -> AdapterWeights:
        return adapter_from_payload(read_spill(spill_path(self.spill_dir, sampler_id),
                                               self.device))
