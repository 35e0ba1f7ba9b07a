"""Batch invariance, the matmul part: a row's product does not depend on the rows beside it.

Fusing requests into one batch changes the shapes the kernels see. On this engine's CPU
kernels (MKL and oneDNN under torch), an fp32 matmul computes rows four at a time, and a row in
the last, partial group of a row count takes another kernel and other bits. A bf16 matmul
through oneDNN computes one row (for narrow outputs, two) in a matrix-vector order: with the
MLP's 2048-wide `down_proj` a few outputs in ten thousand differ by one bf16 step, so a sequence
decoded on alone after its batch-mates finished drifted from the trainer. Under invariance every
fp32 product of the LoRA layers (and of an fp32 base model) runs in fixed tiles of `ROW_TILE`
rows, each row computed inside a GEMM of the same shape whatever the batch, and a half-precision
product of fewer than `MIN_HALF_ROWS` rows gets zero rows beside it. Attention has its own
module (`invariant_attention`); the engine's other rule (each training job on its own
micro-batches) lives in `Training.forward_backward`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
import torch.nn.functional as F

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


def tiled_matmul(x: torch.Tensor, weight_t: torch.Tensor) -> torch.Tensor:
    """`x @ weight_t` for 2-D `x`, as a batch of `[ROW_TILE, K] @ [K, N]` products.

    The rows are padded with zeros to whole tiles, so a row's value never depends on how many
    rows came with it or where it sits among them; `bmm` computes every tile alike.
    """
    rows, features = x.shape
    tiles = -(-rows // ROW_TILE)
    padded = x.new_zeros((tiles * ROW_TILE, features))
    padded[:rows] = x
    stacked = padded.view(tiles, ROW_TILE, features)
    out = torch.bmm(stacked, weight_t.unsqueeze(0).expand(tiles, *weight_t.shape))
    return out.reshape(tiles * ROW_TILE, -1)[:rows]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear` of 2-D `x`; under invariance tiled when the product is fp32, and of at least
    `MIN_HALF_ROWS` rows when it is half precision."""
    if not (_ROW_INVARIANT.get() and x.dim() == 2):
        return F.linear(x, weight, bias)
    if x.dtype == torch.float32:
        out = tiled_matmul(x, weight.T)
        return out + bias if bias is not None else out
    rows = x.shape[0]
    if rows >= MIN_HALF_ROWS:
        return F.linear(x, weight, bias)
    padded = torch.cat([x, x.new_zeros((MIN_HALF_ROWS - rows, x.shape[1]))])
    return F.linear(padded, weight, bias)[:rows]
