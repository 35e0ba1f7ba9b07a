"""The host-side token choice the engine used before `decoding`: kept as a switchable reference.

Each step copies the logits to the host, samples per job block with a `torch.Generator` per row
(one Python call per row), and matches stop strings by decoding each live row's recent tokens.
`Engine(device_sampling=False)` selects it, so a benchmark can put both side by side in one run.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from server.engine import fused_head


def row_generators(
    seeds: Sequence[int | None], counts: Sequence[int], firsts: Sequence[int] | None = None
) -> list[torch.Generator]:
    """One random stream per sampled row, from its job's seed (or a fresh one) and its index
    (counted from the job's `first` sample)."""
    generators = []
    for seed, count, first in zip(seeds, counts, firsts or [0] * len(counts)):
        base = int(torch.randint(0, 2**62, ())) if seed is None else int(seed)
        for k in range(first, first + count):
            generators.append(torch.Generator().manual_seed((base * 1_000_003 + k) % 2**63))
    return generators


def choose(
    blocks: list[tuple[float, int, float, int, int]],
    live: list[int],
    logits: torch.Tensor,
    generators: list[torch.Generator],
    done: list[bool],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each live row's token and logprob; `blocks` are `(temperature, top_k, top_p, first,
    stop)` runs of batch rows sharing one job's parameters."""
    chosen = torch.zeros(len(live), dtype=torch.long)
    chosen_lp = torch.zeros(len(live), dtype=torch.float32)
    for temperature, top_k, top_p, first, stop in blocks:
        block = logits[first:stop].float().cpu()
        if temperature == 0:
            logp = fused_head.log_softmax(block)
            picks = block.argmax(-1)
        else:
            scaled = block / temperature
            filtered = scaled
            if top_k and 0 < top_k < filtered.shape[-1]:
                kth = torch.topk(filtered, top_k, dim=-1).values[:, -1:]
                filtered = filtered.masked_fill(filtered < kth, -math.inf)
            if top_p < 1.0:
                sorted_logits, order = torch.sort(filtered, descending=True, dim=-1)
                probs = torch.softmax(sorted_logits, -1)
                drop = probs.cumsum(-1) - probs > top_p
                sorted_logits = sorted_logits.masked_fill(drop, -math.inf)
                filtered = torch.full_like(filtered, -math.inf).scatter(-1, order, sorted_logits)
            logp = fused_head.log_softmax(filtered)  # the distribution drawn from
            cdf = torch.softmax(filtered, -1).cumsum(-1)
            uniform = torch.tensor(
                [
                    0.5 if done[r] else float(torch.rand((), generator=generators[r]))
                    for r in live[first:stop]
                ],
                dtype=cdf.dtype,
            )
            picks = torch.searchsorted(cdf, (uniform * cdf[:, -1])[:, None], right=True)
            picks = picks[:, 0].clamp_(max=cdf.shape[-1] - 1)
        chosen[first:stop] = picks
        chosen_lp[first:stop] = torch.gather(logp, -1, picks[:, None])[:, 0]
    return chosen, chosen_lp


def text_stop_rule(strings: list[str], decode: Callable[[list[int]], str]):
    """Decode the row's last few tokens after every step and look for a stop string."""
    window = max(len(s) for s in strings) + 8

    def hit(tokens: list[int]) -> bool:
        tail = decode(tokens[-window:])
        return any(s in tail for s in strings)

    return hit
