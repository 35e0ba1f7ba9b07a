"""How many tokens a training micro-batch holds on an accelerator: as many as the activations
it keeps for backward fit in a share of the free memory, not a fixed count.

A fixed 8,192 tokens suits one card and not another: Gemma 3 1B keeps tens of GiB for it,
more than an L4's 24, while an H200 sits mostly idle. So on CUDA and MPS the engine measures,
once, what its own training pass saves for backward per token (`saved_bytes_per_token`: two
probe passes of different lengths under `torch.autograd.graph.saved_tensors_hooks`, the
difference divided by the difference in tokens, so weights and other fixed costs drop out),
and sizes micro-batches to `TRAIN_SHARE` of the memory free at that moment (`kv_budget`'s
reading: the driver's free memory with the allocator's unused cache). The CPU keeps its fixed
size, which its bitwise references and benchmarks use.

The size is chosen once, at the first training request, and kept: a run's micro-batches, and so
its sums, do not change with what else holds memory later. Where the same bits run after run are
promised (`AUTORESEARCH_DETERMINISTIC=1`, or the invariant path forced on) the fixed size stays,
since free memory differs between starts. `AUTORESEARCH_TOKENS_PER_MICROBATCH` overrides all of
this.
"""

from __future__ import annotations

from collections.abc import Callable

TRAIN_SHARE = 0.5
"""Share of the free memory a micro-batch's saved activations may take; the rest is the
backward pass's transient gradients, the output head's blocks and the decode batches."""
MIN_TOKENS = 512
MAX_TOKENS = 65536
QUANTUM = 512
"""Sizes are multiples of this, so a small change in free memory seldom changes the size."""
PROBE_TOKENS = (128, 256)
"""The two probe lengths: short enough to cost nothing, far enough apart to measure a slope."""


def saved_bytes_per_token(saved_bytes: Callable[[int], int],
                          lengths: tuple[int, int] = PROBE_TOKENS) -> float:
    """What one more token costs in tensors saved for backward: `saved_bytes(n)` is what a
    training pass of `n` tokens saves (each storage counted once)."""
    short, long = lengths
    return max(1.0, (saved_bytes(long) - saved_bytes(short)) / (long - short))


def microbatch_tokens(per_token: float, free: int) -> int:
    """The largest multiple of `QUANTUM` whose saved activations fit `TRAIN_SHARE` of `free`
    bytes, within [MIN_TOKENS, MAX_TOKENS]."""
    fits = int(TRAIN_SHARE * free / max(1.0, per_token)) // QUANTUM * QUANTUM
    return max(MIN_TOKENS, min(MAX_TOKENS, fits))
