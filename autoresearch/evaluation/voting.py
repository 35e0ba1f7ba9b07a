"""Execution-based self-consistency: answer with the result most sampled queries agree on.

A small model's single greedy query often fails on a schema it has not seen (a guessed column
name, a wrong join) while some of its sampled queries run and agree. The rule, as in
MBR-exec (Shi et al., 2022) and the self-consistency decoding that SLM-SQL's figures use:

    1. keep the candidates that ran on the question's database;
    2. prefer those with a non-empty answer, when any has one (an empty result is most often a
       filter on a value that does not occur);
    3. group them by their answer (`ScoreResult.answer`, rows in any order) and take the
       largest group, ties going to the group of the earliest candidate (the greedy query comes
       first, so it wins every tie);
    4. when nothing ran, answer with the first candidate.

It reads only what a user has at inference: the candidates and what they return on their own
database. The gold result never enters the choice. Step 2 helps wherever golds always answer
something (the corpora and the transfer split guarantee it), which a user's questions need not;
`prefer_non_empty=False` leaves it out, and evaluation reports the vote both ways.
"""

from __future__ import annotations

from collections.abc import Sequence

from rewards import ScoreResult


def vote(candidates: Sequence[ScoreResult], prefer_non_empty: bool = True) -> int:
    """The index of the candidate to answer with (see the module's rule; without step 2 when
    `prefer_non_empty` is False)."""
    if not candidates:
        raise ValueError("vote needs at least one candidate")
    ran = [i for i, c in enumerate(candidates) if c.answer is not None]
    if not ran:
        return 0
    non_empty = [i for i in ran if candidates[i].answer_rows > 0] if prefer_non_empty else []
    pool = non_empty or ran
    groups: dict[str, list[int]] = {}
    for i in pool:
        groups.setdefault(candidates[i].answer, []).append(i)  # type: ignore[arg-type]
    best = max(groups.values(), key=lambda members: (len(members), -members[0]))
    return best[0]
