"""Partial credit that a wrong query cannot game: `result_overlap` ranks near misses above far
ones and charges a broad answer for every column and row the gold did not ask for; degenerate
answers on corpus tasks (`SELECT *`, `COUNT(*)` and every single column of every table, an
empty completion, a copy of the schema) earn at most a fifth of a correct answer's reward, an
eighth on average."""

from __future__ import annotations

import duckdb
import pytest

from rewards import RewardConfig, RewardPool, RewardWeights
from rewards.compare import result_overlap
from sqltasks import load_corpus

GOLD = [("Ava", 10.0), ("Bo", 5.5), ("Cy", 7.25)]


@pytest.mark.parametrize(("pred", "low", "high"), [
    (GOLD, 1.0, 1.0),
    ([(r[1], r[0]) for r in GOLD], 1.0, 1.0),                # columns swapped: same answer
    (GOLD[:2], 0.79, 0.81),                                  # one row missing: F1 0.8
    ([(r[0],) for r in GOLD], 0.66, 0.67),                   # one of two columns: F1 2/3
    ([(*r, i, "x") for i, r in enumerate(GOLD)], 0.66, 0.67),  # two extra columns
    ([(f"n{i}", 100.0 + i) for i in range(40)], 0.0, 0.0),    # nothing in common
    ([("Ava", 10.0, i, i * 2.0, "a", "b") for i in range(30)] + GOLD, 0.0, 0.2),  # everything
])
def test_overlap_pays_for_closeness_and_charges_for_breadth(pred, low, high):
    assert low <= result_overlap(pred, GOLD) <= high


def test_overlap_of_an_empty_result_is_zero():
    assert result_overlap([], GOLD) == 0.0 and result_overlap(GOLD, []) == 0.0


def _columns(setup_sql: str) -> dict[str, list[str]]:
    """Every table of a task's database and its columns."""
    with duckdb.connect() as db:
        db.execute(setup_sql)
        rows = db.execute("SELECT table_name, column_name FROM information_schema.columns "
                          "ORDER BY table_name, ordinal_position").fetchall()
    out: dict[str, list[str]] = {}
    for table, column in rows:
        out.setdefault(table, []).append(column)
    return out


def test_degenerate_answers_earn_a_small_fixed_share_of_a_right_one():
    """Under the partial credit docs/rl.md describes (`overlap` 0.3 beside `result` 1)."""
    scoring = RewardConfig(weights=RewardWeights(result=1.0, executes=0.0, overlap=0.3),
                           extract=False)
    tasks = load_corpus("train", corpus="multitable")[:300:10]
    shares: list[float] = []
    with RewardPool(workers=2) as pool:
        for task in tasks:
            correct = pool.score(task.gold_sql, task, scoring)
            assert correct.correct
            degenerate = [task.setup_sql.split(";")[0] + ";"]
            for table, columns in _columns(task.setup_sql).items():
                degenerate += [f'SELECT * FROM "{table}"', f'SELECT COUNT(*) FROM "{table}"']
                degenerate += [f'SELECT "{c}" FROM "{table}"' for c in columns]
            best = max(pool.score(sql, task, scoring).total for sql in degenerate)
            assert pool.score("", task, scoring).total == 0.0
            shares.append(best / correct.total)
    assert max(shares) <= 0.2, f"a degenerate answer earned {max(shares):.2f} of a correct one"
    assert sum(shares) / len(shares) <= 0.125
