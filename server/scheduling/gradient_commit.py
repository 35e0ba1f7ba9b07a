"""All-or-nothing gradient accumulation for one forward_backward call over several runs.

The engine back-propagates micro-batch by micro-batch, so a failure in a later micro-batch
(out of memory, a loss error) would leave the earlier ones' gradients accumulated. A client
that retries, or the scheduler retrying a failed fused batch run by run, would then add them
twice. So each call accumulates into fresh gradients: the runs' existing gradients are set
aside before the call, added back when it succeeds, and put back untouched when it fails.
Nothing is copied; the cost is one addition per tensor on success.

On success a run's gradient is `before + (micro-batch 1 + micro-batch 2 + ...)` rather than
`((before + micro-batch 1) + micro-batch 2) + ...`: the same sum in another order, so it can
differ from in-place accumulation in the last bits of float32.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch


def _unique_parameters(adapters: Iterable[object]) -> list[torch.Tensor]:
    seen: dict[int, torch.Tensor] = {}
    for adapter in adapters:
        for tensor in adapter.parameters():
            seen.setdefault(id(tensor), tensor)
    return list(seen.values())


@contextlib.contextmanager
def all_or_nothing(adapters: Iterable[object]) -> Iterator[None]:
    """Gradients of `adapters` change only if the body completes without raising."""
    params = _unique_parameters(adapters)
    before = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        yield
    except BaseException:
        for p, grad in zip(params, before):
            p.grad = grad
        raise
    with torch.no_grad():
        for p, grad in zip(params, before):
            if grad is None:
                continue
            if p.grad is None:
                p.grad = grad
            else:
                p.grad = grad.add_(p.grad)
