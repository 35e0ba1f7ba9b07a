"""The frozen held-out split: unchanged since it was frozen, every gold answerable on both copies
of its database, a lucky answer failing on the second copy, no study able to read it, and an
edit refused."""

from __future__ import annotations

import shutil

import duckdb
import pytest

from rewards import score
from sqltasks import load_corpus
from sqltasks.holdout import split as holdout


def test_the_split_is_the_one_frozen_and_every_question_has_two_copies():
    assert holdout.content_hash() == holdout.frozen_hash()
    tasks = holdout.load_holdout()
    assert len(tasks) == 30 and len({t.id for t in tasks}) == 30
    assert {t.domain for t in tasks} == {"library", "clinic"}
    assert all(len(t.setups) == 2 and t.setups[0] != t.setups[1] for t in tasks)
    assert {t.tier for t in tasks} == {"filter", "aggregate", "group_having", "join",
                                       "subquery", "window"}


def test_every_gold_runs_on_both_copies_and_answers_on_the_first():
    for task in holdout.load_holdout():
        results = []
        for setup in task.setups:
            con = duckdb.connect()
            con.execute(setup)
            results.append(con.execute(task.gold_sql).fetchall())
        assert results[0], task.id  # the prompt's copy always has an answer
        # the second copy answers otherwise wherever the answer is one number or one name
        if len(results[0]) == 1 and len(results[0][0]) == 1:
            assert results[0] != results[1], task.id


def test_the_gold_scores_and_a_number_read_off_the_first_copy_fails():
    tasks = {t.question: t for t in holdout.load_holdout()}
    count = tasks["How many books are in the catalogue?"]
    assert score(count.gold_sql, count).correct
    assert score("SELECT COUNT(*) FROM Books", count).correct
    assert not score("SELECT 11", count).correct  # right on the first copy only


def test_no_study_or_corpus_loader_serves_it():
    with pytest.raises(ValueError, match="unknown split"):
        load_corpus("holdout")


def test_an_edited_split_is_refused(tmp_path, monkeypatch):
    copy = tmp_path / "holdout"
    shutil.copytree(holdout.HERE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(holdout, "HERE", copy)
    monkeypatch.setattr(holdout, "FROZEN", copy / "FROZEN")
    holdout.load_holdout.cache_clear()
    try:
        assert len(holdout.load_holdout()) == 30  # an unchanged copy loads
        holdout.load_holdout.cache_clear()
        questions = copy / "clinic.yaml"
        questions.write_text(questions.read_text().replace("Which pets are cats?",
                                                           "Which pets are dogs?"))
        with pytest.raises(holdout.SplitChanged, match="changed since they were frozen"):
            holdout.load_holdout()
    finally:
        holdout.load_holdout.cache_clear()
