"""Execution match: the comparator that decides whether two query results are the same answer.

Definition (versioned as `COMPARATOR_VERSION`):
- Values are canonicalised: Decimal and int become float, bool stays distinct from numbers,
  dates and times become ISO strings, NaN equals NaN, None equals only None, nested lists and
  structs compare element-wise.
- Floats match within `rel_tol`/`abs_tol`.
- Rows are compared as multisets (duplicates count) unless `ordered`, then as sequences.
- In `perm` mode any permutation of the predicted columns may match the gold's columns; the
  number of columns must be equal in both modes.

Partial-credit measures (column and row overlap) live here too, so that the same canonical
values back every number a reward reports.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import itertools
import math
import uuid
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

COMPARATOR_VERSION = "1"

Row = tuple[Any, ...]
_MAX_PERMUTATIONS = 5000
_NAN = ("nan",)


def canonical(value: Any) -> Any:
    """A comparable, hashable form of one DuckDB value."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, int | Decimal):
        value = float(value)
    if isinstance(value, float):
        return _NAN if math.isnan(value) else value
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return ("interval", value.total_seconds())
    if isinstance(value, bytes | bytearray | memoryview):
        return ("bytes", bytes(value).hex())
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, dict):
        return ("struct", tuple((str(k), canonical(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return ("list", tuple(canonical(v) for v in value))
    return ("other", str(value))


def canonical_rows(rows: Sequence[Sequence[Any]]) -> list[Row]:
    return [tuple(canonical(v) for v in row) for row in rows]


def values_match(a: Any, b: Any, rel_tol: float = 1e-6, abs_tol: float = 1e-6) -> bool:
    """Equality of two canonical values with float tolerance."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(
            values_match(x, y, rel_tol, abs_tol) for x, y in zip(a, b, strict=False)
        )
    return type(a) is type(b) and a == b


def _sort_key(value: Any) -> tuple[int, Any]:
    """Total order over canonical values of mixed types (None first, then by type)."""
    if value is None:
        return (0, 0)
    if isinstance(value, float):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    return (3, repr(value))


def _row_key(row: Row) -> tuple[tuple[int, Any], ...]:
    return tuple(_sort_key(v) for v in row)


def _rows_match(a: Row, b: Row, rel_tol: float, abs_tol: float) -> bool:
    return len(a) == len(b) and all(
        values_match(x, y, rel_tol, abs_tol) for x, y in zip(a, b, strict=False)
    )


def _multiset_match(pred: list[Row], gold: list[Row], rel_tol: float, abs_tol: float) -> bool:
    """Bag equality with tolerance: sort and pair, then fall back to greedy pairing."""
    if len(pred) != len(gold):
        return False
    pred_sorted = sorted(pred, key=_row_key)
    gold_sorted = sorted(gold, key=_row_key)
    pairs = zip(pred_sorted, gold_sorted, strict=True)
    if all(_rows_match(p, g, rel_tol, abs_tol) for p, g in pairs):
        return True
    if not any(isinstance(v, float) for row in gold for v in row):
        return False
    unused = list(pred_sorted)
    for g in gold_sorted:
        for i, p in enumerate(unused):
            if _rows_match(p, g, rel_tol, abs_tol):
                del unused[i]
                break
        else:
            return False
    return True


def _rows_equal(pred: list[Row], gold: list[Row], ordered: bool, rel_tol: float, abs_tol: float):
    if ordered:
        return len(pred) == len(gold) and all(
            _rows_match(p, g, rel_tol, abs_tol) for p, g in zip(pred, gold, strict=False)
        )
    return _multiset_match(pred, gold, rel_tol, abs_tol)


def _column_candidates(pred: list[Row], gold: list[Row], rel_tol: float, abs_tol: float):
    """For each gold column, the predicted columns holding the same multiset of values."""
    width = len(gold[0])
    pred_cols = [[(v,) for v in col] for col in zip(*pred, strict=False)]
    gold_cols = [[(v,) for v in col] for col in zip(*gold, strict=False)]
    return [
        [j for j in range(width) if _multiset_match(pred_cols[j], gold_cols[i], rel_tol, abs_tol)]
        for i in range(width)
    ]


def execution_match(
    pred_rows: Sequence[Sequence[Any]],
    gold_rows: Sequence[Sequence[Any]],
    *,
    ordered: bool = False,
    column_mode: str = "strict",
    rel_tol: float = 1e-6,
    abs_tol: float = 1e-6,
) -> bool:
    """Whether a prediction's rows are the same answer as the gold's (see module docstring)."""
    pred = canonical_rows(pred_rows)
    gold = canonical_rows(gold_rows)
    if len(pred) != len(gold):
        return False
    if not gold:
        return True
    if len(pred[0]) != len(gold[0]):
        return False
    if _rows_equal(pred, gold, ordered, rel_tol, abs_tol):
        return True
    if column_mode != "perm" or len(gold[0]) < 2:
        return False
    candidates = _column_candidates(pred, gold, rel_tol, abs_tol)
    if any(not c for c in candidates):
        return False
    tried = 0
    for perm in itertools.product(*candidates):
        if len(set(perm)) != len(perm):
            continue
        tried += 1
        if tried > _MAX_PERMUTATIONS:
            return False
        permuted = [tuple(row[j] for j in perm) for row in pred]
        if _rows_equal(permuted, gold, ordered, rel_tol, abs_tol):
            return True
    return False


def _bag(rows: list[Row], digits: int = 6) -> Counter:
    """A hashable multiset of rows, floats rounded, for overlap measures."""
    def fix(v: Any) -> Any:
        return round(v, digits) if isinstance(v, float) else v
    return Counter(tuple(fix(v) for v in row) for row in rows)


def answer_digest(rows: Sequence[Sequence[Any]]) -> str:
    """A short fingerprint of a result as an answer: two results share it when they hold the
    same rows in any order, floats equal to 6 digits. Lets predictions be compared with each
    other (voting) without a gold result."""
    bag = sorted(_bag(canonical_rows(rows)).items(), key=lambda item: (_row_key(item[0]), item[1]))
    return hashlib.sha1(repr(bag).encode()).hexdigest()[:16]


def row_overlap(pred_rows: Sequence[Sequence[Any]], gold_rows: Sequence[Sequence[Any]]) -> float:
    """F1 of the row multisets (0 when the widths differ); a dense signal, not a verdict."""
    pred, gold = canonical_rows(pred_rows), canonical_rows(gold_rows)
    if not pred or not gold or len(pred[0]) != len(gold[0]):
        return 0.0
    return _bag_f1(_bag(pred), _bag(gold))


def column_overlap(
    pred_rows: Sequence[Sequence[Any]], gold_rows: Sequence[Sequence[Any]]
) -> float:
    """Share of columns that some predicted column reproduces exactly, over the wider result."""
    pred, gold = canonical_rows(pred_rows), canonical_rows(gold_rows)
    if not pred or not gold:
        return 0.0
    pred_cols = [_bag([(v,) for v in col]) for col in zip(*pred, strict=False)]
    gold_cols = [_bag([(v,) for v in col]) for col in zip(*gold, strict=False)]
    unused = list(range(len(pred_cols)))
    matched = 0
    for gold_col in gold_cols:
        for j in unused:
            if pred_cols[j] == gold_col:
                unused.remove(j)
                matched += 1
                break
    return matched / max(len(pred_cols), len(gold_cols))


def _bag_f1(pred: Counter, gold: Counter) -> float:
    """F1 of two multisets (duplicates count)."""
    common = sum((pred & gold).values())
    if common == 0:
        return 0.0
    precision, recall = common / sum(pred.values()), common / sum(gold.values())
    return 2 * precision * recall / (precision + recall)


def result_overlap(
    pred_rows: Sequence[Sequence[Any]], gold_rows: Sequence[Sequence[Any]]
) -> float:
    """Partial credit for a wrong result that is close to the gold's, which a broad query
    cannot earn.

    Each gold column is paired with the predicted column whose values overlap it most (F1 of
    the two value multisets, greedily, one to one). Credit is the F1 of the columns (paired
    ones over predicted and over gold columns: extra columns cost precision) times the F1 of
    the rows projected onto the paired columns (extra rows cost precision, missing rows
    recall). `SELECT *` pays for every column the gold did not ask for, a query returning every
    row pays for every row the gold filtered out, and an answer with no value in common with
    the gold's earns nothing. In [0, 1]; 1 only for the same rows and columns."""
    pred, gold = canonical_rows(pred_rows), canonical_rows(gold_rows)
    if not pred or not gold:
        return 0.0
    pred_cols = [_bag([(v,) for v in col]) for col in zip(*pred, strict=False)]
    gold_cols = [_bag([(v,) for v in col]) for col in zip(*gold, strict=False)]
    scored = sorted(
        ((_bag_f1(p, g), i, j)
         for i, g in enumerate(gold_cols) for j, p in enumerate(pred_cols)),
        key=lambda item: (-item[0], item[1], item[2]),
    )
    pairs: dict[int, int] = {}
    used: set[int] = set()
    for similarity, i, j in scored:
        if similarity <= 0:
            break
        if i in pairs or j in used:
            continue
        pairs[i] = j
        used.add(j)
    if not pairs:
        return 0.0
    order = sorted(pairs)
    col_precision, col_recall = len(pairs) / len(pred_cols), len(pairs) / len(gold_cols)
    col_f1 = 2 * col_precision * col_recall / (col_precision + col_recall)
    pred_bag = _bag([tuple(row[pairs[i]] for i in order) for row in pred])
    gold_bag = _bag([tuple(row[i] for i in order) for row in gold])
    return col_f1 * _bag_f1(pred_bag, gold_bag)
