"""Fixtures for trial tests: a tiny random model that knows the corpus's prompt alphabet."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.server_helpers import build_tiny_model, start_server

os.environ["TINKER_TELEMETRY"] = "0"


@pytest.fixture(scope="session")
def sql_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Gemma 3 whose tokenizer was trained on rendered prompts and gold SQL."""
    from sqltasks import load_corpus, render_prompt

    tasks = load_corpus("train")[:80] + load_corpus("dev")[:20] + load_corpus("test")[:20]
    corpus = [render_prompt(t) + t.gold_sql + "\n```" for t in tasks]
    return build_tiny_model(
        tmp_path_factory.mktemp("tiny-sql-gemma3"), corpus=corpus, max_position_embeddings=2048
    )


@pytest.fixture(scope="session")
def sql_server(sql_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    server = start_server(sql_model_dir, tmp_path_factory.mktemp("trial-server-data"))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def reward_pool() -> Iterator:
    from rewards import RewardPool

    with RewardPool(workers=2) as pool:
        yield pool
