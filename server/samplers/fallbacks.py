"""Samples that vLLM cannot serve and the torch sampler serves instead: said and counted.

A fallback is never silent. The first time an adapter's samples go to the torch sampler, the
reason is logged (once per adapter, not once per request); every request that falls back is
counted by reason, for the `/metrics` counter `autoresearch_sampler_fallbacks_total`.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable

from server.engine.engine import SampleJob

log = logging.getLogger(__name__)

UNSERVABLE = "unservable_modules"
"""The adapter trains modules vLLM cannot apply for this model (for Gemma: `lm_head`)."""
UNAVAILABLE = "vllm_unavailable"
"""No usable vLLM server: every request goes to the torch sampler."""
REASONS = (UNSERVABLE, UNAVAILABLE)


class FallbackLog:
    """Logs each adapter's first fallback with its reason; counts every request that falls back.

    `count(reason, requests)` is the metrics hook (a Prometheus counter's `inc`). Adapters are
    remembered by identity in a bounded window, so a long-running sampler holds memory flat.
    """

    def __init__(self, count: Callable[[str, int], None] | None = None, remember: int = 4096):
        self._count = count
        self._remember = remember
        self._seen: collections.OrderedDict[int, None] = collections.OrderedDict()

    def unservable(self, jobs: Iterable[SampleJob], servable: Iterable[str]) -> None:
        jobs = list(jobs)
        servable = sorted(servable)
        for job in jobs:
            adapter = job.adapter
            if adapter is None or id(adapter) in self._seen:
                continue
            self._seen[id(adapter)] = None
            while len(self._seen) > self._remember:
                self._seen.popitem(last=False)
            extra = sorted({n.rsplit(".", 1)[-1] for n in adapter.a} - set(servable))
            log.warning(
                "sampling a rank-%d adapter on the torch sampler, not vLLM: it trains %s, which "
                "vLLM cannot serve for this model (it serves LoRA on %s); create the run with "
                "train_unembed=False to sample it on vLLM",
                adapter.spec.rank,
                extra,
                servable,
            )
        if jobs and self._count is not None:
            self._count(UNSERVABLE, len(jobs))

    def unavailable(self, reason: str) -> None:
        log.warning("vLLM sampling unavailable (%s); falling back to the torch sampler", reason)
        if self._count is not None:
            self._count(UNAVAILABLE, 1)
