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
TOKEN_MASK = "_token_mask"
"""Input the engine adds: 1 at a row's real tokens, 0 at padding."""


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


def _clip(ratio: torch.Tensor, low: torch.Tensor | float, high: torch.Tensor | float):
    """`ratio` clamped to [low, high], where either bound may be per token or one number."""
    as_tensor = lambda v: torch.as_tensor(v, dtype=ratio.dtype, device=ratio.device)  # noqa: E731
    return torch.clamp(ratio, as_tensor(low), as_tensor(high))


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
    clipped = _clip(ratio, low, high)
    return -torch.minimum(ratio * adv, clipped * adv).sum(-1)


def cispo(target_lp: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    ratio = _ratio(target_lp, inputs)
    low = _threshold(inputs, config, "clip_low_threshold", 0.0)
    high = _threshold(inputs, config, "clip_high_threshold", 4.0)
    weight = _clip(ratio, low, high).detach()
    return -(weight * target_lp * inputs["advantages"]).sum(-1)


def dro(target_lp: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    if "beta" not in config:
        raise LossError(
            "loss 'dro' needs loss_fn_config['beta']: Tinker documents no default for it "
            "(its example uses {'beta': 0.05})"
        )
    beta = _number(config, "beta", None)
    diff = target_lp - inputs["logprobs"]
    if TOKEN_MASK in inputs:  # the quadratic term is not zero at padding: mask it
        diff = diff * inputs[TOKEN_MASK]
    return -(target_lp * inputs["advantages"] - 0.5 * beta * diff**2).sum(-1)


def gspo(target_lp: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    """GSPO-token, as Tinker defines it: every token carries the sequence ratio's value (the
    geometric mean of the token ratios over `sequence_ratio_mask`) and its own log-probability's
    gradient, then PPO's clipped objective. A row whose mask is empty has a sequence ratio of 1.
    Tinker states no default thresholds; like `ppo`, they default to 0.8 and 1.2.

    Without `sequence_ratio_mask` (the cookbook's own `rl.train` never sends one) the sequence
    is its sampled positions: those with a recorded logprob or an advantage (prompt positions
    carry neither)."""
    mask = inputs.get("sequence_ratio_mask")
    if mask is None:
        mask = (inputs["logprobs"] != 0) | (inputs["advantages"] != 0)
    in_ratio = (mask != 0).to(target_lp.dtype)
    token_log_ratio = (target_lp.detach() - inputs["logprobs"]) * in_ratio
    count = in_ratio.sum(-1, keepdim=True)
    log_ratio = token_log_ratio.sum(-1, keepdim=True) / count.clamp(min=1)
    ratio = torch.exp(log_ratio + target_lp - target_lp.detach())
    adv = inputs["advantages"]
    low = _threshold(inputs, config, "clip_low_threshold", 0.8)
    high = _threshold(inputs, config, "clip_high_threshold", 1.2)
    clipped = _clip(ratio, low, high)
    return -torch.minimum(ratio * adv, clipped * adv).sum(-1)


RECORDED_LOGPROBS = "recorded_logprobs"
"""Input the server fills for `stable_reinforce`: the sampler's log-probability of each sampled
target token, as recorded when it was sampled (0 elsewhere)."""
RECORDED_MASK = "recorded_mask"
"""Input the server fills for `stable_reinforce`: 1 where the target token is a recorded sampled
token named by the datum's provenance, 0 elsewhere."""


def stable_reinforce(target_lp: torch.Tensor, inputs: Inputs, config: Config) -> torch.Tensor:
    """REINFORCE with a truncated, stop-gradient importance weight against the sampler's own
    recorded log-probabilities (this server's reading of Tinker's alpha loss, whose formula is not
    published): `-(sg(min(r, clip_high_threshold)) * A * logp)` per recorded sampled token, with
    `r = exp(logp - q_recorded)`, plus `kl_coeff * (r - 1 - log r)` (an estimate of
    KL(sampler || policy)) when `kl_coeff > 0`. Tokens without a sampling record contribute
    nothing, so stale or edited client logprobs can never blow the update up."""
    mask = inputs[RECORDED_MASK] != 0
    zero = torch.zeros_like(target_lp)
    log_ratio = torch.where(mask, target_lp - inputs[RECORDED_LOGPROBS], zero)
    cap = _number(config, "clip_high_threshold", 2.0)
    kl_coeff = _number(config, "kl_coeff", 0.0)
    if cap <= 0 or kl_coeff < 0:
        raise LossError("stable_reinforce needs clip_high_threshold > 0 and kl_coeff >= 0")
    weight = torch.clamp(torch.exp(log_ratio.detach()), max=cap)
    objective = weight * inputs["advantages"] * target_lp
    if kl_coeff:
        ratio = torch.exp(log_ratio)
        objective = objective - kl_coeff * (ratio - 1 - log_ratio)
    return -torch.where(mask, objective, zero).sum(-1)


LossFn = Callable[[torch.Tensor, Inputs, Config], torch.Tensor]

LOSSES: dict[str, LossFn] = {
    "cross_entropy": cross_entropy,
    "importance_sampling": importance_sampling,
    "ppo": ppo,
    "cispo": cispo,
    "dro": dro,
    "gspo": gspo,
    "stable_reinforce": stable_reinforce,
}

REQUIRED_INPUTS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": ("target_tokens", "logprobs", "advantages"),
    "ppo": ("target_tokens", "logprobs", "advantages"),
    "cispo": ("target_tokens", "logprobs", "advantages"),
    "dro": ("target_tokens", "logprobs", "advantages"),
    "gspo": ("target_tokens", "logprobs", "advantages"),
    "stable_reinforce": ("target_tokens", "advantages", RECORDED_LOGPROBS, RECORDED_MASK),
}

NEEDS_SAMPLING_RECORD = frozenset({"stable_reinforce"})
"""Losses that train on what `record_stability_info=True` recorded at sampling time."""


def resolve(loss_fn: str) -> LossFn:
    try:
        return LOSSES[loss_fn]
    except KeyError:
        supported = ", ".join(sorted(LOSSES))
        raise LossError(
            f"unsupported loss_fn {loss_fn!r}; this server supports: {supported}"
        ) from None
