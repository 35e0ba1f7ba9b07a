"""The statistics behind decisions, against published values and by simulation."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from autoresearch.evaluation.stats import (
    PairedTable,
    mcnemar_exact,
    newcombe_paired,
    paired_difference,
    paired_exact_test,
    paired_t,
    seed_means,
    sign_flip_p,
    wilson,
)


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


def test_four_wins_and_no_losses_of_64_is_not_significant():
    # A normal interval on the 64 differences excludes zero; the exact test does not.
    assert mcnemar_exact(4, 0) == pytest.approx(0.125)
    a = {f"t{i}": i < 4 for i in range(64)}
    b = {f"t{i}": False for i in range(64)}
    test = paired_exact_test(a, b)
    assert (test.wins, test.losses) == (4, 0)
    assert test.p_value == pytest.approx(0.0625)  # one-sided
    assert test.difference.value == pytest.approx(4 / 64)
    assert test.difference.low < 0 < test.difference.high


def test_newcombe_paired_interval_matches_a_published_value():
    # Cavo et al. 2012 (Fagerland, Lydersen & Laake, "Statistical analysis of contingency
    # tables", ch. 8): Newcombe square-and-add, -0.0621 (95% CI -0.1186 to -0.0046).
    est = newcombe_paired(PairedTable(59, 6, 16, 80))
    assert est.value == pytest.approx(-0.0621, abs=5e-5)
    assert est.low == pytest.approx(-0.1186, abs=5e-5)
    assert est.high == pytest.approx(-0.0046, abs=5e-5)


def test_newcombe_does_not_collapse_when_one_side_never_wins():
    est = paired_difference([1, 0, 0, 0, 0, 0, 0, 0], [0] * 8)
    assert est.low < 0 < est.value < est.high
    same = paired_difference([1, 0, 1, 0], [1, 0, 1, 0])
    assert same.value == 0 and same.low < 0 < same.high


def test_sign_flip_test_is_the_exact_mcnemar_test_for_one_seed():
    for wins, losses in [(4, 0), (7, 2), (10, 10), (0, 3)]:
        d = [1.0] * wins + [-1.0] * losses + [0.0] * 20
        assert sign_flip_p(d, 1) == pytest.approx(mcnemar_exact(wins, losses, "greater"))


def test_sign_flip_test_counts_exactly_with_several_seeds():
    # Three seeds: |d| = 1/3, 2/3 and 1, eight equally likely sign patterns. Only the all-plus
    # pattern reaches the sum 2; sums >= 2/3 come from (+,+,+), (+,-,+) and (-,+,+).
    assert sign_flip_p([1 / 3, 2 / 3, 1.0], 3) == pytest.approx(1 / 8)
    assert sign_flip_p([1 / 3, -2 / 3, 1.0], 3) == pytest.approx(3 / 8)


def test_seeds_are_combined_per_task_and_do_not_narrow_without_new_tasks():
    a = {f"t{i}": i < 4 for i in range(64)}
    b = {f"t{i}": False for i in range(64)}
    one = paired_exact_test(a, b)
    three = paired_exact_test([a, a, a], [b, b, b])  # three seeds repeating the same 4 wins
    assert three.seeds == 3 and three.difference.n == 64
    assert three.p_value == pytest.approx(one.p_value)
    assert (three.difference.low, three.difference.high) == pytest.approx(
        (one.difference.low, one.difference.high))


def test_seed_means_average_each_task_over_the_runs_it_has_in_all():
    means = seed_means([{"x": True, "y": False, "z": True}, {"x": True, "y": True}])
    assert means == {"x": 1.0, "y": 0.5}


def test_paired_table_needs_equal_lengths_and_binary_outcomes():
    with pytest.raises(ValueError):
        PairedTable.of([1, 0], [1])
    with pytest.raises(ValueError):
        PairedTable.of([0.5], [1])




def test_newcombe_interval_covers_about_95_percent():
    # Coverage of the true paired difference, estimated by simulation at a small n where the
    # normal interval is known to undercover.
    rng = np.random.default_rng(7)
    n, runs = 48, 2000
    difficulty_pool = rng.normal(0, 1.5, 400_000)
    shift_a, shift_b = np.log(0.25 / 0.75), np.log(0.15 / 0.85)
    truth = float(np.mean(1 / (1 + np.exp(-(difficulty_pool + shift_a)))
                          - 1 / (1 + np.exp(-(difficulty_pool + shift_b)))))
    covered = 0
    for _ in range(runs):
        difficulty = rng.normal(0, 1.5, n)
        a = (rng.random(n) < 1 / (1 + np.exp(-(difficulty + shift_a)))).astype(int).tolist()
        b = (rng.random(n) < 1 / (1 + np.exp(-(difficulty + shift_b)))).astype(int).tolist()
        est = newcombe_paired(PairedTable.of(a, b))
        covered += est.low <= truth <= est.high
    assert 0.93 <= covered / runs <= 0.975


def test_exact_test_holds_its_level_under_no_difference():
    rng = random.Random(3)
    rejections = 0
    for _ in range(800):
        p = [rng.betavariate(0.5, 1.5) for _ in range(96)]
        a = {f"t{i}": rng.random() < q for i, q in enumerate(p)}
        b = {f"t{i}": rng.random() < q for i, q in enumerate(p)}
        rejections += paired_exact_test(a, b).p_value <= 0.05
    assert rejections / 800 <= 0.05


def test_the_paired_t_interval_matches_scipy_and_a_one_run_look_keeps_newcombe():
    from scipy import stats as scipy_stats

    d = [1.0, -1 / 3, 0.0, 2 / 3, -1 / 3, 0.0, 1.0, 0.0]
    est = paired_t(d)
    low, high = scipy_stats.t.interval(0.95, len(d) - 1, loc=np.mean(d), scale=scipy_stats.sem(d))
    assert (est.low, est.high) == (pytest.approx(low), pytest.approx(high))
    tasks = [f"t{i}" for i in range(8)]
    one = {t: i % 2 == 0 for i, t in enumerate(tasks)}
    other = {t: i % 3 == 0 for i, t in enumerate(tasks)}
    # one run a side: the t option changes nothing (Newcombe's interval, exact McNemar)
    assert paired_exact_test(one, other, interval="t") == paired_exact_test(one, other)
    # one run against three: the same exact p, a t interval in place of the bootstrap
    quick = paired_exact_test(one, [other, one, other], interval="t")
    slow = paired_exact_test(one, [other, one, other])
    assert quick.p_value == slow.p_value and quick.difference.value == slow.difference.value
    assert quick.difference.low == pytest.approx(paired_t(
        [float(one[t]) - (2 * other[t] + one[t]) / 3 for t in tasks]).low)


def _runs(accuracies: list[float], tasks: int = 40) -> list[dict[str, bool]]:
    """Runs whose first `round(a * tasks)` tasks are right."""
    return [{f"t{i:02d}": i < round(a * tasks) for i in range(tasks)} for a in accuracies]


def test_the_run_level_test_holds_without_runs_and_without_spread():
    from autoresearch.evaluation.stats import run_level_test

    empty = run_level_test([], [])
    assert empty.p_value == 1.0 and empty.df == 0
    # two identical runs a side (reproducible training on one seed, or plain coincidence):
    # no proof of zero spread, so a 10-point gap on 40 tasks is not certain
    alike = run_level_test(_runs([0.6, 0.6]), _runs([0.5, 0.5]))
    assert alike.df == 2 and alike.run_sd > 0 and alike.p_value > 0.05
    shrunk = (0.55 * 40 + 0.5) / 41  # the runs' mean accuracy, half a task from 0 and 1
    assert math.isclose(alike.run_sd, math.sqrt(shrunk * (1 - shrunk) / 40))
    # a gap far beyond a run's answer noise still shows
    clear = run_level_test(_runs([0.8, 0.825, 0.775]), _runs([0.5, 0.525, 0.475]))
    assert clear.p_value < 0.01
    # every run at 0 (or 1): the floor keeps a width, and p stays a probability
    nothing = run_level_test(_runs([0.0, 0.0]), _runs([0.0, 0.0]))
    assert nothing.standard_error > 0 and nothing.p_value == 0.5
    extremes = run_level_test(_runs([1.0, 1.0]), _runs([0.0, 0.0]))
    assert 0 < extremes.p_value < 0.01 and math.isfinite(extremes.interval().low)


def test_a_noisy_candidate_is_judged_by_its_own_spread():
    """A candidate whose two runs land 40 points apart, against a steady base config and its
    seed bank: pooling one spread over configs lets the bank's steadiness shrink the
    candidate's noise; Welch's test keeps it (and its single degree of freedom)."""
    from autoresearch.evaluation.stats import run_level_test

    noisy, steady = _runs([0.45, 0.85], 200), _runs([0.5, 0.5], 200)
    bank = [_runs([0.5, 0.51, 0.49, 0.5, 0.505, 0.495], 200)]
    welch = run_level_test(noisy, steady, bank)
    pooled = run_level_test(noisy, steady, bank, own_spreads=False)
    assert welch.own_spread and not pooled.own_spread
    assert math.isclose(welch.candidate_sd, 0.4 / math.sqrt(2), rel_tol=1e-9)
    assert welch.df < 1.5 and pooled.df == 7
    assert welch.p_value > 2 * pooled.p_value
    width = [(t.interval().high - t.interval().low) for t in (welch, pooled)]
    assert width[0] > width[1]
    assert "Welch" in welch.describe_spread() and "one spread" in pooled.describe_spread()


def test_one_candidate_run_is_judged_with_the_pooled_spread():
    from autoresearch.evaluation.stats import run_level_test

    bank = [_runs([0.5, 0.51, 0.49, 0.5, 0.505, 0.495], 200)]
    one = run_level_test(_runs([0.6], 200), _runs([0.5, 0.52], 200), bank)
    assert not one.own_spread and one.df == 6  # pooled: the incumbent's and the bank's
    assert one.candidate_sd == one.run_sd
    assert math.isclose(one.standard_error, one.run_sd * math.sqrt(1 + 1 / 2))


def test_a_configs_accuracy_over_runs_holds_each_runs_luck():
    from autoresearch.evaluation.stats import run_mean, wilson

    runs = _runs([0.5, 0.6, 0.7])
    est = run_mean(runs)
    assert math.isclose(est.value, 0.6) and est.n == 3
    half = 4.302652729911275 * 0.1 / math.sqrt(3)  # t(0.975, 2) * sd / sqrt(runs)
    assert math.isclose(est.high - est.value, half, rel_tol=1e-9)
    assert run_mean(_runs([0.5])) == wilson(20, 40)  # one run: over tasks only
    assert run_mean([]).n == 0


def _crossed(rng, runs: int, questions: int, run_sd: float, question_sd: float):
    """Answers whose chance is 0.5 + a run's luck + a question's difficulty (both symmetric, so
    the accuracy over all runs and questions of this kind is exactly 0.5)."""
    luck = rng.normal(0, run_sd, runs)
    difficulty = rng.normal(0, question_sd, questions)
    p = np.clip(0.5 + luck[:, None] + difficulty[None, :], 0, 1)
    right = rng.random((runs, questions)) < p
    return [{f"q{j:03d}": bool(right[i, j]) for j in range(questions)} for i in range(runs)]


@pytest.mark.parametrize("run_sd,question_sd", [(0.05, 0.3), (0.1, 0.05), (0.0, 0.4)])
def test_an_interval_over_runs_and_questions_covers_the_accuracy_of_both(run_sd, question_sd):
    """Other runs and other questions of the same kind: the crossed interval covers their
    accuracy about 95% of the time; the interval over runs alone (questions held fixed) misses
    it far more often when questions vary more than runs."""
    from autoresearch.evaluation.stats import run_mean, runs_and_questions_mean

    rng = np.random.default_rng(11)
    trials, crossed_hits, fixed_hits = 400, 0, 0
    for _ in range(trials):
        runs = _crossed(rng, 8, 200, run_sd, question_sd)
        crossed = runs_and_questions_mean(runs)
        fixed = run_mean(runs)
        crossed_hits += crossed.low <= 0.5 <= crossed.high
        fixed_hits += fixed.low <= 0.5 <= fixed.high
    assert 0.92 <= crossed_hits / trials <= 0.98  # measured: 0.945, 0.938, 0.953
    if question_sd >= 0.3:
        assert fixed_hits / trials < 0.9  # measured: 0.87 and 0.77


def test_the_crossed_interval_of_one_run_or_no_spread():
    from autoresearch.evaluation.stats import runs_and_questions_mean, wilson

    assert runs_and_questions_mean(_runs([0.5])) == wilson(20, 40)
    assert runs_and_questions_mean([]).n == 0
    all_wrong = runs_and_questions_mean(_runs([0.0, 0.0, 0.0]))
    assert all_wrong.value == 0.0 and all_wrong.high > 0.0  # no spread is no proof of none


def test_a_difference_from_a_run_mean_is_not_clipped_where_the_mean_is():
    """The warm-up comparison subtracts a fixed accuracy from a run mean: the mean's interval
    clipped at 0 would turn [-0.041, +0.083] into [+0.000, +0.083]."""
    from autoresearch.evaluation.stats import run_mean

    tasks = [f"t{i}" for i in range(48)]
    runs = [{t: i < k for i, t in enumerate(tasks)} for k in (0, 1, 4)]
    clipped, raw = run_mean(runs), run_mean(runs, clip=False)
    assert clipped.low == 0.0 and raw.low < 0.0
    assert raw.value == clipped.value and raw.high == clipped.high
