"""Under invariance a row's product has the same bits whatever rows come with it.

`invariance.linear` is what every base and LoRA layer of the engine multiplies through. A
kernel that handles some row counts differently shows only on the outputs whose exact value
lies near a rounding boundary, so each check multiplies thousands of rows: once as one product,
then in products of 1, 2, 3 and 5 rows (a sequence decoding on alone after its batch-mates
finished, a few requests), and compares every output with `torch.equal`. Without the padding
of small bf16 products, one- and two-row products differed on a Zen 4 in a few outputs per
hundred thousand; on an Intel Xeon without bf16 instructions five-row products differed too,
and there half products are tiled (`half_rows_are_invariant`).
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch.utils.checkpoint

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


@pytest.mark.parametrize("rows", [1, 17, 512, 530, 2048])
def test_a_tiled_fp32_product_has_the_bits_of_one_gemm_per_tile(rows):
    """Whichever path the probe chose, every row has the bits of its own `[ROW_TILE, K]`
    product: the padded GEMMs change the speed, not the numbers."""
    generator = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 640, generator=generator)
    weight_t = torch.randn(640, 2048, generator=generator) * 0.05
    tiles = -(-rows // invariance.ROW_TILE)
    padded = torch.zeros(tiles * invariance.ROW_TILE, 640)
    padded[:rows] = x
    per_tile = invariance._per_tile(padded, weight_t)[:rows]
    assert torch.equal(invariance.tiled_matmul(x, weight_t), per_tile)


def test_where_the_probe_finds_a_row_order_that_depends_on_its_neighbours_each_tile_is_alone(
    monkeypatch,
):
    """A BLAS whose padded GEMM changes a row's bits gets one GEMM per tile, and the gradient
    still reaches the weight through every tile."""
    calls = []
    monkeypatch.setattr(invariance, "padded_gemm_is_tiled", lambda *key: calls.append(key) or False)
    real_bmm = torch.bmm
    bmm_calls = []
    monkeypatch.setattr(torch, "bmm", lambda *a: bmm_calls.append(1) or real_bmm(*a))
    x = torch.randn(40, 32)
    weight_t = torch.randn(32, 24, requires_grad=True)
    out = invariance.tiled_matmul(x, weight_t)
    out.sum().backward()
    assert calls == [(32, 24, torch.float32, x.device, torch.get_num_threads())]
    assert bmm_calls, "the per-tile products must run"
    assert torch.allclose(out, x @ weight_t.detach(), atol=1e-5)
    assert torch.allclose(weight_t.grad, x.sum(0)[:, None].expand(32, 24), atol=1e-4)


def test_the_probe_is_measured_once_per_shape_dtype_device_and_thread_count():
    """Its products cost seconds for the output head's shape, so each key is probed once."""
    invariance.padded_gemm_is_tiled.cache_clear()
    key = (64, 48, torch.float32, torch.device("cpu"), torch.get_num_threads())
    first = invariance.padded_gemm_is_tiled(*key)
    assert invariance.padded_gemm_is_tiled(*key) is first
    invariance.padded_gemm_is_tiled(64, 48, torch.float32, torch.device("cpu"), 1)
    info = invariance.padded_gemm_is_tiled.cache_info()
    assert (info.hits, info.misses) == (1, 2)


