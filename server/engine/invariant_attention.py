"""One attention for decoding, prefilling and training, whose bits depend on nothing but the
query's own keys: the same token gets the same numbers alone, fused, sampled or trained.

Library attention (SDPA) reduces a query's keys in an order set by the call's shapes: how many
keys the row has in all, where masked padding sits, how many rows and queries come together. A
sampler decoding one token against its cache and a trainer running the whole sequence so get
different bits for the same token, and a row decoded beside others gets other bits than alone.

Here every key sits at the column of its position (0, 1, ...; a row's keys never move), keys
are taken in fixed blocks of `KEY_BLOCK` columns, and each reduction has a fixed shape:

- scores: `[queries, dim] @ [dim, keys]`, each a sum over the head dim only (its per-row and
  per-column results do not depend on the query or key count on MKL from 4 rows on, measured);
- the softmax's max over all visible keys (exact in any order);
- per block, the sum of `exp(score - max)` over its `KEY_BLOCK` columns and the values as
  `[queries, KEY_BLOCK] @ [KEY_BLOCK, dim]`: reductions of one fixed length;
- the blocks' partial sums added one after another, block 0 first.

A masked key adds an exact 0 and a block with no visible key adds 0 to every sum, so a query
that meets more padding, more trailing blocks or a longer cache computes exactly the same.
Queries are folded by key head (grouped-query attention) and padded to a multiple of `ROW_GROUP`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from server.engine.invariance import checkpoint

KEY_BLOCK = 64
"""Key columns per block: every block's reductions have this fixed length."""
QUERY_CHUNK = 256
"""Query positions per call while training: `[rows, heads, chunk, keys]` scores at a time."""
ROW_GROUP = 4
"""Folded query rows per matmul come in whole groups of this many (zero rows added): MKL's fp32
matmul computes rows four at a time, and the rows of a last, partial group (any row of a 1- to
3-row product, the fifth of five) take another kernel and other bits (measured row by row on
4096-row batches); rows in whole groups come out as in a product of any size."""
CHECKPOINT_SCORES = 1 << 23
"""A training chunk whose scores exceed this many values is recomputed in backward rather than
kept (a long prompt); smaller ones keep theirs, which is faster."""


