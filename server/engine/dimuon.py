"""Dimuon: Tinker's second optimizer, for LoRA matrices.

As Tinker documents it (`DimuonParams`, version 1): the gradient, clipped by its global norm
when `grad_clip_norm` is positive, goes into a running average with coefficient `beta1`; each
LoRA matrix then moves by `learning_rate` along the matrix sign of its average (the polar
factor U Vᵀ of its singular value decomposition: every direction the average spans at the same
scale), rescaled to a Frobenius norm of sqrt(rank). An update's size is thus set by the
learning rate alone, not by the gradient's scale, as with sign-based and orthogonalised
optimizers such as Muon.

The matrix sign is computed exactly from the small rank x rank Gram matrix (a LoRA matrix has
`rank` rows or columns), not with Newton-Schulz iterations, so the update is the documented
one to float precision and the same on every device. SDK 0.38 sends no damping or rank
correction; neither is applied.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

SINGULAR_FLOOR = 1e-6
"""Singular values below this share of the largest count as zero: directions the average does
not span stay still (a LoRA A whose B is still zero has no gradient at all)."""
OPTIMIZER_TYPES = ("adamw", "dimuon")


def matrix_sign(matrix: torch.Tensor) -> torch.Tensor:
    """U Vᵀ for `matrix` = U S Vᵀ over its singular values above `SINGULAR_FLOOR`, from the
    Gram matrix of its short side (float64, then back to the matrix's dtype)."""
    m = matrix.double()
    tall = m.shape[0] > m.shape[1]
    if tall:
        m = m.T
    values, vectors = torch.linalg.eigh(m @ m.T)  # singular values squared, ascending
    largest = values[-1].clamp_min(0)
    if largest <= 0:
        return torch.zeros_like(matrix)
    keep = values > (SINGULAR_FLOOR ** 2) * largest
    inverse_root = torch.where(keep, values.clamp_min(1e-300).rsqrt(), torch.zeros_like(values))
    sign = (vectors * inverse_root) @ vectors.T @ m
    return (sign.T if tall else sign).to(matrix.dtype)


def direction(average: torch.Tensor, rank: int) -> torch.Tensor:
    """The step's direction for one matrix: its matrix sign at Frobenius norm sqrt(rank)."""
    sign = matrix_sign(average)
    norm = torch.linalg.vector_norm(sign)
    if norm == 0:
        return sign
    return sign * (math.sqrt(rank) / norm)


class Dimuon(torch.optim.Optimizer):
    """The update above for one run's LoRA matrices; its state is one running average per
    matrix, saved and restored with the run like AdamW's moments."""

    def __init__(self, params: Iterable[torch.Tensor], rank: int, lr: float = 1e-4,
                 beta1: float = 0.9):
        super().__init__(params, {"lr": lr, "beta1": beta1, "rank": rank})

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN001 - torch's signature
        for group in self.param_groups:
            lr, beta1, rank = group["lr"], group["beta1"], group["rank"]
            for param in group["params"]:
                if param.grad is None:
                    continue
                state = self.state[param]
                if "momentum" not in state:
                    state["momentum"] = torch.zeros_like(param, dtype=torch.float32)
                average = state["momentum"]
                average.mul_(beta1).add_(param.grad.float(), alpha=1 - beta1)
                param.add_(direction(average, rank).to(param.dtype), alpha=-lr)
        return None


def optimizer_type(state: dict | None) -> str | None:
    """Which optimizer a saved optimizer state belongs to (None: no state)."""
    if not state:
        return None
    groups = state.get("param_groups") or [{}]
    return "dimuon" if "rank" in groups[0] and "betas" not in groups[0] else "adamw"
