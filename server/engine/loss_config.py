"""Refusing loss-config keys that the chosen loss would ignore.

`loss_fn_config={"clip_hi": 1.3}` (a typo) would otherwise train with the default threshold.
Instead of keeping a second list of each loss's keys, which would drift from the losses
themselves, the loss is evaluated once on a one-token dummy while the config records which keys
it reads; any key it never read is refused by name. Values must be numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from server.engine import losses
from server.engine.losses import LossError


class _ReadRecorder(dict):
    """A config dict that remembers which keys were looked up."""

    def __init__(self, values: Mapping[str, Any]):
        super().__init__(values)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key) -> bool:
        self.read.add(key)
        return super().__contains__(key)


def check_loss_config(loss_fn: str, config: Mapping[str, Any] | None) -> None:
    """Raise `LossError` naming the first unknown or ill-typed key of `config` for `loss_fn`."""
    loss = losses.resolve(loss_fn)
    if not config:
        config = {}
    if not isinstance(config, Mapping):
        raise LossError(f"loss_fn_config must be an object, got {config!r}")
    for key, value in config.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise LossError(f"loss_fn_config[{key!r}] must be a number, got {value!r}")
    recorder = _ReadRecorder(config)
    names = [n for n in losses.REQUIRED_INPUTS.get(loss_fn, ()) if n != "target_tokens"]
    inputs = {name: torch.zeros(1, 1) for name in names}
    loss(torch.zeros(1, 1), inputs, recorder)
    unknown = sorted(set(config) - recorder.read)
    if unknown:
        known = sorted(recorder.read)
        raise LossError(
            f"loss_fn_config key {unknown[0]!r} is not used by loss {loss_fn!r}"
            + (f"; it reads {known}" if known else "; it takes no config")
        )
