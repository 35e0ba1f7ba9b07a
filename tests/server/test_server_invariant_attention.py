"""The batch-invariant attention computes attention, and its bits depend on nothing else.

`block_attention` against SDPA on the same inputs (float tolerance: another summation order),
for causal, sliding-window and grouped-query shapes; then the properties the engine relies on:
a query's output is the same bits whatever rows, queries, padding keys or trailing blocks come
with it, and a position-aligned cache returns what was written where it was written.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from server.engine.invariant_attention import (
    KEY_BLOCK,
    QUERY_CHUNK,
    DecodeLayout,
    PositionCache,
    block_attention,
    decode_attention,
    take_columns,
)


def _inputs(seed: int, rows: int, q_heads: int, kv_heads: int, length: int, dim: int = 32):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, q_heads, length, dim, generator=generator)
    k = torch.randn(rows, kv_heads, length, dim, generator=generator)
    v = torch.randn(rows, kv_heads, length, dim, generator=generator)
    return q, k, v


@pytest.mark.parametrize("window", [None, 7])
@pytest.mark.parametrize("q_heads, kv_heads", [(2, 1), (4, 2), (1, 1)])
def test_it_computes_causal_attention(window, q_heads, kv_heads):
    q, k, v = _inputs(0, 2, q_heads, kv_heads, 150)
    positions = torch.arange(150).expand(2, 150)
    got = block_attention(q, k, v, positions, window, 32**-0.5)
    i = torch.arange(150)
    allowed = i[None, :] <= i[:, None]
    if window:
        allowed &= i[:, None] - i[None, :] < window
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=32**-0.5,
                                          enable_gqa=kv_heads != q_heads)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_query_gets_the_same_bits_in_any_company():
    q, k, v = _inputs(1, 5, 2, 1, 200)
    positions = torch.arange(200).expand(5, 200)
    everything = block_attention(q, k, v, positions, None, 0.2)
    for t in (0, 3, 63, 64, 130, 199):
        # one query alone, in one row, with the cache longer than it (garbage past it)
        longer_k = torch.cat([k[2:3, :, : t + 1], torch.randn(1, 1, 300, 32)], 2)
        longer_v = torch.cat([v[2:3, :, : t + 1], torch.randn(1, 1, 300, 32)], 2)
        alone = block_attention(q[2:3, :, t : t + 1], longer_k, longer_v,
                                torch.tensor([[t]]), None, 0.2)
        assert torch.equal(alone[0, :, 0], everything[2, :, t]), t
    # a slice of the queries, and other rows around them
    part = block_attention(q[1:4, :, 40:90], k[1:4], v[1:4], positions[1:4, 40:90], None, 0.2)
    assert torch.equal(part, everything[1:4, :, 40:90])
    # query counts whose folded rows (2 heads per key head) end in a partial group of four
    for start, count in ((150, 45), (10, 7), (100, 3), (60, 5)):
        span = slice(start, start + count)
        part = block_attention(q[2:3, :, span], k[2:3], v[2:3], positions[2:3, span], None, 0.2)
        assert torch.equal(part[0], everything[2, :, span]), count


def test_a_position_cache_keeps_each_key_at_its_position():
    cache = PositionCache(layers=1, rows=2, kv_heads=1, capacity=70, dim=4,
                          dtype=torch.float32, device="cpu")
    assert cache.keys[0].shape[2] % KEY_BLOCK == 0 and cache.keys[0].shape[2] >= 70
    cache.write_positions = torch.arange(3).expand(2, 3)
    prefill = torch.arange(2 * 3 * 4, dtype=torch.float32).view(2, 1, 3, 4)
    keys, _ = cache.update(prefill, prefill, 0)
    assert torch.equal(keys[:, :, :3], prefill)
    cache.write_positions = torch.tensor([[3], [5]])  # rows at different positions
    step = torch.ones(2, 1, 1, 4)
    keys, _ = cache.update(step, -step, 0)
    assert torch.equal(keys[0, 0, 3], torch.ones(4)) and torch.equal(keys[1, 0, 5], torch.ones(4))
    assert torch.equal(keys[0, 0, 5], torch.zeros(4))
    cache.batch_select_indices(torch.tensor([1]))
    assert cache.keys[0].shape[0] == 1 and torch.equal(cache.values[0][0, 0, 5], -torch.ones(4))


@pytest.mark.parametrize("window", [None, 100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_long_prefill_in_query_chunks_gives_every_query_its_bits(window, dtype):
    """`decode_attention` takes a prefill `QUERY_CHUNK` queries at a time, each chunk reading
    only the key blocks up to its last position: every query gets the bits of one call over
    all queries and every key."""
    length = 2 * QUERY_CHUNK + 37
    q, k, v = (t.to(dtype) for t in _inputs(2, 2, 4, 2, length))
    positions = torch.arange(length).expand(2, length)
    everything = block_attention(q, k, v, positions, window, 0.2)
    chunked = decode_attention(q, k, v, DecodeLayout(positions, window), 0.2)
    assert torch.equal(chunked, everything.transpose(1, 2))


def test_a_prefill_of_some_rows_writes_those_rows_and_reads_only_them():
    cache = PositionCache(layers=2, rows=4, kv_heads=1, capacity=100, dim=4,
                          dtype=torch.float32, device="cpu")
    some = cache.rows([3, 1])
    some.write_positions = torch.arange(5).expand(2, 5)
    new = torch.randn(2, 1, 5, 4)
    keys, values = some.update(new, -new, 1)
    assert torch.equal(keys, new) and torch.equal(values, -new)
    assert torch.equal(cache.keys[1][3, :, :5], new[0]) and torch.equal(cache.keys[1][1, :, :5],
                                                                          new[1])
    assert torch.equal(cache.values[1][1, :, :5], -new[1])
    untouched = [cache.keys[1][0], cache.keys[1][2], cache.keys[0][3], cache.keys[1][3, :, 5:]]
    assert all(not t.any() for t in untouched)
    # rows continuing at different positions: each row's tokens go to its own columns
    more = cache.rows([1, 3])
    more.write_positions = torch.tensor([[5, 6], [9, 10]])
    step = torch.randn(2, 1, 2, 4)
    keys, _ = more.update(step, step, 1)
    assert keys.shape[2] == 11
    assert torch.equal(keys[0, :, 5:7], step[0]) and torch.equal(keys[1, :, 9:11], step[1])
    assert torch.equal(keys[0, :, :5], new[1]) and not keys[1, :, 5:9].any()


def test_reading_repeated_columns_gives_the_same_gradient_every_time():
    """Every continuation view reads its prompt's keys; the gradient of those repeats must be
    summed in one order (advanced indexing's backward used parallel atomic adds on CPU and gave
    a different gradient on each of 30 repeats on two threads)."""
    generator = torch.Generator().manual_seed(0)
    packed = torch.randn(4, 200, 256, generator=generator, requires_grad=True)
    rows = torch.tensor([1] * 16)
    columns = torch.arange(150).expand(16, 150)
    upstream = torch.randn(16, 150, 256, generator=generator)
    assert torch.equal(take_columns(packed, rows, columns), packed[rows[:, None], columns])
    gradients = []
    for _ in range(10):
        packed.grad = None
        take_columns(packed, rows, columns).backward(upstream)
        gradients.append(packed.grad.clone())
    assert all(torch.equal(g, gradients[0]) for g in gradients)


@pytest.mark.parametrize("count", [1, 3, 5])
def test_filler_rows_keep_gradients_finite_when_queries_start_past_a_sliding_window(count):
    """Two query heads per key head and an odd number of queries need filler rows; queries past
    the window leave the first key blocks out. A filler that saw no key put NaN into the keys'
    and values' gradients though its output is dropped."""
    q, k, v = _inputs(3, 2, 2, 1, 300)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    start = 200
    positions = torch.arange(start, start + count).expand(2, count)
    out = block_attention(q[:, :, start : start + count], k, v, positions, 7, 0.2)
    out.square().sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))
    # ... and the real rows are what they were in company without filler
    full = block_attention(q[:, :, : start + 8].detach(), k.detach(), v.detach(),
                           torch.arange(start + 8).expand(2, start + 8), 7, 0.2)
    assert torch.equal(out.detach(), full[:, :, start : start + count])
