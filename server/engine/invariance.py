"""Batch invariance, the matmul part: a row's product does not depend on the rows beside it.

Fusing requests into one batch changes the shapes the kernels see. On this engine's CPU
kernels (MKL and oneDNN under torch), an fp32 matmul computes rows four at a time, and a row in
the last, partial group of a row count takes another kernel and other bits. A bf16 matmul
through oneDNN computes one row (for narrow outputs, two) in a matrix-vector order: with the
MLP's 2048-wide `down_proj` a few outputs in ten thousand differ by one bf16 step, so a sequence
decoded on alone after its batch-mates finished drifted from the trainer. Under invariance every
fp32 product of the LoRA layers (and of an fp32 base model) gives each row the bits of its own
`[ROW_TILE, K]` product whatever the batch: rows are padded to whole tiles and multiplied in
GEMMs of up to `GEMM_TILES` tiles where a probe of this machine's GEMM at that shape finds it
gives every row those bits, else one GEMM per tile. A half-precision product of fewer than
`MIN_HALF_ROWS` rows gets zero rows beside it, where a probe finds that this machine's half GEMM
gives a row of any larger count its bits; where it does not (an Intel Xeon with AVX-512 and no
bf16 instructions: 5-row products differed from a 6144-row one), half products are tiled as fp32
ones are. Attention has its own
module (`invariant_attention`); the engine's other rule (each training job on its own
micro-batches) lives in `Training.forward_backward`.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

ROW_TILE = 16
"""Rows per fp32 GEMM under invariance: every row is computed in a `[ROW_TILE, K]` product."""
MIN_HALF_ROWS = 4
"""Rows a half-precision GEMM gets at least under invariance. oneDNN's bf16 kernel computes one
row (and, for narrow outputs, two) in a matrix-vector order; from three rows on every row had
the bits it has in a 6144-row product, in every shape of Gemma 3 and of the test model
(measured row by row); four leaves a margin."""

_ROW_INVARIANT: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "row_invariant", default=False
)


@contextlib.contextmanager
def row_invariant(enabled: bool = True) -> Iterator[None]:
    """Inside this block fp32 products of the LoRA layers run in fixed row tiles."""
    token = _ROW_INVARIANT.set(enabled)
    try:
        yield
    finally:
        _ROW_INVARIANT.reset(token)


def rows_are_invariant() -> bool:
    return _ROW_INVARIANT.get()


def checkpoint(function: Callable[..., torch.Tensor], *args: object) -> torch.Tensor:
    """`torch.utils.checkpoint.checkpoint` (non-reentrant) whose recomputation in backward runs
    under the row rule in force now.

    On CUDA and MPS backward runs in autograd's own device threads, which do not see a context
    variable set in the forward's thread: a head chunk computed in row tiles was recomputed
    untiled there, and the checkpoint refused the tensors' other shapes (seen on an H200 with the
    invariant path on). The rule is captured here and set again around the recomputation."""
    enabled = _ROW_INVARIANT.get()

    def under_the_same_rule(*inner: object) -> torch.Tensor:
        with row_invariant(enabled):
            return function(*inner)

    return torch.utils.checkpoint.checkpoint(under_the_same_rule, *args, use_reentrant=False)


GEMM_TILES = 32
"""Tiles per padded GEMM on the fast path (`tiled_matmul`): at most 512 rows in one product,
as many as the output head scores at once (`scoring.HEAD_CHUNK`)."""
SMALL_WEIGHT = 1 << 22
"""Weights of at most this many elements (every projection of a layer, a LoRA factor) are
probed at every tile count, every tile of each product compared."""
WIDE_PROBE_TILES = (1, 2, 3, 4, 6, 9, GEMM_TILES)
"""Tile counts probed for a wider weight (an output head: 168 M elements on Gemma 3, where
probing every count would cost a minute), the first, middle and last tile of each compared."""


def _per_tile(padded: torch.Tensor, weight_t: torch.Tensor) -> torch.Tensor:
    """Every `[ROW_TILE, K]` tile of `padded` in its own GEMM of one shape (`bmm`): invariant by
    construction, but each tile re-reads (and the kernel re-packs) the whole weight."""
    tiles = padded.shape[0] // ROW_TILE
    stacked = padded.view(tiles, ROW_TILE, padded.shape[1])
    out = torch.bmm(stacked, weight_t.unsqueeze(0).expand(tiles, *weight_t.shape))
    return out.reshape(tiles * ROW_TILE, -1)


def _probe_operands(rows: int, features: int, outputs: int, dtype: torch.dtype,
                    device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Random `[rows, features]` inputs and a `[features, outputs]` weight for a probe, drawn from
    a fixed seed. The weight is a random block repeated across the outputs: drawing a
    vocabulary-wide weight would cost more than the probe's products, and every output still
    sums K different products."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, features, generator=generator)
    block = torch.randn(features, min(outputs, 1024), generator=generator)
    weight_t = block.repeat(1, -(-outputs // block.shape[1]))[:, :outputs]
    return x.to(device=device, dtype=dtype), weight_t.to(device=device, dtype=dtype)


@functools.cache
def padded_gemm_is_tiled(
    features: int, outputs: int, dtype: torch.dtype, device: torch.device, threads: int
) -> bool:
    """Whether this machine's GEMM of `[t * ROW_TILE, features] @ [features, outputs]` gives
    every row the bits of its own one-tile product, for every probed tile count `t` (every
    count up to `GEMM_TILES` for a small weight, `WIDE_PROBE_TILES` for a wide one).

    A BLAS computes a row from its K products in an order fixed by its micro-kernel and its K
    blocking; only a partial row group (the reason rows are padded to whole tiles) or a kernel
    chosen by size could make a row depend on the rows beside it. Measured once per shape, dtype,
    device and thread count on random inputs; where any probed count differs, `tiled_matmul`
    keeps one GEMM per tile.
    """
    del threads  # part of the cache key: the kernel's threading can change its order
    x, weight_t = _probe_operands(GEMM_TILES * ROW_TILE, features, outputs, dtype, device)
    tile = lambda i: slice(i * ROW_TILE, (i + 1) * ROW_TILE)  # noqa: E731
    # For a wide weight, the first, middle and last tile of each product: where a partial
    # group, a thread's share or a kernel edge would fall. One-tile products are the reference.
    if features * outputs <= SMALL_WEIGHT:
        checked = {t: range(t) for t in range(1, GEMM_TILES + 1)}
    else:
        checked = {t: sorted({0, t // 2, t - 1}) for t in WIDE_PROBE_TILES}
    with torch.no_grad():
        alone = {i: _per_tile(x[tile(i)], weight_t) for i in set().union(*checked.values())}
        for t, tiles in checked.items():
            product = x[: t * ROW_TILE] @ weight_t
            if not all(torch.equal(product[tile(i)], alone[i]) for i in tiles):
                return False
    return True


def tiled_matmul(x: torch.Tensor, weight_t: torch.Tensor) -> torch.Tensor:
    """`x @ weight_t` for 2-D `x`, every row with the bits of a `[ROW_TILE, K] @ [K, N]` product.

    The rows are padded with zeros to whole tiles, so a row's value never depends on how many
    rows came with it or where it sits among them. Where the probe (`padded_gemm_is_tiled`)
    found that a GEMM of up to `GEMM_TILES` whole tiles gives each row its one-tile bits, the
    padded rows run in such GEMMs (the weight is read once per 512 rows, not once per 16: on a
    2-core Zen 3 in fp32 the transfer recipe's SFT step ran 1.49x faster, `bench_sft_step`);
    elsewhere every tile is its own GEMM.
    """
    rows, features = x.shape
    x = x.contiguous()  # the layout the probe measured (a strided input may take other kernels)
    threads = torch.get_num_threads()
    if not padded_gemm_is_tiled(features, weight_t.shape[1], x.dtype, x.device, threads):
        return _per_tile(_whole_tiles(x), weight_t)[:rows]
    # Whole tiles are multiplied in place, up to `GEMM_TILES` per GEMM; a last, partial tile
    # is padded alone and multiplied as a one-tile GEMM. Every row keeps its one-tile bits (what
    # the probe checked), and neither forward nor backward copies or zero-fills all of `x`.
    # The pieces come from one `split`, whose backward joins their gradients in one tensor (a
    # slice per piece would build a zero-filled gradient of all of `x` per piece).
    step = GEMM_TILES * ROW_TILE
    whole = rows - rows % ROW_TILE
    sizes = [min(step, whole - i) for i in range(0, whole, step)]
    pieces = x.split(sizes + ([rows - whole] if whole < rows else []))
    parts = [piece @ weight_t for piece in pieces[: len(sizes)]]
    if whole < rows:
        tail = torch.cat([pieces[-1], x.new_zeros((ROW_TILE - (rows - whole), features))])
        parts.append((tail @ weight_t)[: rows - whole])
    return parts[0] if len(parts) == 1 else torch.cat(parts)


def _whole_tiles(x: torch.Tensor) -> torch.Tensor:
    """`x` with zero rows after it up to a whole number of tiles (`x` itself when it has one)."""
    short = -x.shape[0] % ROW_TILE
    return x if short == 0 else torch.cat([x, x.new_zeros((short, x.shape[1]))])


HALF_PROBE_ROWS = (MIN_HALF_ROWS, 5, 7, 16, 33)
"""Row counts a half-precision product is probed at against one large product."""
HALF_PROBE_OUTPUTS = 1 << 20
"""Outputs compared per row count (rows capped at 16384, at least 64): a kernel that treats some
row counts differently changes only outputs near a rounding boundary, a few per hundred
thousand."""


@functools.cache
def half_rows_are_invariant(
    features: int, outputs: int, dtype: torch.dtype, device: torch.device, threads: int,
    transposed: bool = False,
) -> bool:
    """Whether this machine's half-precision GEMM `[rows, features] @ [features, outputs]` gives
    each row the bits it has in a large product for every probed count of at least
    `MIN_HALF_ROWS` rows. Measured once per shape, dtype, device, thread count and weight
    layout on the probe's random inputs (`_probe_operands`): `F.linear`'s `[outputs, features]`
    weight, or with `transposed` the transposed view of a `[features, outputs]` one (the
    layout of a layer's backward, `grad @ weight`)."""
    del threads  # part of the cache key
    rows = max(64, min(16384, HALF_PROBE_OUTPUTS // max(1, outputs)))
    x, weight_t = _probe_operands(rows, features, outputs, dtype, device)
    weight = weight_t.T if transposed else weight_t.T.contiguous()
    with torch.no_grad():
        whole = F.linear(x, weight)
        for count in HALF_PROBE_ROWS:
            usable = rows // count * count
            parts = torch.cat([F.linear(x[i : i + count], weight)
                               for i in range(0, usable, count)])
            if not torch.equal(parts, whole[:usable]):
                return False
    return True


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear` of 2-D `x`; under invariance tiled when the product is fp32 (or half precision
    on a machine whose half GEMM the probe finds row-count dependent), and of at least
    `MIN_HALF_ROWS` rows when it is half precision.

    A frozen layer's backward (`grad @ weight`, the gradient of `x`) follows the same rule, so
    a row's gradient does not depend on the rows beside it either: rows of several runs can
    share one product in training as well as in sampling."""
    if not (_ROW_INVARIANT.get() and x.dim() == 2):
        return F.linear(x, weight, bias)
    if torch.is_grad_enabled() and x.requires_grad and not weight.requires_grad:
        return _FrozenLinear.apply(x, weight, bias)
    return _rows_product(x, weight, bias)


def _rows_product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  transposed: bool = False) -> torch.Tensor:
    """`x @ weight.T (+ bias)` with every row's bits independent of the row count; `transposed`
    says `weight` is the transposed view of a contiguous matrix (a backward's layout)."""
    if x.dtype == torch.float32 or not half_rows_are_invariant(
            x.shape[1], weight.shape[0], x.dtype, x.device, torch.get_num_threads(), transposed):
        out = tiled_matmul(x, weight.T)
        return out + bias if bias is not None else out
    rows = x.shape[0]
    if rows >= MIN_HALF_ROWS:
        return F.linear(x, weight, bias)
    padded = torch.cat([x, x.new_zeros((MIN_HALF_ROWS - rows, x.shape[1]))])
    return F.linear(padded, weight, bias)[:rows]


class _FrozenLinear(torch.autograd.Function):
    """A frozen layer's product under invariance whose backward is row-invariant too.

    Autograd's own backward of `F.linear` is one `grad @ weight` over all rows, whose kernel
    the probes never measured; here it is the forward's rule applied to the transposed weight,
    probed in that layout."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor,  # type: ignore[override]
                bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(weight)
        return _rows_product(x, weight, bias)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (weight,) = ctx.saved_tensors
        grad = grad.contiguous().to(weight.dtype)
        return _rows_product(grad, weight.t(), None, transposed=True), None, None
