"""Attention over packed rows in chunks of queries: memory linear in the row's length.

A packed row (see `prefix_sharing`) holds a shared prompt and several continuations, each
attending to the prompt and to itself. A dense `[rows, width, width]` mask for that grows with
the square of the row (834 MiB more peak RSS for one 8192-token row, with its int64 position
distances), and SDPA falls back to its slow path once given one. Here the mask is built for
`QUERY_CHUNK` queries at a time from per-column segment ids and positions, and each chunk meets
only the key columns some of its queries may see (the prompt and the continuations the chunk
covers), so memory grows linearly with the row and the masked-out pairs between different
continuations are never computed.

The engine passes a `PackedLayout` per layer type as the model's `attention_mask` (or, when it
is batch-invariant, an `invariant_attention.InvariantLayout` or `DecodeLayout`); the model's own
attention function (SDPA or eager) still serves every other call, such as a fused decode step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch.nn.functional import scaled_dot_product_attention

from server.engine.invariant_attention import (
    DecodeLayout,
    InvariantLayout,
    decode_attention,
    views_attention,
)

QUERY_CHUNK = 256
"""Queries per attention call in a packed row: `[rows, heads, chunk, keys]` scores at a time."""
IMPLEMENTATION = "autoresearch_packed"


@dataclass(frozen=True)
class PackedLayout:
    """Where each packed column sits: which segment (0 = shared prefix, m + 1 = member m,
    -1 = padding) and which position, and the sliding window of this layer type (None: full)."""

    segments: torch.Tensor
    positions: torch.Tensor
    window: int | None
    _chunks: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def prepared(self, device: torch.device | str) -> PackedLayout:
        """This layout with every query chunk's keys and mask computed here (on the host,
        where the segments are) and moved to `device`: the layers then only read them, with
        no host synchronisation inside the model's layer loop."""
        width = self.segments.shape[1]
        ready = PackedLayout(self.segments.to(device), self.positions.to(device), self.window)
        for first in range(0, width, QUERY_CHUNK):
            stop = min(width, first + QUERY_CHUNK)
            keys, mask = self.chunk(first, stop)
            ready._chunks[(first, stop)] = (keys.to(device), mask.to(device))
        return ready

    def chunk(self, first: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The key columns and the mask of queries `first:stop`, computed once and reused by
        every layer of this type (all layers of a forward see the same layout)."""
        cached = self._chunks.get((first, stop))
        if cached is None:
            keys = self.needed_keys(first, stop)
            cached = self._chunks[(first, stop)] = (keys, self.allowed(first, stop, keys))
        return cached

    def allowed(self, first: int, stop: int, keys: torch.Tensor) -> torch.Tensor:
        """`[rows, 1, stop - first, len(keys)]` booleans: may query column i see key column j.

        A column sees earlier columns of its own segment and of the shared prefix; padding
        sees itself only, so no softmax row is empty.
        """
        seg_q = self.segments[:, first:stop, None]
        seg_k = self.segments[:, None, keys]
        query_cols = torch.arange(first, stop, device=keys.device)[:, None]
        mask = (keys[None, :] <= query_cols) & ((seg_k == 0) | (seg_k == seg_q)) & (seg_k >= 0)
        if self.window:
            distance = self.positions[:, first:stop, None] - self.positions[:, None, keys]
            mask &= distance < self.window
        padding = (seg_q < 0) & (keys[None, :] == query_cols)
        return (mask & (seg_q >= 0) | padding)[:, None]

    def needed_keys(self, first: int, stop: int) -> torch.Tensor:
        """Key columns any query of `first:stop` may see, in column order: the shared prefix,
        the chunk's own segments and its padding columns, never a later column."""
        seg_q = self.segments[:, first:stop]
        seg_k = self.segments[:, :stop]
        wanted = seg_k == 0
        for segment in torch.unique(seg_q[seg_q > 0]).tolist():
            wanted |= seg_k == segment
        wanted[:, first:stop] |= seg_q < 0
        return wanted.any(0).nonzero(as_tuple=True)[0]


def packed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layout: PackedLayout,
    scaling: float,
) -> torch.Tensor:
    """`[rows, q_heads, width, dim]` queries against `[rows, kv_heads, width, dim]` keys and
    values under `layout`; returns `[rows, width, q_heads, dim]` as the model's attention does."""
    width = query.shape[2]
    outputs = []
    for first in range(0, width, QUERY_CHUNK):
        stop = min(width, first + QUERY_CHUNK)
        keys, mask = layout.chunk(first, stop)
        grouped = key.shape[1] != query.shape[1]  # grouped-query attention: kv heads shared
        outputs.append(
            scaled_dot_product_attention(
                query[:, :, first:stop], key[:, :, keys], value[:, :, keys],
                attn_mask=mask, scale=scaling, enable_gqa=grouped,
            )
        )
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous()


def install(model: torch.nn.Module) -> bool:
    """Route the model's attention through `packed_attention` whenever it is given a
    `PackedLayout`, and through its own SDPA or eager attention otherwise. False (and nothing
    changed) when the model's attention is neither."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    config = model.config
    current = getattr(config, "_attn_implementation", None)
    if str(current).startswith(IMPLEMENTATION):
        return True
    if current not in ("sdpa", "eager"):
        return False
    fallback: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(current, None)
    if fallback is None:
        from transformers.models.gemma3.modeling_gemma3 import eager_attention_forward

        fallback = eager_attention_forward

    def attention(module, query, key, value, attention_mask, scaling=None, **kwargs):
        if isinstance(attention_mask, PackedLayout):
            scale = scaling if scaling is not None else module.head_dim**-0.5
            return packed_attention(query, key, value, attention_mask, scale), None
        if isinstance(attention_mask, InvariantLayout):
            scale = scaling if scaling is not None else module.head_dim**-0.5
            return views_attention(query, key, value, attention_mask, scale), None
        if isinstance(attention_mask, DecodeLayout):
            scale = scaling if scaling is not None else module.head_dim**-0.5
            return decode_attention(query, key, value, attention_mask, scale), None
        return fallback(module, query, key, value, attention_mask, scaling=scaling, **kwargs)

    name = f"{IMPLEMENTATION}_{current}"
    ALL_ATTENTION_FUNCTIONS.register(name, attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[current])
    for sub in model.modules():
        sub_config = getattr(sub, "config", None)
        if sub_config is not None and getattr(sub_config, "_attn_implementation", None) == current:
            sub_config._attn_implementation = name
    return True