def block_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    positions: torch.Tensor,
    window: int | None,
    scaling: float,
) -> torch.Tensor:
    """`[B, q_heads, Q, dim]` queries at `[B, Q]` positions against position-aligned
    `[B, kv_heads, T, dim]` keys and values (column c holds position c; columns past a query's
    position are never read). Returns `[B, q_heads, Q, dim]`."""
    out_dtype = query.dtype
    # One place where dtypes meet: a wholly-bf16 model (CUDA, MPS) brings bf16 queries, keys
    # and values; scores, the softmax and every block sum are computed in fp32 from all three,
    # so the sampler's cached keys and the trainer's fresh ones give the same numbers.
    # Keys and values are cast after they are cut to the blocks a query can see (exact either
    # way); the sampler's `PositionCache` keeps them in fp32 already.
    query = query.float()
    batch, q_heads, count, dim = query.shape
    kv_heads = key.shape[1]
    group = q_heads // kv_heads
    # Fold: kv head h serves query heads h*group .. h*group+group-1 (as `repeat_kv` does).
    rows = group * count
    folded = query.reshape(batch, kv_heads, rows, dim)
    pos = positions[:, None, :].expand(batch, group, count).reshape(batch, 1, rows)
    padded = -(-rows // ROW_GROUP) * ROW_GROUP
    last = int(positions.max()) + 1
    if padded > rows:
        # Filler rows sit at their row's last query position, so they see keys like a real
        # query: a filler that saw none would get a softmax of 0/0, and its NaN, though the row
        # is dropped, would reach the keys' and values' gradients in backward (a chunk that
        # starts past a sliding window). Rows are independent: the real rows' bits are the same.
        own_last = positions.amax(dim=1).view(batch, 1, 1).expand(batch, 1, padded - rows)
        folded = torch.cat([folded, folded.new_zeros(batch, kv_heads, padded - rows, dim)], 2)
        pos = torch.cat([pos, own_last], 2)
    first = 0 if window is None else max(0, int(positions.min()) - window + 1)
    lo, hi = (first // KEY_BLOCK) * KEY_BLOCK, -(-last // KEY_BLOCK) * KEY_BLOCK
    if key.shape[2] < hi:  # keys end inside the last block: pad it (never visible)
        extra = hi - key.shape[2]
        key = torch.nn.functional.pad(key, (0, 0, 0, extra))
        value = torch.nn.functional.pad(value, (0, 0, 0, extra))
    keys, values = key[:, :, lo:hi].float(), value[:, :, lo:hi].float()
    # One matmul over the head dim for all blocks (each score's sum has the same length).
    scores = torch.matmul(folded, keys.transpose(-1, -2)) * scaling  # [B, kvh, M, T]
    columns = torch.arange(lo, hi, device=key.device)
    qpos = pos.unsqueeze(-1)  # [B, 1, M, 1]
    visible = columns <= qpos
    if window is not None:
        visible = visible & (qpos - columns < window)
    scores = scores.masked_fill(~visible, float("-inf"))
    # Every query sees at least its own key. The shift cancels in the softmax, so it carries no
    # gradient: detached, backward skips the max's pass.
    top = scores.detach().amax(dim=-1, keepdim=True)
    weights = torch.exp(scores - top)
    # Every block's sums and values product at once (one batched product over the blocks),
    # then the blocks' partial sums added one after another, block 0 first.
    blocks = (hi - lo) // KEY_BLOCK
    by_block = weights.view(*weights.shape[:3], blocks, KEY_BLOCK)  # [B, kvh, M, n, KB]
    part_sums = by_block.sum(-1)  # [B, kvh, M, n]
    part_outs = torch.matmul(  # [B, kvh, n, M, D]
        by_block.transpose(2, 3), values.reshape(batch, kv_heads, blocks, KEY_BLOCK, dim))
    # `unbind`: backward stacks the blocks' gradients once (indexing each block would build a
    # zero-filled gradient of all blocks per block).
    sums, outs = part_sums.unbind(-1), part_outs.unbind(2)
    total, out = sums[0], outs[0]
    for b in range(1, blocks):
        total = total + sums[b]
        out = out + outs[b]
    out = out / total.unsqueeze(-1)
    return out[:, :, :rows].reshape(batch, q_heads, count, dim).to(out_dtype)


# ------------------------------------------------------------------ training views
@dataclass(frozen=True)
class Views:
    """A packed micro-batch as position-aligned views: one per (row, segment). A shared
    prompt's view is its own queries against itself; a continuation's view is its own queries
    against the prompt and itself, gathered into position order (column c = position c)."""

    row: torch.Tensor  # [V]
    query_columns: torch.Tensor  # [V, Q]
    query_positions: torch.Tensor  # [V, Q]
    query_real: torch.Tensor  # [V, Q] bool
    key_columns: torch.Tensor  # [V, K]

    def moved(self, first: int, width: int) -> Views:
        """These views once their `[rows, width]` batch is laid out as a column of tokens
        starting at token `first`: row r becomes the token where it starts, and a column is
        then an offset from it."""
        return replace(self, row=first + self.row * width)


def plan_views(segments: torch.Tensor, positions: torch.Tensor) -> tuple[Views, ...]:
    """The views of packed rows from their per-column segments (-1 padding) and positions, in
    two batches of like shapes: the shared prompts, and the continuations (each padded only to
    the longest of its own kind)."""
    prompts: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    continuations: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    for r in range(segments.shape[0]):
        seg = segments[r]
        prompt = (seg == 0).nonzero(as_tuple=True)[0]
        if len(prompt):
            prompts.append((r, prompt, prompt))
        for s in torch.unique(seg[seg > 0]).tolist():
            own = (seg == s).nonzero(as_tuple=True)[0]
            continuations.append((r, own, torch.cat([prompt, own])))
    return tuple(_batch(views, positions) for views in (prompts, continuations) if views)


def _batch(views: list[tuple[int, torch.Tensor, torch.Tensor]], positions: torch.Tensor) -> Views:
    width_q = max(len(q) for _, q, _ in views)
    width_k = max(len(k) for _, _, k in views)
    count = len(views)
    query_columns = torch.zeros((count, width_q), dtype=torch.long)
    query_positions = torch.zeros((count, width_q), dtype=torch.long)
    query_real = torch.zeros((count, width_q), dtype=torch.bool)
    key_columns = torch.zeros((count, width_k), dtype=torch.long)
    for v, (r, q, k) in enumerate(views):
        query_columns[v, : len(q)] = q
        query_columns[v, len(q) :] = q[0]
        query_positions[v, : len(q)] = positions[r, q]
        query_real[v, : len(q)] = True
        key_columns[v, : len(k)] = k
        # Keys past a view's own are never visible (they sit after every query's position).
        key_columns[v, len(k) :] = k[-1]
    rows = torch.tensor([r for r, _, _ in views])
    return Views(rows, query_columns, query_positions, query_real, key_columns)


@dataclass(frozen=True)
class InvariantLayout:
    """The `attention_mask` of an invariant training forward (one per layer type)."""

    views: tuple[Views, ...]
    window: int | None


def views_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layout: InvariantLayout,
    scaling: float,
) -> torch.Tensor:
    """`[rows, q_heads, width, dim]` packed queries under `layout`; returns `[rows, width,
    q_heads, dim]` (padding columns get zeros). A chunk of many scores is checkpointed: backward
    recomputes them instead of keeping them."""
    dev = query.device
    rows_all, q_heads, width_all, dim = query.shape
    # Token-major copies made once per layer; every view and chunk gathers from them.
    flat_q, flat_k, flat_v = (t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3])
                              for t in (query, key, value))
    where, parts = [], []
    for views in layout.views:
        row = views.row.to(dev)
        key_columns = views.key_columns.to(dev)
        keys = take_tokens(flat_k, row * width_all, key_columns).transpose(1, 2)
        values = take_tokens(flat_v, row * width_all, key_columns).transpose(1, 2)
        width = views.query_columns.shape[1]
        # The view's queries gathered once, then cut into chunks with one `split` (whose
        # backward joins the chunks' gradients in one tensor).
        all_queries = take_tokens(flat_q, row * width_all, views.query_columns.to(dev))
        chunks = all_queries.split(QUERY_CHUNK, dim=1)
        for first, chunk in zip(range(0, width, QUERY_CHUNK), chunks, strict=True):
            cols = views.query_columns[:, first : first + QUERY_CHUNK].to(dev)
            pos = views.query_positions[:, first : first + QUERY_CHUNK].to(dev)
            real = views.query_real[:, first : first + QUERY_CHUNK].to(dev)
            q = chunk.transpose(1, 2)  # [V, qh, chunk, D]
            scores = q.shape[0] * q.shape[1] * q.shape[2] * keys.shape[2]
            if torch.is_grad_enabled() and scores > CHECKPOINT_SCORES:
                attended = checkpoint(block_attention, q, keys, values, pos, layout.window,
                                      scaling)
            else:
                attended = block_attention(q, keys, values, pos, layout.window, scaling)
            v_idx, c_idx = real.nonzero(as_tuple=True)
            where.append(row[v_idx] * width_all + cols[v_idx, c_idx])
            parts.append(attended.transpose(1, 2)[v_idx, c_idx])
    out = query.new_zeros((rows_all * width_all, q_heads, dim))
    return out.index_put((torch.cat(where),), torch.cat(parts)).view(
        rows_all, width_all, q_heads, dim)