def test_where_half_products_depend_on_their_row_count_they_are_tiled_as_fp32_ones(monkeypatch):
    """A machine whose half GEMM gives a row other bits in another row count (the probe says
    so) multiplies half products in padded row tiles: every row then has its tile's bits."""
    calls = []
    monkeypatch.setattr(invariance, "half_rows_are_invariant",
                        lambda *key: calls.append(key) or False)
    x, weight = torch.randn(21, 64).bfloat16(), torch.randn(32, 64).bfloat16()
    with invariance.row_invariant():
        out = invariance.linear(x, weight, None)
    assert calls == [(64, 32, torch.bfloat16, x.device, torch.get_num_threads(), False)]
    assert torch.equal(out, invariance.tiled_matmul(x, weight.T))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_frozen_layers_input_gradient_does_not_depend_on_the_rows_beside_it(dtype):
    """Runs share a layer's product in training: the gradient of each row's input is the one
    it has in a product of other rows (a run's micro-batch alone, or fused with others')."""
    generator = torch.Generator().manual_seed(3)
    weight = (torch.randn(96, 80, generator=generator) * 0.2).to(dtype)
    x = torch.randn(700, 80, generator=generator).to(dtype)
    upstream = torch.randn(700, 96, generator=generator).to(dtype)

    def input_grad(rows: slice) -> torch.Tensor:
        leaf = x[rows].clone().requires_grad_(True)
        with invariance.row_invariant():
            invariance.linear(leaf, weight, None).backward(upstream[rows])
        return leaf.grad

    whole = input_grad(slice(0, 700))
    for rows in (slice(0, 5), slice(5, 43), slice(43, 600), slice(600, 700)):
        assert torch.equal(input_grad(rows), whole[rows])


def test_a_frozen_layers_backward_follows_the_probe_of_its_own_layout(monkeypatch):
    """The backward product (`grad @ weight`) is probed in its transposed layout and, where
    that probe finds half rows depend on their count, tiled like the forward."""
    calls = []
    monkeypatch.setattr(invariance, "half_rows_are_invariant",
                        lambda *key: calls.append(key) or not key[-1])
    x = torch.randn(21, 64).bfloat16().requires_grad_(True)
    weight = torch.randn(32, 64).bfloat16()
    upstream = torch.randn(21, 32).bfloat16()
    with invariance.row_invariant():
        invariance.linear(x, weight, None).backward(upstream)
    threads = torch.get_num_threads()
    assert calls == [(64, 32, torch.bfloat16, x.device, threads, False),
                     (32, 64, torch.bfloat16, x.device, threads, True)]
    assert torch.equal(x.grad, invariance.tiled_matmul(upstream, weight))


def test_the_half_probe_is_measured_once_per_shape_dtype_device_and_thread_count():
    invariance.half_rows_are_invariant.cache_clear()
    key = (32, 64, torch.bfloat16, torch.device("cpu"), torch.get_num_threads())
    first = invariance.half_rows_are_invariant(*key)
    assert invariance.half_rows_are_invariant(*key) is first
    info = invariance.half_rows_are_invariant.cache_info()
    assert (info.hits, info.misses) == (1, 1)


def _backward_in_a_new_thread(output: torch.Tensor) -> None:
    """Backward as CUDA and MPS run it: in a thread that did not set the forward's context
    variables (a new Python thread starts with none)."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            output.sum().backward()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test's thread
            failure.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


def test_a_checkpointed_product_recomputes_under_the_forward_rule_in_another_thread():
    weight = torch.randn(24, 8)
    rules: list[bool] = []

    def product(a: torch.Tensor) -> torch.Tensor:
        rules.append(invariance.rows_are_invariant())  # at the forward, then the recomputation
        return invariance.linear(a, weight, None)

    x = torch.randn(5, 8, requires_grad=True)  # 5 rows: tiled, the product pads to 16
    with invariance.row_invariant():
        out = invariance.checkpoint(product, x)
    _backward_in_a_new_thread(out)
    assert rules == [True, True]
    assert torch.allclose(x.grad, weight.sum(0).expand(5, 8), atol=1e-5)
    # torch's own checkpoint recomputes without the rule there (on an H200 the head's chunks
    # were then recomputed untiled, and the checkpoint refused their other shapes)
    rules.clear()
    with invariance.row_invariant():
        plain = torch.utils.checkpoint.checkpoint(product, x, use_reentrant=False)
    with pytest.raises(torch.utils.checkpoint.CheckpointError):
        _backward_in_a_new_thread(plain)
    assert rules == [True, False]
