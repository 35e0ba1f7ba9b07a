"""Fixtures for the training-server tests.

A tiny random Gemma 3 (`tiny_model_dir`) stands in for the real model so protocol tests run in
seconds; it is saved with `save_pretrained` and the server loads it through the normal
`from_pretrained` path. Servers run in-process (`ServerThread`) on a free port with their own
data directory, and every test talks to them through the real `tinker` SDK.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.server_helpers import API_KEY, build_tiny_model, start_redis, start_server

os.environ["TINKER_TELEMETRY"] = "0"


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A throwaway `redis-server` for one test module (its keys never meet another module's)."""
    process, url = start_redis(tmp_path_factory.mktemp("redis"))
    yield url
    process.terminate()
    process.wait(timeout=30)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-gemma3"))


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path):
    """The tiny model's engine on the CPU in float32, one per test module (a module that needs
    another device or dtype defines its own)."""
    from server.engine.engine import Engine
    from server.engine.model_loading import load_base_model

    return Engine(load_base_model(str(tiny_model_dir), device="cpu", dtype="float32"))


@pytest.fixture(scope="session")
def base_model(tiny_model_dir: Path) -> str:
    """The name the server reports for a local model: its directory path."""
    return str(tiny_model_dir)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def reference_model(tiny_model_dir: Path):
    """The tiny model loaded by plain transformers, as an independent reference."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.eval()
    return model


@pytest.fixture(scope="session")
def tiny_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """The shared server (fusion on, no API keys) on the tiny model."""
    server = start_server(tiny_model_dir, tmp_path_factory.mktemp("server-data"))
    yield server
    server.stop()


@pytest.fixture
def service_client(tiny_server) -> Iterator:
    import tinker

    with tinker.ServiceClient(base_url=tiny_server.url, api_key=API_KEY) as client:
        yield client


@pytest.fixture(scope="session")
def sequences(tiny_tokenizer) -> list[list[int]]:
    """A few fixed token sequences of different lengths (some past the sliding window)."""
    texts = [
        "select name from users where id = 1;",
        "hello world, hello server",
        "SELECT a, b FROM t JOIN u ON t.id = u.id WHERE b > 10 ORDER BY a; the quick brown fox",
    ]
    return [tiny_tokenizer.encode(t) for t in texts]
