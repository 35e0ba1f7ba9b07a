"""Batch invariance, the matmul part: a row's product does not depend on the rows beside it.

Fusing requests into one batch changes the shapes the kernels see. On this engine's CPU
kernels (MKL and oneDNN under torch), an fp32 matmul computes a row differently when it falls
into the tail of a small row count (fewer than 12 rows, measured), so the same token gets other
bits beside other rows; bf16 matmuls through oneDNN do not. Under invariance every fp32 product
of the LoRA layers (and of an fp32 base model) runs in fixed tiles of `ROW_TILE` rows: each row
is computed inside a GEMM of the same shape whatever the batch. Attention has its own module
(`invariant_attention`); the engine's other rule (each training job on its own micro-batches)
lives in `Training.forward_backward`.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch
import torch.nn.functional as F

ROW_TILE = 16
"""Rows per fp32 GEMM under invariance: every row is computed in a `[ROW_TILE, K]` product."""

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
    """`F.linear`, tiled when invariance is on and the product is fp32 (bf16 is row-invariant
    as it is)."""
    if not (_ROW_INVARIANT.get() and x.dtype == torch.float32 and x.dim() == 2):
        return F.linear(x, weight, bias)
    out = tiled_matmul(x, weight.T)
    return out + bias if bias is not None else out