def take_tokens(flat: torch.Tensor, starts: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """`flat[starts[:, None] + columns]` for token-major `[tokens, ...]`, as one `index_select`:
    `[views, columns, ...]`.

    Views of one prompt's continuations all read its keys, so the same token is taken many
    times. Advanced indexing's backward adds such repeats with parallel atomic adds on CPU, in
    whatever order the threads meet (measured: 30 repeats of one backward, 30 different
    gradients); `index_select`'s backward adds them in index order.
    """
    index = (starts[:, None] + columns).reshape(-1)
    return flat.index_select(0, index).view(*columns.shape, *flat.shape[1:])


def take_columns(packed: torch.Tensor, rows: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """`packed[rows[:, None], columns]` for `[rows, width, ...]` (`take_tokens` of its rows laid
    end to end): repeats added in index order in backward."""
    width = packed.shape[1]
    flat = packed.reshape(packed.shape[0] * width, *packed.shape[2:])
    return take_tokens(flat, rows * width, columns)


# ------------------------------------------------------------------ decoding
CACHE_DTYPE = torch.float32
"""The dtype `PositionCache` keeps keys and values in."""


@dataclass(frozen=True)
class DecodeLayout:
    """The `attention_mask` of an invariant prefill or decode step: each row's query
    positions; its keys are in a `PositionCache` at their positions."""

    positions: torch.Tensor  # [rows, queries]
    window: int | None


class PositionCache:
    """A KV cache that keeps each key at its position's column, `[rows, kv_heads, capacity,
    dim]` per layer, so a row's keys never move when others join, leave or are padded. It holds
    them in `CACHE_DTYPE` (fp32: the attention computes in fp32, and a half-precision cache
    would be cast whole at every decode step; the cast is exact, so the bits are the same).

    The model calls `update` once per layer; `write_positions` says where the new tokens go:
    a prefill writes positions `0..L-1` of its one row, a decode step one position per row.
    """

    def __init__(self, layers: int, rows: int, kv_heads: int, capacity: int, dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        capacity = -(-capacity // KEY_BLOCK) * KEY_BLOCK
        shape = (rows, kv_heads, capacity, dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.write_positions: torch.Tensor | None = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        where = self.write_positions
        assert where is not None
        if key_states.shape[2] == 1:  # one new token per row, each at its own position
            rows = torch.arange(keys.shape[0], device=keys.device)
            keys[rows, :, where[:, 0]] = key_states[:, :, 0].to(keys.dtype)
            values[rows, :, where[:, 0]] = value_states[:, :, 0].to(values.dtype)
        else:  # a prefill: the same positions for every row
            first, stop = int(where[0, 0]), int(where[0, -1]) + 1
            keys[:, :, first:stop] = key_states.to(keys.dtype)
            values[:, :, first:stop] = value_states.to(values.dtype)
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.write_positions is None else int(self.write_positions.max()) + 1

    def copy_rows(self, source: PositionCache, rows: slice) -> None:
        """Fill `rows` from a one-row cache (a request's prefill, repeated for its samples)."""
        for mine, theirs in zip(self.keys + self.values, source.keys + source.values):
            mine[rows] = theirs[0]

    def batch_select_indices(self, index: torch.Tensor) -> None:
        """Keep the rows `index` names, in its order. Dropping finished rows (an increasing
        index) moves the kept rows down in place, so the cache never holds two copies; any
        other selection (a request's prefill repeated for its samples) gathers anew."""
        order = index.tolist()
        if all(a < b for a, b in zip(order, order[1:])) and len(order) <= self.keys[0].shape[0]:
            for tensor in self.keys + self.values:
                for to, taken in enumerate(order):
                    if to != taken:
                        tensor[to].copy_(tensor[taken])
            self.keys = [k[: len(order)] for k in self.keys]
            self.values = [v[: len(order)] for v in self.values]
            return
        self.keys = [k[index] for k in self.keys]
        self.values = [v[index] for v in self.values]

    def rows(self, index: list[int]) -> PositionCache:
        """A cache over some of these rows (in `index`'s order) for a prefill of those rows
        alone, each row's tokens at its own positions: it writes into this cache and reads
        back only its own rows, up to the last position written."""
        return _CacheRows(self, index)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)


class _CacheRows(PositionCache):
    """Some rows of a `PositionCache`, prefilled on their own (`PositionCache.rows`)."""

    def __init__(self, parent: PositionCache, index: list[int]):  # noqa: D107 - no new state
        self.index = torch.tensor(index, device=parent.keys[0].device)
        self.keys, self.values = parent.keys, parent.values
        self.write_positions = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        # Each row's tokens at its own positions (`write_positions`, `[rows, width]`): rows
        # may start at different positions (prompts continuing different shared prefixes).
        where = self.write_positions
        assert where is not None
        stop = int(where.max()) + 1
        out = []
        for stored, new in ((self.keys[layer_idx], key_states),
                            (self.values[layer_idx], value_states)):
            stored[self.index[:, None], :, where] = new.transpose(1, 2).to(stored.dtype)
            out.append(stored[self.index, :, :stop])
        return out[0], out[1]


def decode_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, layout: DecodeLayout,
    scaling: float,
) -> torch.Tensor:
    """Prefill or decode queries against a `PositionCache`'s keys; `[rows, q, q_heads, dim]`.

    A prefill's queries go `QUERY_CHUNK` positions at a time, as training takes them: each
    chunk reads only the key blocks up to its last position, so a prompt's attention costs
    about half the square, and the blocks a chunk skips would have added exact zeros."""
    positions = layout.positions.to(query.device)
    count = query.shape[2]
    if count <= QUERY_CHUNK:
        out = block_attention(query, key, value, positions, layout.window, scaling)
    else:
        out = torch.cat([
            block_attention(query[:, :, first : first + QUERY_CHUNK], key, value,
                            positions[:, first : first + QUERY_CHUNK], layout.window, scaling)
            for first in range(0, count, QUERY_CHUNK)], dim=2)
    return out.transpose(1, 2).contiguous()
