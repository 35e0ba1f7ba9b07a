"""How many rows decode together: as many as the KV cache's bytes allow, not a fixed count.

A decode row holds its KV cache (2 x layers x kv_heads x head_dim x capacity values, in the
activation dtype) and a few vocabulary-wide fp32 rows (logits, probabilities, the draw). The
batch is as wide as `KV_SHARE` of the memory available now allows, between `MIN_DECODE_ROWS` and
`MAX_DECODE_ROWS`: on a GPU that is the free device memory (`torch.cuda.mem_get_info`), on the
CPU and on Apple silicon's unified memory what the host has available (`host_memory`).
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
    """Memory a decode batch may draw on now, on `device`."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    return available_bytes()


def decode_rows(config: object, capacity: int, dtype: torch.dtype, vocab: int,
                device: torch.device, free: int | None = None) -> int:
    """The widest decode batch whose cache fits `KV_SHARE` of the free memory."""
    free = free_bytes(device) if free is None else free
    fits = int(KV_SHARE * free) // max(1, row_bytes(config, capacity, dtype, vocab))
    return max(MIN_DECODE_ROWS, min(MAX_DECODE_ROWS, fits))
