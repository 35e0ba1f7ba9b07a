"""Shared prompt prefixes: datums that start with the same tokens are packed into one row.

GRPO sends a group's samples as separate datums with one identical prompt. Packing puts that
prompt once at the start of a row, followed by every sample's continuation. An attention mask
lets each continuation see the prompt and itself only, and position ids restart after the
prompt for every continuation, so each continuation computes exactly what it would alone, while
the prompt's activations are computed once and, in backward, receive the sum of every
continuation's gradient. Who may attend to whom is said by each column's segment and position
(`packed_attention.PackedLayout`); Gemma 3's sliding-window layers measure their window in
positions, not in packed columns.

Pure planning on token arrays; the engine runs the model.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

MIN_SHARED_TOKENS = 8
"""Datums share a row only if they share at least this many leading tokens: below that the
packed row's wider attention costs more than the tokens saved."""
ROW_TOKENS = 8192
"""Longest packed row (unless one datum alone is longer; the engine also caps it at its
micro-batch). `packed_attention` never computes the pairs between different continuations and
its memory grows linearly with the row, so a long prompt shared by many samples stays on one
row rather than being repeated on rows of its own."""
SLIDING = "sliding_attention"


@dataclass
class PackedRow:
    """One model row: a shared prefix, then each member's own continuation."""

    key: Hashable
    tokens: np.ndarray
    positions: np.ndarray
    segments: np.ndarray
    """0 for the shared prefix, m + 1 for member m's continuation."""
    members: list[int]
    """Indices of the datums this row computes."""
    columns: list[np.ndarray]
    """For each member, the packed column of each of its positions."""


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.nonzero(a[:n] != b[:n])[0]
    return int(differ[0]) if len(differ) else n


def _clusters(
    sequences: list[np.ndarray], indices: list[int], min_shared: int
) -> list[tuple[int, list[int]]]:
    """Greedy clusters of datums that share a prefix: `(prefix_length, members)`.

    Sorting puts datums with equal prompts next to each other. A datum joins the current
    cluster when that computes fewer tokens than starting its own: with `n` members and prefix
    `L` shrinking to `l`, joining re-computes `n * (L - l)` tokens and saves `l`.
    """
    ordered = sorted(indices, key=lambda i: tuple(sequences[i].tolist()))
    clusters: list[tuple[int, list[int]]] = []
    for i in ordered:
        if clusters:
            length, members = clusters[-1]
            shared = _common_prefix(sequences[members[0]][:length], sequences[i])
            if shared >= min_shared and len(members) * (length - shared) < shared:
                clusters[-1] = (shared, members + [i])
                continue
        clusters.append((len(sequences[i]), [i]))
    return clusters


def _row(key: Hashable, sequences: list[np.ndarray], length: int, members: list[int]) -> PackedRow:
    prefix = sequences[members[0]][:length]
    tokens, positions, segments = [prefix], [np.arange(length)], [np.zeros(length, np.int64)]
    columns, cursor = [], length
    for m, i in enumerate(members):
        tail = sequences[i][length:]
        tokens.append(tail)
        positions.append(np.arange(length, length + len(tail)))
        segments.append(np.full(len(tail), m + 1, np.int64))
        columns.append(np.concatenate([np.arange(length), np.arange(cursor, cursor + len(tail))]))
        cursor += len(tail)
    return PackedRow(
        key,
        np.concatenate(tokens).astype(np.int64),
        np.concatenate(positions).astype(np.int64),
        np.concatenate(segments),
        list(members),
        columns,
    )


def plan_rows(
    sequences: list[np.ndarray],
    keys: list[Hashable],
    row_tokens: int = ROW_TOKENS,
    min_shared: int = MIN_SHARED_TOKENS,
) -> list[PackedRow]:
    """Pack datums into rows; only datums with equal `keys` (the same adapter) share a row.

    Rows come out grouped by key in first-seen key order, so rows of one adapter are adjacent.
    A cluster too long for one row is split, each part repeating the prefix.
    """
    by_key: dict[Hashable, list[int]] = {}
    for i, key in enumerate(keys):
        by_key.setdefault(key, []).append(i)
    rows: list[PackedRow] = []
    for key, indices in by_key.items():
        for length, members in _clusters(sequences, indices, min_shared):
            part: list[int] = []
            used = length
            for i in members:
                tail = len(sequences[i]) - length
                if part and used + tail > row_tokens:
                    rows.append(_row(key, sequences, length, part))
                    part, used = [], length
                part.append(i)
                used += tail
            rows.append(_row(key, sequences, length, part))
    return rows
