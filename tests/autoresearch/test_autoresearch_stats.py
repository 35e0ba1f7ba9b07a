"""The evaluation's confidence intervals."""

from __future__ import annotations

import pytest

from autoresearch.evaluation.stats import paired_difference, wilson


def test_wilson_interval_matches_a_published_value():
    # 81 of 263 (Wilson 1927 / Newcombe 1998 worked example): 0.2553 to 0.3662.
    est = wilson(81, 263)
    assert est.value == pytest.approx(81 / 263)
    assert est.low == pytest.approx(0.2553, abs=5e-4)
    assert est.high == pytest.approx(0.3662, abs=5e-4)


def test_wilson_stays_inside_the_unit_interval_at_the_edges():
    zero, full = wilson(0, 10), wilson(10, 10)
    assert zero.low == 0.0 and 0 < zero.high < 0.35
    assert full.high == 1.0 and 0.65 < full.low < 1


def test_interval_narrows_with_more_tasks():
    assert (wilson(50, 100).high - wilson(50, 100).low) > (
        wilson(500, 1000).high - wilson(500, 1000).low
    )


def test_paired_difference_of_identical_verdicts_is_exactly_zero():
    a = [1, 0, 1, 1, 0]
    est = paired_difference(a, a)
    assert est.value == 0 and est.low == 0 and est.high == 0


def test_paired_difference_excludes_zero_only_for_a_consistent_gain():
    better = [1] * 40 + [0] * 60
    worse = [0] * 20 + [1] * 20 + [0] * 60  # same 100 tasks, 20 fewer solved
    clear = paired_difference(better, worse)
    assert clear.value == pytest.approx(0.2) and clear.low > 0
    noisy = paired_difference([1, 0] * 10, [0, 1] * 10)
    assert noisy.low < 0 < noisy.high


def test_paired_difference_needs_equal_lengths():
    with pytest.raises(ValueError):
        paired_difference([1, 0], [1])
