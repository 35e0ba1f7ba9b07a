"""GRPO arithmetic: group advantages, constant groups, KL estimates, per-token advantages."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autoresearch.rl.advantages import group_advantages, is_constant, kl_estimates, token_advantages


def test_mean_centred_advantages_sum_to_zero_and_keep_order():
    adv = group_advantages([1.0, 0.0, 0.0, 1.0], "mean")
    assert adv.tolist() == [0.5, -0.5, -0.5, 0.5]
    assert adv.sum() == pytest.approx(0.0)


def test_zscored_advantages_have_unit_spread():
    adv = group_advantages([0.0, 1.0, 2.0, 3.0], "zscore")
    assert adv.mean() == pytest.approx(0.0)
    assert adv.std() == pytest.approx(1.0, rel=1e-4)


def test_a_constant_group_has_zero_advantages_and_is_detected():
    assert is_constant([0.3, 0.3, 0.3])
    assert not is_constant([0.3, 0.3, 0.31])
    assert group_advantages([0.3, 0.3], "zscore").tolist() == [0.0, 0.0]


def test_unknown_advantage_mode_is_rejected():
    with pytest.raises(ValueError):
        group_advantages([1.0, 2.0], "median")  # type: ignore[arg-type]


def test_kl_of_identical_policies_is_zero():
    lp = [-0.5, -1.2, -3.0]
    est = kl_estimates(lp, lp)
    assert est == {"k1": 0.0, "k3": 0.0}


def test_kl_estimates_match_their_definitions():
    p = np.array([-0.1, -2.0, -0.7])
    q = np.array([-0.3, -1.0, -0.7])
    est = kl_estimates(p, q)
    assert est["k1"] == pytest.approx(np.mean(p - q))
    r = np.exp(q - p)
    assert est["k3"] == pytest.approx(np.mean(r - 1 - np.log(r)))
    assert est["k3"] >= 0


def test_kl_penalty_lowers_advantage_where_policy_exceeds_reference():
    sampled = [-0.1, -2.0]
    reference = [-1.1, -2.0]
    adv = token_advantages(1.0, sampled, reference, kl_coef=0.5)
    assert adv[0] == pytest.approx(1.0 - 0.5 * 1.0)
    assert adv[1] == pytest.approx(1.0)
    assert token_advantages(1.0, sampled, reference, kl_coef=0.0).tolist() == [1.0, 1.0]
    assert not any(math.isnan(x) for x in adv)


def test_loss_aggregation_scales_each_completions_advantages_to_the_mean_it_names():
    from autoresearch.rl.advantages import aggregation_scale

    # sum: as is; token_mean: over the step's 40 completion tokens; sequence_mean: each
    # completion's own mean (10 tokens), then over the step's 4 completions
    assert aggregation_scale("sum", 10, 40, 4) == 1.0
    assert aggregation_scale("token_mean", 10, 40, 4) == 1 / 40
    assert aggregation_scale("sequence_mean", 10, 40, 4) == 1 / 40
    assert aggregation_scale("sequence_mean", 5, 40, 4) == 1 / 20  # a short one weighs more
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregation_scale("median", 10, 40, 4)  # type: ignore[arg-type]
