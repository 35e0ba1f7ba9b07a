"""Under invariance a row's product has the same bits whatever rows come with it.

`invariance.linear` is what every base and LoRA layer of the engine multiplies through. Each
row of a batch is computed alone (one row, the decode step of a sequence whose batch-mates have
finished), in small batches, and inside a large batch, and compared with `torch.equal`: fp32
products run in fixed row tiles, and a half-precision product of one row is given a second row
(a single bf16 row takes a matrix-vector kernel that sums a long row in another order).
"""

from __future__ import annotations

import pytest
import torch

from server.engine import invariance


def _rows_alone_and_batched(dtype: torch.dtype, features: int, outputs: int, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    weight = (torch.randn(outputs, features, generator=generator) * 0.03).to(dtype)
    scales = torch.rand(48, 1, generator=generator) * 3
    rows = (torch.randn(48, features, generator=generator) * scales).to(dtype)
    filler = torch.randn(300, features, generator=generator).to(dtype)
    with invariance.row_invariant():
        big = invariance.linear(torch.cat([rows, filler]), weight, None)[: len(rows)]
        for count in (1, 2, 3, 17):
            for r in range(len(rows)):
                company = filler[: count - 1]
                got = invariance.linear(torch.cat([rows[r : r + 1], company]), weight, None)
                yield count, r, got[0], big[r]


@pytest.mark.parametrize("features, outputs", [(2048, 640), (640, 2048), (4096, 128)])
def test_a_half_precision_row_alone_gets_its_bits_in_a_batch(features, outputs):
    for count, r, alone, batched in _rows_alone_and_batched(torch.bfloat16, features, outputs):
        assert torch.equal(alone, batched), (count, r)


def test_an_fp32_row_gets_the_same_bits_in_any_company():
    for count, r, alone, batched in _rows_alone_and_batched(torch.float32, 640, 256):
        assert torch.equal(alone, batched), (count, r)


def test_outside_invariance_linear_is_plain_f_linear():
    x, weight = torch.randn(1, 64).bfloat16(), torch.randn(32, 64).bfloat16()
    assert torch.equal(invariance.linear(x, weight, None), torch.nn.functional.linear(x, weight))
