"""Counting host synchronisations inside a model's layer loop, or anywhere in a block of code.

On CUDA and MPS every `.item()`, `int(tensor)`, `bool(tensor)`, `.tolist()`, `nonzero`,
`unique`, boolean-mask indexing or copy to the host waits for the device to finish what it was
given. Inside the layer loop that serialises every layer. On the CPU nothing waits, but the
same calls are made, so a `TorchFunctionMode` that sees them between the first layer's start
and the last layer's end counts what the device would pay.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

SYNCING = {"__int__", "__bool__", "__float__", "__index__", "item", "tolist", "nonzero",
           "unique", "numpy", "cpu", "masked_select", "nonzero_static"}


class _Watch(TorchFunctionMode):
    def __init__(self, seen: Counter, inside: list[bool]):
        super().__init__()
        self.seen, self.inside = seen, inside

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        if self.inside[0]:
            if name in SYNCING:
                self.seen[name] += 1
            elif name == "__getitem__" and _boolean_index(args[1] if len(args) > 1 else None):
                self.seen["boolean index"] += 1
        return func(*args, **(kwargs or {}))


def _boolean_index(index: object) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


@contextlib.contextmanager
def syncs_inside_layers(layers: list[torch.nn.Module]) -> Iterator[Counter]:
    """Count syncing calls made while any of `layers` runs (their forward and hooks)."""
    seen: Counter = Counter()
    inside = [False]

    def enter(*_args: object, **_kwargs: object) -> None:
        inside[0] = True

    def leave(*_args: object, **_kwargs: object) -> None:
        inside[0] = False

    handles = []
    for layer in layers:
        handles.append(layer.register_forward_pre_hook(enter))
        handles.append(layer.register_forward_hook(leave))
    try:
        with _Watch(seen, inside):
            yield seen
    finally:
        for handle in handles:
            handle.remove()


@contextlib.contextmanager
def syncs_during() -> Iterator[Counter]:
    """Count syncing calls made anywhere while the block runs (forward and backward alike):
    for a pass with no layer loop, such as the output head's."""
    seen: Counter = Counter()
    with _Watch(seen, [True]):
        yield seen
