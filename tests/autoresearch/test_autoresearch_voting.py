"""Execution-based self-consistency: the rule that picks an answer from a question's candidates
by what they return, and evaluation that answers with it while keeping the greedy figures."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from autoresearch.evaluation.evaluate import evaluate
from autoresearch.evaluation.voting import vote
from rewards import RewardConfig, RewardPool, ScoreResult, Task
from rewards.components import Components


def _ran(answer: str | None, rows: int = 1, correct: bool = False) -> ScoreResult:
    return ScoreResult(float(correct), Components(executes=float(answer is not None)), correct,
                       "ok" if answer is not None else "error", answer=answer, answer_rows=rows)


def test_the_answer_most_candidates_return_wins():
    assert vote([_ran("a"), _ran("b"), _ran("b"), _ran(None), _ran("b"), _ran("a")]) == 1


def test_ties_go_to_the_earliest_candidate_so_the_greedy_query_wins_them():
    assert vote([_ran("a"), _ran("b"), _ran("b"), _ran("a")]) == 0
    assert vote([_ran(None), _ran("c"), _ran("d"), _ran("d"), _ran("c")]) == 1


def test_queries_that_did_not_run_never_win_and_nothing_running_means_greedy():
    assert vote([_ran(None), _ran(None), _ran(None), _ran("x")]) == 3
    assert vote([_ran(None), _ran(None)]) == 0


def test_a_non_empty_answer_beats_more_empty_ones():
    assert vote([_ran("empty", rows=0), _ran("empty", rows=0), _ran("x")]) == 2
    assert vote([_ran("empty", rows=0), _ran("empty", rows=0)]) == 0


def test_without_the_preference_the_largest_group_wins_even_when_empty():
    candidates = [_ran("empty", rows=0), _ran("empty", rows=0), _ran("x")]
    assert vote(candidates, prefer_non_empty=False) == 0
    assert vote([_ran("a"), _ran("b"), _ran("b")], prefer_non_empty=False) == 1


def test_the_gold_never_enters_the_choice():
    right_once = [_ran("a"), _ran("a"), _ran("b", correct=True)]
    assert vote(right_once) == 0
    with pytest.raises(ValueError):
        vote([])


SETUP = """CREATE TABLE pets (id INTEGER PRIMARY KEY, name VARCHAR, kind VARCHAR);
INSERT INTO pets VALUES (1, 'Rex', 'dog'), (2, 'Tom', 'cat'), (3, 'Fido', 'dog');"""
GOLD = "SELECT name FROM pets WHERE kind = 'dog'"


@dataclass
class _Sequence:
    tokens: list[int]


class _Future:
    def __init__(self, sequences):
        self.sequences = sequences

    def result(self):
        return self


class _Tokenizer:
    """Token i decodes to the i-th query in `texts`."""

    def __init__(self, texts: list[str]):
        self.texts = texts

    def encode(self, _text: str) -> list[int]:
        return [0]

    def decode(self, tokens: list[int]) -> str:
        return self.texts[tokens[0]]


class _Sampler:
    """Greedy returns the first query; sampling returns the rest, in order."""

    def __init__(self):
        self.calls = []

    def sample(self, _prompt, num_samples, sampling_params):
        self.calls.append((num_samples, sampling_params.temperature))
        if sampling_params.temperature == 0:
            return _Future([_Sequence([0])])
        return _Future([_Sequence([i + 1]) for i in range(num_samples)])


def test_evaluation_answers_by_vote_and_keeps_the_greedy_figures_beside_it():
    texts = ["SELECT nam FROM pets",  # greedy: a guessed column, does not run
             GOLD, "SELECT name FROM pets WHERE kind <> 'cat' ORDER BY id",
             "SELECT name FROM pets"]
    task = Task(setup_sql=SETUP, question="Which pets are dogs?", gold_sql=GOLD, id="t1")
    sampler = _Sampler()
    with RewardPool(workers=1) as pool:
        voted = evaluate(sampler, _Tokenizer(texts), [task], "dev", pool,
                         RewardConfig(extract=False), vote=3, vote_temperature=0.7)
        greedy = evaluate(_Sampler(), _Tokenizer(texts), [task], "dev", pool,
                          RewardConfig(extract=False))
    assert sampler.calls == [(1, 0.0), (3, 0.7)]
    assert voted.verdicts == {"t1": True} and voted.execute_rate == 1.0
    d = voted.decoding
    assert (d["mode"], d["candidates"], d["greedy_correct"], d["chose_greedy"]) == \
        ("vote", 4, 0, 0)
    assert d["greedy_verdicts"] == {"t1": False} and d["greedy_execute_rate"] == 0.0
    assert d["any_correct"] == 1
    # the vote without its preference for non-empty answers is reported beside it
    assert (d["any_answer_vote_correct"], d["any_answer_vote_execute_rate"]) == (1, 1.0)
    assert greedy.verdicts == {"t1": False} and greedy.decoding == {"mode": "greedy"}


def test_evaluation_with_snapped_names_keeps_the_queries_as_written_beside_it():
    texts = ["SELECT nam FROM pet WHERE kind = 'dog'",  # greedy: guessed names, right intent
             "SELECT name FROM pets"]
    task = Task(setup_sql=SETUP, question="Which pets are dogs?", gold_sql=GOLD, id="t1")
    with RewardPool(workers=1) as pool:
        snapped = evaluate(_Sampler(), _Tokenizer(texts), [task], "dev", pool,
                           RewardConfig(extract=False), snap_names=True)
        both = evaluate(_Sampler(), _Tokenizer(texts), [task], "dev", pool,
                        RewardConfig(extract=False), vote=1, snap_names=True)
    assert snapped.verdicts == {"t1": True} and snapped.execute_rate == 1.0
    d = snapped.decoding
    assert (d["mode"], d["snap_names"], d["snapped"]) == ("greedy", True, 1)
    assert (d["written_correct"], d["written_execute_rate"]) == (0, 0.0)
    assert d["written_verdicts"] == {"t1": False}
    assert snapped.samples[0]["written"] == texts[0]
    # The vote runs on snapped candidates too: the greedy one is now right and keeps its tie.
    assert both.verdicts == {"t1": True} and both.decoding["chose_greedy"] == 1
    assert both.decoding["greedy_correct"] == 1 and both.decoding["written_correct"] == 0


def test_evaluation_with_snapped_values_repairs_a_strings_case_and_says_so():
    texts = ["SELECT nam FROM pets WHERE kind = 'Dog'"]  # a guessed name and a value's case
    task = Task(setup_sql=SETUP, question="Which pets are dogs?", gold_sql=GOLD, id="t1")
    with RewardPool(workers=1) as pool:
        values = evaluate(_Sampler(), _Tokenizer(texts), [task], "dev", pool,
                          RewardConfig(extract=False), snap_values=True)
        both = evaluate(_Sampler(), _Tokenizer(texts), [task], "dev", pool,
                        RewardConfig(extract=False), snap_names=True, snap_values=True)
    # The value alone is repaired; the guessed column still fails the query.
    assert values.verdicts == {"t1": False} and values.decoding["snap_values"] is True
    assert "snap_names" not in values.decoding and values.decoding["snapped"] == 1
    assert both.verdicts == {"t1": True} and both.decoding["snapped"] == 1
    assert both.decoding["written_verdicts"] == {"t1": False}


def test_the_vote_is_reported_without_its_preference_for_non_empty_answers():
    """Two empty answers agree, one sampled query returns the gold's rows: the vote as shipped
    answers with the non-empty one; without that preference the empty majority wins."""
    texts = ["SELECT name FROM pets WHERE kind = 'bird'",
             "SELECT name FROM pets WHERE kind = 'fish'", GOLD]
    task = Task(setup_sql=SETUP, question="Which pets are dogs?", gold_sql=GOLD, id="t1")
    with RewardPool(workers=1) as pool:
        voted = evaluate(_Sampler(), _Tokenizer(texts), [task], "dev", pool,
                         RewardConfig(extract=False), vote=2, vote_temperature=0.7)
    assert voted.verdicts == {"t1": True}
    assert voted.decoding["any_answer_vote_correct"] == 0
