"""The arithmetic of GRPO: group advantages and KL estimates. Small pure functions.

Data flow: rewards of one group (the samples of one prompt) -> advantages -> per-token
advantages on the sampled tokens of each datum. KL is estimated from the logprobs that the
sampler reported and the logprobs of the same tokens under another policy (the trainer's, or
the base model's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

Rewards = Sequence[float]
Logprobs = Sequence[float]


def group_advantages(
    rewards: Rewards, mode: Literal["mean", "zscore"] = "mean", eps: float = 1e-6
) -> np.ndarray:
    """Each sample's reward relative to its group: `r - mean(r)`, optionally divided by std."""
    values = np.asarray(rewards, dtype=np.float64)
    if values.size == 0:
        return values
    centred = values - values.mean()
    if mode == "zscore":
        return centred / (values.std() + eps)
    if mode != "mean":
        raise ValueError(f"unknown advantage mode {mode!r}")
    return centred


def is_constant(rewards: Rewards, tol: float = 1e-9) -> bool:
    """A group whose rewards are all equal has zero advantages: no learning signal."""
    values = np.asarray(rewards, dtype=np.float64)
    return values.size == 0 or float(values.max() - values.min()) <= tol


def kl_estimates(sampled: Logprobs, other: Logprobs) -> dict[str, float]:
    """Monte-Carlo estimates of KL(pi_sample || pi_other) per token from sampled tokens.

    `k1` is the mean of log(p/q) (unbiased, noisy, can be negative); `k3` is the mean of
    `(r - 1) - log r` with r = q/p (unbiased and always >= 0; Schulman's estimator).
    """
    p = np.asarray(sampled, dtype=np.float64)
    q = np.asarray(other, dtype=np.float64)
    if p.size == 0:
        return {"k1": 0.0, "k3": 0.0}
    log_ratio = q - p
    return {
        "k1": float(np.mean(-log_ratio)),
        "k3": float(np.mean(np.expm1(log_ratio) - log_ratio)),
    }


def token_advantages(
    advantage: float,
    sampled_logprobs: Logprobs,
    reference_logprobs: Logprobs | None = None,
    kl_coef: float = 0.0,
) -> np.ndarray:
    """Per-token advantages of one sample, with an optional KL penalty folded in.

    The penalty subtracts `kl_coef * (log pi(t) - log pi_ref(t))` at each sampled token, the
    usual way to keep a policy near its reference without a separate loss term.
    """
    values = np.full(len(sampled_logprobs), advantage, dtype=np.float64)
    if kl_coef and reference_logprobs is not None:
        values -= kl_coef * (np.asarray(sampled_logprobs) - np.asarray(reference_logprobs))
    return values


def aggregation_scale(
    mode: Literal["sum", "token_mean", "sequence_mean"], completion_tokens: int,
    step_tokens: int, step_sequences: int,
) -> float:
    """The factor on one completion's per-token advantages that makes the server's summed loss
    the aggregation `mode` asks for: `sum` leaves it (Dr. GRPO), `token_mean` divides by the
    step's completion tokens (DAPO), `sequence_mean` by the completion's own length and the
    number of completions (the original GRPO)."""
    if mode == "sum":
        return 1.0
    if mode == "token_mean":
        return 1.0 / max(1, step_tokens)
    if mode == "sequence_mean":
        return 1.0 / (max(1, completion_tokens) * max(1, step_sequences))
    raise ValueError(f"unknown loss aggregation {mode!r}")
