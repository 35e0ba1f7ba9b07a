"""Tinker's loss functions, as sums over tokens, on padded `[batch, time]` tensors.

Each loss takes the model's log-probabilities of the target tokens and the datum's
`loss_fn_inputs` (padded with zeros, so padding never contributes) and returns one loss per row.
Masking happens only through the inputs: `weights=0` for cross entropy, `advantages=0` for the
policy-gradient losses. Pure functions, no engine state.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Inputs = dict[str, torch.Tensor]
Config = dict[str, float | str]


class LossError(ValueError):
    """A loss request that cannot be computed (unknown loss, missing inputs): a user error."""


def _number(config: Config, key: str, default: float | None) -> float:
    value = config.get(key, default)
    if value is None:
        raise LossError(f"loss_fn_config[{key!r}] is required")
    if isinstance(value, str):
        raise LossError(f"loss_fn_config[{key!r}] must be a number, got {value!r}")
    return float(value)


def _threshold(inputs: Inputs, config: Config, key: str, default: float) -> torch.Tensor | float:
    """Clip thresholds may come per token (as inputs) or as one number (config)."""
    if key in inputs:
        return inputs[key]
    return _number(config, key, default)


def cross_entropy(target_lp: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    """`-(weights * logp).sum()`: linear in arbitrary real weights, negative ones too."""
    weights = inputs["weights"]
    while weights.dim() < target_lp.dim():
        weights = weights.unsqueeze(-1)
    return -(weights * target_lp).flatten(1).sum(-1)


def _ratio(target_lp: torch.Tensor, inputs: Inputs) -> torch.Tensor:
    return torch.exp(target_lp - inputs["logprobs"])


def importance_sampling(target_lp: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    return -(_ratio(target_lp, inputs) * inputs["advantages"]).sum(-1)


def ppo(target_lp: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    ratio = _ratio(target_lp, inputs)
    adv = inputs["advantages"]
    low = _threshold(inputs, config, "clip_low_threshold", 0.8)
    high = _threshold(inputs, config, "clip_high_threshold", 1.2)
    clipped = torch.clamp(ratio, low, high)
    return -torch.minimum(ratio * adv, clipped * adv).sum(-1)


def cispo(target_lp: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    ratio = _ratio(target_lp, inputs)
    low = _threshold(inputs, config, "clip_low_threshold", 0.0)
    high = _threshold(inputs, config, "clip_high_threshold", 4.0)
    weight = torch.clamp(ratio, low, high).detach()
    return -(weight * target_lp * inputs["advantages"]).sum(-1)


def dro(target_lp: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    beta = _number(config, "beta", None)
    diff = target_lp - inputs["logprobs"]
    return -(target_lp * inputs["advantages"] - 0.5 * beta * diff**2).sum(-1)


LossFn = Callable[[torch.Tensor, Inputs, Config], torch.Tensor]

LOSSES: dict[str, LossFn] = {
    "cross_entropy": cross_entropy,
    "importance_sampling": importance_sampling,
    "ppo": ppo,
    "cispo": cispo,
    "dro": dro,
}

REQUIRED_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
    "cispo": ("target_tokens", "logprobs", "advantages"),
    "dro": ("target_tokens", "logprobs", "advantages"),
}


def resolve(loss_fn: str) -> LossFn:
    try:
        return LOSSES[loss_fn]
    except KeyError:
        supported = ", ".join(sorted(LOSSES))
        raise LossError(
            f"unsupported loss_fn {loss_fn!r}; this server supports: {supported}"
        ) from None
