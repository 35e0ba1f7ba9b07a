"""Which positions a loss reads, and which it can send gradient through.

Gemma's output head (262k rows) costs more per position than the whole body of a small model,
so a position goes through it only where the loss reads its log-probability:

- `read`: the loss's value depends on the position's log-probability, or a client reads it
  back (the sampled positions of an RL datum, whose training logprobs the cookbook compares
  with the sampler's). Elsewhere `forward_backward` returns 0.0 and the head never runs;
  `forward` scores every position.
- `active`: the loss's gradient can be non-zero there; such positions go through the head with
  gradients (checkpointed), the rest of `read` without.

The rules work on one datum's numpy inputs (`[T]`, weights `[T]` or `[T, K]`) and on padded
torch batches (`[B, T]`, `[B, T, K]`) alike, and return per-position masks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from server.engine import losses

POLICY_GRADIENT = frozenset({"importance_sampling", "ppo", "cispo", "gspo"})
"""Losses whose every term is multiplied by the advantage (gspo's sequence ratio aside)."""


def _nonzero(array: Any, real: Any) -> Any:
    """`array != 0` at the real positions (a 2-D target's weights: any of its columns)."""
    mask = array != 0
    return (mask.any(-1) if mask.ndim > real.ndim else mask) & real


def loss_positions(loss_fn: str, inputs: Mapping[str, Any], real: Any) -> tuple[Any, Any]:
    """`(read, active)` position masks of one datum or padded batch for `loss_fn`.

    `real` is the mask of real (not padding) positions, the shape both results take;
    `active` is always within `read`, and both within `real`.
    """
    if loss_fn == "cross_entropy":
        weights = _nonzero(inputs["weights"], real)
        return weights, weights
    if loss_fn in POLICY_GRADIENT:
        active = _nonzero(inputs["advantages"], real)
        read = active | _nonzero(inputs["logprobs"], real)
        if loss_fn == "gspo" and "sequence_ratio_mask" in inputs:
            read = read | _nonzero(inputs["sequence_ratio_mask"], real)
        return read, active
    if loss_fn in losses.NEEDS_SAMPLING_RECORD and losses.RECORDED_MASK in inputs:
        active = _nonzero(inputs[losses.RECORDED_MASK], real)
        read = active | _nonzero(inputs["advantages"], real)
        if "logprobs" in inputs:
            read = read | _nonzero(inputs["logprobs"], real)
        return read, active
    return real, real  # dro: its quadratic term reads every position
