"""The execution-match comparator on the edge cases benchmarks disagree about."""

import datetime as dt
from decimal import Decimal

import pytest

from rewards import column_overlap, execution_match, has_top_level_order_by, row_overlap


def test_rows_are_a_multiset_so_order_is_ignored_but_duplicates_count():
    assert execution_match([(2,), (1,)], [(1,), (2,)])
    assert not execution_match([(1,), (1,)], [(1,)])
    assert not execution_match([(1,), (1,), (2,)], [(1,), (2,), (2,)])


def test_rows_are_a_sequence_when_asked():
    assert not execution_match([(2,), (1,)], [(1,), (2,)], ordered=True)
    assert execution_match([(1,), (2,)], [(1,), (2,)], ordered=True)


@pytest.mark.parametrize(
    ("sql", "ordered"),
    [
        ("SELECT a FROM t ORDER BY a", True),
        ("(SELECT a FROM t ORDER BY a)", True),
        ("SELECT a FROM t UNION SELECT b FROM u ORDER BY 1", True),
        ("SELECT a FROM t LIMIT 3", False),
        ("SELECT a, RANK() OVER (ORDER BY b) FROM t", False),
        ("SELECT a FROM (SELECT a FROM t ORDER BY a) s", False),
        ("WITH s AS (SELECT a FROM t ORDER BY a) SELECT a FROM s", False),
        ("SELECT 'order by' AS label FROM t", False),
        ("not sql at all ((", False),
    ],
)
def test_order_matters_only_for_a_top_level_order_by_found_by_parsing(sql, ordered):
    assert has_top_level_order_by(sql) is ordered


def test_floats_match_within_tolerance_only():
    assert execution_match([(0.1 + 0.2,)], [(0.3,)])
    assert not execution_match([(1.0,)], [(1.001,)])
    assert execution_match([(1.0,)], [(1.001,)], rel_tol=0.01)


def test_decimal_and_int_compare_as_numbers():
    assert execution_match([(Decimal("1.50"),)], [(1.5,)])
    assert execution_match([(2,)], [(2.0,)])
    assert execution_match([(Decimal("0.1") * 3,)], [(0.30000000000000004,)])


def test_bool_is_not_a_number():
    assert not execution_match([(True,)], [(1,)])
    assert not execution_match([(False,)], [(0.0,)])
    assert execution_match([(True,)], [(True,)])


def test_null_nan_dates_and_nested_values():
    assert execution_match([(None,)], [(None,)])
    assert not execution_match([(None,)], [("None",)])
    assert not execution_match([(None,)], [(0,)])
    assert execution_match([(float("nan"),)], [(float("nan"),)])
    assert execution_match([(dt.date(2021, 1, 2),)], [(dt.date(2021, 1, 2),)])
    assert not execution_match([(dt.date(2021, 1, 2),)], [(dt.date(2021, 1, 3),)])
    assert execution_match([([1, Decimal("2.0")],)], [([1.0, 2.0],)])
    assert execution_match([({"a": 1},)], [({"a": 1.0},)])


def test_column_permutation_is_accepted_only_in_perm_mode():
    pred, gold = [(1, "a"), (2, "b")], [("a", 1), ("b", 2)]
    assert execution_match(pred, gold, column_mode="perm")
    assert not execution_match(pred, gold, column_mode="strict")


def test_permutation_must_keep_rows_together():
    pred = [(1, "b"), (2, "a")]
    gold = [("a", 1), ("b", 2)]
    assert not execution_match(pred, gold, column_mode="perm")


def test_column_count_must_agree():
    assert not execution_match([(1, 2)], [(1,)], column_mode="perm")
    assert not execution_match([(1,)], [(1, 2)], column_mode="perm")


def test_two_empty_results_match():
    assert execution_match([], [])
    assert not execution_match([(1,)], [])


def test_partial_credit_measures_overlap():
    gold = [(1, "a"), (2, "b"), (3, "c"), (4, "d")]
    assert row_overlap(gold, gold) == 1.0
    assert row_overlap(gold[:2], gold) == pytest.approx(2 * 1.0 * 0.5 / 1.5)
    assert row_overlap([(1,)], gold) == 0.0
    assert column_overlap([(1,), (2,), (3,), (4,)], gold) == 0.5
    assert column_overlap([(9, "z")], gold) == 0.0
