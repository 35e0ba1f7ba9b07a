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
from server.engine.lora import AdapterWeights

log = logging.getLogger(__name__)

UNSERVABLE = "unservable_modules"
"""The adapter trains modules vLLM cannot apply for this model (for Gemma: `lm_head`)."""
RANK_OVER_LIMIT = "rank_over_limit"
"""The adapter's rank is above the `--max-lora-rank` vLLM was started with."""
UNAVAILABLE = "vllm_unavailable"
"""No usable vLLM server: every request goes to the torch sampler."""
REASONS = (UNSERVABLE, RANK_OVER_LIMIT, UNAVAILABLE)


def trained_modules(adapter: AdapterWeights) -> set[str]:
    """The last names of the modules an adapter trains (`q_proj`, `lm_head`)."""
    return {name.rsplit(".", 1)[-1] for name in adapter.a}


def unservable_reason(rank: int, modules: Iterable[str], servable: Iterable[str],
                      max_rank: int | None) -> str | None:
    """Why vLLM cannot sample an adapter of this rank training these modules (their last
    names: `q_proj`, `lm_head`), or None when it can."""
    if set(modules) - set(servable):
        return UNSERVABLE
    if max_rank is not None and rank > max_rank:
        return RANK_OVER_LIMIT
    return None


def explain(reason: str, rank: int, modules: Iterable[str], servable: Iterable[str],
            max_rank: int | None) -> str:
    """The sentence a log line gives for `reason`: what the run trains and what to change."""
    if reason == RANK_OVER_LIMIT:
        return (f"its rank {rank} is above the {max_rank} vLLM was started with "
                f"(--vllm-max-lora-rank); create the run with rank <= {max_rank}, or start the "
                f"server with a larger --vllm-max-lora-rank")
    extra = sorted(set(modules) - set(servable))
    return (f"it trains {extra}, which vLLM cannot serve for this model (it serves LoRA on "
            f"{sorted(servable)}); create the run with train_unembed=False to sample it on vLLM")


class FallbackLog:
    """Logs each adapter's first fallback with its reason; counts every request that falls back.

    `count(reason, requests)` is the metrics hook (a Prometheus counter's `inc`). Adapters are
    remembered by identity in a bounded window, so a long-running sampler holds memory flat.
    """

    def __init__(self, count: Callable[[str, int], None] | None = None, remember: int = 4096):
        self._count = count
        self._remember = remember
        self._seen: collections.OrderedDict[int, None] = collections.OrderedDict()

    def unservable(self, jobs: Iterable[SampleJob], servable: Iterable[str],
                   max_rank: int | None = None) -> None:
        """Jobs whose adapters vLLM cannot sample (`unservable_reason`), sent to the torch
        sampler: each adapter's reason logged once, every job counted by its reason."""
        counts: collections.Counter[str] = collections.Counter()
        for job in jobs:
            adapter = job.adapter
            if adapter is None:
                continue
            modules = trained_modules(adapter)
            reason = unservable_reason(adapter.spec.rank, modules, servable, max_rank)
            if reason is None:
                continue
            counts[reason] += 1
            if id(adapter) in self._seen:
                continue
            self._seen[id(adapter)] = None
            while len(self._seen) > self._remember:
                self._seen.popitem(last=False)
            log.warning("sampling a rank-%d adapter on the torch sampler, not vLLM: %s",
                        adapter.spec.rank,
                        explain(reason, adapter.spec.rank, modules, servable, max_rank))
        if self._count is not None:
            for reason, n in counts.items():
                self._count(reason, n)

    def unavailable(self, reason: str) -> None:
        log.warning("vLLM sampling unavailable (%s); falling back to the torch sampler", reason)
        if self._count is not None:
            self._count(UNAVAILABLE, 1)
