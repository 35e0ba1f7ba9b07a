"""A cached warm-up or trial is reused only under the code and environment that computed it.

The scope a cache key includes changes with any source or data file of the code that computes
the numbers, with a kernel package's version, the CPU's model, instruction sets or cores, and a
named server's dtype or device; it stays the same when nothing of that changes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from autoresearch.study import cache_scope
from autoresearch.study.warmup import cache_key


@pytest.fixture
def fake_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A code package under a temporary root, standing in for the engine's sources."""
    root = tmp_path / "engine"
    root.mkdir()
    (root / "attention.py").write_text("BLOCK = 64\n")
    (root / "corpus.jsonl").write_text('{"q": 1}\n')
    monkeypatch.setattr(cache_scope, "_package_root",
                        lambda name: root if name == "fake.engine" else None)
    cache_scope.code_digest.cache_clear()
    yield root
    cache_scope.code_digest.cache_clear()


def test_the_code_digest_follows_every_source_and_data_file(fake_code: Path):
    before = cache_scope.code_digest(("fake.engine",))
    cache_scope.code_digest.cache_clear()
    assert cache_scope.code_digest(("fake.engine",)) == before  # nothing changed
    (fake_code / "attention.py").write_text("BLOCK = 128\n")
    cache_scope.code_digest.cache_clear()
    edited = cache_scope.code_digest(("fake.engine",))
    assert edited != before
    (fake_code / "corpus.jsonl").write_text('{"q": 2}\n')
    cache_scope.code_digest.cache_clear()
    data_edited = cache_scope.code_digest(("fake.engine",))
    assert data_edited not in (before, edited)
    (fake_code / "__pycache__").mkdir()  # compiled files are not the code
    (fake_code / "__pycache__" / "attention.cpython-311.pyc").write_bytes(b"\0")
    cache_scope.code_digest.cache_clear()
    assert cache_scope.code_digest(("fake.engine",)) == data_edited


def test_the_real_code_digest_covers_the_engine_rewards_and_corpus():
    roots = {name: cache_scope._package_root(name) for name in cache_scope.NUMBER_CODE}
    assert all(root is not None and root.is_dir() for root in roots.values()), roots
    assert (roots["server.engine"] / "invariant_attention.py").exists()
    for layer in ("server.service", "server.scheduling", "server.entrypoints"):
        assert layer in roots  # what reaches the engine, and how the embedded server starts


def test_the_embedded_facts_are_this_machines():
    facts = cache_scope.embedded_facts()
    assert facts["device"] == "cpu" and facts["dtype"] in ("float32", "bfloat16")
    assert facts["threads"] >= 1 and isinstance(facts["switches"], dict)


def _scope(monkeypatch: pytest.MonkeyPatch, *, flags=("avx2",), cores=2, torch="2.13.0",
           server: dict | None = None, embedded: dict | None = None) -> str:
    monkeypatch.setattr(cache_scope, "cpu_facts", lambda: {
        "model": "Some CPU", "flags": list(flags), "cores": cores, "machine": "x86_64"})
    here = {"device": "cpu", "dtype": "float32", "threads": 2, "switches": {}}
    monkeypatch.setattr(cache_scope, "embedded_facts", lambda: {**here, **(embedded or {})})
    monkeypatch.setattr(cache_scope, "_versions", lambda: {"torch": torch, "duckdb": "1.0"})
    monkeypatch.setattr(cache_scope, "server_facts", lambda url, key: dict(server or {}))
    url = "http://server:8000" if server is not None else None
    return cache_scope.numbers_scope("place", url, "tml-key")


def test_the_scope_changes_with_what_changes_the_numbers(monkeypatch: pytest.MonkeyPatch):
    base = _scope(monkeypatch)
    assert _scope(monkeypatch) == base
    changed = {
        "bf16 instructions": _scope(monkeypatch, flags=("avx2", "avx512_bf16")),
        "cores": _scope(monkeypatch, cores=16),
        "torch": _scope(monkeypatch, torch="2.14.1"),
        "a named server": _scope(monkeypatch, server={"dtype": "float32"}),
        "the embedded server on a GPU": _scope(monkeypatch, embedded={"device": "cuda"}),
        "the embedded server in bf16": _scope(monkeypatch, embedded={"dtype": "bfloat16"}),
        "the embedded server's threads": _scope(monkeypatch, embedded={"threads": 1}),
        "an engine switch": _scope(monkeypatch, embedded={
            "switches": {"AUTORESEARCH_BATCH_INVARIANT": "0"}}),
    }
    assert len(set(changed.values()) | {base}) == len(changed) + 1, changed
    bf16 = _scope(monkeypatch, server={"dtype": "bfloat16", "device": "cuda"})
    assert bf16 != changed["a named server"]


def test_a_warmup_key_differs_between_scopes(monkeypatch: pytest.MonkeyPatch):
    from autoresearch.rl.config import TrialConfig

    config = TrialConfig()
    assert cache_key(config, _scope(monkeypatch)) == cache_key(config, _scope(monkeypatch))
    assert cache_key(config, _scope(monkeypatch)) != cache_key(
        config, _scope(monkeypatch, torch="9.9"))
