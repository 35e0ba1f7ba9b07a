"""How many rows decode together: as many as the KV cache's bytes allow, not a fixed count.

A decode row holds its KV cache (2 x layers x kv_heads x head_dim x capacity values, in the
activation dtype) and a few vocabulary-wide fp32 rows (logits, probabilities, the draw). The
batch is as wide as `KV_SHARE` of the memory available now allows, between `MIN_DECODE_ROWS` and
`MAX_DECODE_ROWS`: on a GPU the free device memory with the allocator's unused cache, on Apple
silicon Metal's headroom bounded by what the host has available, on the CPU what the host has
available (`host_memory`).
"""

from __future__ import annotations

import torch

from server.engine.host_memory import available_bytes

MAX_DECODE_ROWS = 1024
"""Rows decoded together at most, whatever the memory: a request for more samples is decoded in
several batches."""
MIN_DECODE_ROWS = 8
"""Rows a decode batch may always have, however little memory is free."""
KV_SHARE = 0.25
"""Share of the available memory one decode batch may take."""
VOCAB_ROWS = 4
"""Vocabulary-wide fp32 rows a decode row needs at once (logits, a tempered copy, its
probabilities and the draw's scratch)."""


def row_bytes(config: object, capacity: int, dtype: torch.dtype, vocab: int) -> int:
    """Bytes one decode row needs: its KV cache over `capacity` positions and its vocabulary
    rows."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = torch.empty((), dtype=dtype).element_size()
    kv = 2 * config.num_hidden_layers * heads * head_dim * capacity * element
    return kv + VOCAB_ROWS * vocab * 4


def free_bytes(device: torch.device) -> int:
    """Memory a decode batch may draw on now, on `device`.

    On CUDA, what the driver has free plus what PyTorch's allocator holds cached but unused
    (its to reuse). On a Mac, the lesser of Metal's headroom (its recommended working set less
    what the MPS allocator has taken) and what the host has available now: the memory is
    unified, and JupyterLab, the browser and the notebook's kernel live in it too."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free) + max(0, int(cached))
    if device.type == "mps":
        return mps_free_bytes(torch.mps.recommended_max_memory(),
                              torch.mps.driver_allocated_memory(), available_bytes())
    return available_bytes()


def mps_free_bytes(recommended: int, allocated: int, host_available: int) -> int:
    """What a decode batch may draw on under Metal: its headroom, and no more than the host's."""
    return max(0, min(recommended - allocated, host_available))


def decode_rows(config: object, capacity: int, dtype: torch.dtype, vocab: int,
                device: torch.device, free: int | None = None) -> int:
    """The widest decode batch whose cache fits `KV_SHARE` of the free memory."""
    free = free_bytes(device) if free is None else free
    fits = int(KV_SHARE * free) // max(1, row_bytes(config, capacity, dtype, vocab))
    return max(MIN_DECODE_ROWS, min(MAX_DECODE_ROWS, fits))
