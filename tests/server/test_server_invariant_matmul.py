"""Under invariance a row's product has the same bits whatever rows come with it.

`invariance.linear` is what every base and LoRA layer of the engine multiplies through. A
kernel that handles some row counts differently shows only on the outputs whose exact value
lies near a rounding boundary, so each check multiplies thousands of rows: once as one product,
then in products of 1, 2, 3 and 5 rows (a sequence decoding on alone after its batch-mates
finished, a few requests), and compares every output with `torch.equal`. Without the padding
of small bf16 products, one- and two-row products differed on this CPU in a few outputs per
hundred thousand.
"""

from __future__ import annotations

import pytest
import torch

from server.engine import invariance

CHUNK_ROWS = (1, 2, 3, 5)


def _in_chunks(x: torch.Tensor, weight: torch.Tensor, rows: int) -> torch.Tensor:
    usable = len(x) // rows * rows
    return torch.cat([invariance.linear(x[i : i + rows], weight, None)
                      for i in range(0, usable, rows)])


def _check_every_row(dtype: torch.dtype, features: int, outputs: int, count: int) -> None:
    generator = torch.Generator().manual_seed(features * 7 + outputs)
    weight = (torch.randn(outputs, features, generator=generator) * 0.2).to(dtype)
    x = torch.randn(count, features, generator=generator).to(dtype)
    with invariance.row_invariant():
        whole = invariance.linear(x, weight, None)
        for rows in CHUNK_ROWS:
            chunked = _in_chunks(x, weight, rows)
            differing = int((chunked != whole[: len(chunked)]).sum())
            assert differing == 0, f"{differing} outputs differ in {rows}-row products"


@pytest.mark.parametrize(
    "features, outputs, count",
    # the test model's narrow projections, then Gemma 3 270M's MLP down-projection
    [(64, 32, 6144), (32, 64, 6144), (2048, 640, 1024)],
)
def test_a_half_precision_row_gets_the_same_bits_in_any_row_count(features, outputs, count):
    _check_every_row(torch.bfloat16, features, outputs, count)


def test_an_fp32_row_gets_the_same_bits_in_any_row_count():
    _check_every_row(torch.float32, 64, 32, 2048)


def test_outside_invariance_linear_is_plain_f_linear():
    x, weight = torch.randn(1, 64).bfloat16(), torch.randn(32, 64).bfloat16()
    assert torch.equal(invariance.linear(x, weight, None), torch.nn.functional.linear(x, weight))
