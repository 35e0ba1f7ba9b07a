"""The generated corpus: reproducible from its seed, split by domain, verified, tagged."""

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from rewards import RewardPool
from sqltasks import BLUEPRINTS, TIERS, load_corpus
from sqltasks.generate import corpus_path, generate, read

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def corpus():
    return {split: load_corpus(split) for split in ("train", "dev", "test")}


def test_the_shipped_file_is_what_the_generator_writes_for_its_seed():
    shipped = read(corpus_path(0))
    domains = ["library", "charity"]  # one train and one test domain; each is generated alone
    regenerated = generate(0, domains)
    assert regenerated == [r for r in shipped if r.domain in domains]
    assert corpus_path(0).stat().st_size < 5_000_000


def test_loading_twice_gives_identical_tasks(corpus):
    again = load_corpus("test")
    assert [(t.id, t.setup_sql, t.extra_setups, t.gold_sql) for t in again] == [
        (t.id, t.setup_sql, t.extra_setups, t.gold_sql) for t in corpus["test"]
    ]


def test_splits_are_disjoint_by_domain_and_large_enough(corpus):
    domains = {split: {t.domain for t in tasks} for split, tasks in corpus.items()}
    assert not domains["train"] & domains["dev"]
    assert not domains["train"] & domains["test"]
    assert not domains["dev"] & domains["test"]
    assert len(BLUEPRINTS) >= 20
    assert len(corpus["train"]) >= 1000 and len(corpus["test"]) >= 200
    for tasks in corpus.values():
        assert set(Counter(t.tier for t in tasks)) == set(TIERS)


def test_every_task_is_tagged_and_has_independent_copies(corpus):
    tasks = [t for split in corpus.values() for t in split]
    assert len({t.id for t in tasks}) == len(tasks)
    for t in tasks:
        assert t.domain and t.tier in TIERS and t.split in ("train", "dev", "test")
        assert len(t.extra_setups) == 2 and len(set(t.setups)) == 3
        assert t.meta["near_misses"]


def test_tier_and_split_filters(corpus):
    windows = load_corpus("dev", tiers=["window"])
    assert windows and all(t.tier == "window" and t.split == "dev" for t in windows)
    assert len(load_corpus("all")) == sum(len(v) for v in corpus.values())
    with pytest.raises(ValueError):
        load_corpus("validation")


def test_golds_are_correct_and_near_misses_are_not(corpus):
    sample = {}
    for task in corpus["test"] + corpus["dev"][:0]:
        sample.setdefault(task.meta["template"], task)
    pairs = [(t.gold_sql, t) for t in sample.values()]
    pairs += [(miss, t) for t in sample.values() for miss in t.meta["near_misses"]]
    with RewardPool(workers=2) as pool:
        results = pool.score_many(pairs)
    golds, misses = results[: len(sample)], results[len(sample):]
    assert all(r.correct for r in golds), [r for r in golds if not r.correct]
    assert not any(r.correct for r in misses)


def test_import_datasets_is_never_shadowed_by_the_data_directory():
    assert not (REPO / "datasets" / "__init__.py").exists()
    spec = importlib.util.find_spec("datasets")
    if spec is not None and spec.origin is not None:  # Hugging Face's package is installed
        assert not Path(spec.origin).resolve().is_relative_to(REPO / "datasets")
