"""Checkpointed adapters read from disk once, not on every request that names them.

A client may sample with `model_path=tinker://...` on every call, or open many sampling
sessions on the same checkpoint; each would otherwise read and decode the adapter again. The
most recently used `capacity` adapters stay in memory (checkpoints are immutable; one that is
deleted or expires is dropped from the cache with it).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

from server.engine.lora import AdapterWeights


class AdapterCache:
    def __init__(self, capacity: int = 8):
        self.capacity = capacity
        self._adapters: collections.OrderedDict[str, AdapterWeights] = collections.OrderedDict()
        self._lock = threading.Lock()
        self.loads = 0

    def get(self, path: str, load: Callable[[], AdapterWeights]) -> AdapterWeights:
        with self._lock:
            adapter = self._adapters.get(path)
            if adapter is not None:
                self._adapters.move_to_end(path)
                return adapter
        adapter = load()
        with self._lock:
            self.loads += 1
            adapter = self._adapters.setdefault(path, adapter)
            self._adapters.move_to_end(path)
            while len(self._adapters) > self.capacity:
                self._adapters.popitem(last=False)
        return adapter

    def drop(self, path: str) -> None:
        with self._lock:
            self._adapters.pop(path, None)
