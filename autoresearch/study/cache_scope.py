"""What a cached warm-up or trial was computed with, so that a stale one is never reused.

A cache entry is keyed by its config and by this scope: where it ran (`warmup.server_scope`),
the code that computes its numbers (the engine, the samplers, the rewards, the corpus, the
trial loop and the evaluation, hashed file by file) and the environment that ran it (the CPU
model and the instruction sets that choose kernels, the cores, the packages whose kernels or
parsers run; for the embedded server the device, dtype and thread count it would run with and
the engine's switches; for a named server its model, dtype, device and invariance). A changed
engine, corpus, dtype or CPU gives another scope, so the entry is trained afresh rather than
read.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import platform
from pathlib import Path
from typing import Any

from autoresearch.study.environment import cpu_facts, package_versions, server_facts

NUMBER_CODE = ("server.engine", "server.samplers", "server.service", "server.scheduling",
               "server.protocol", "server.storage", "server.entrypoints", "rewards", "sqltasks",
               "autoresearch.rl", "autoresearch.evaluation")
"""Packages whose code decides a trial's numbers: the engine, and the layers that decide what
reaches it (which requests are fused, how tensors are encoded, how checkpoints load, how the
embedded server is configured)."""
ENGINE_ENV = ("AUTORESEARCH_BATCH_INVARIANT", "AUTORESEARCH_DETERMINISTIC",
              "AUTORESEARCH_SHARE_PREFIXES", "AUTORESEARCH_DEVICE_SAMPLING",
              "AUTORESEARCH_TOKENS_PER_MICROBATCH", "OMP_NUM_THREADS")
"""Environment variables that change an embedded engine's kernels or batching."""
CODE_SUFFIXES = (".py", ".json", ".jsonl", ".sql", ".yaml", ".yml", ".csv", ".txt")
KERNEL_PACKAGES = ("torch", "transformers", "numpy", "duckdb", "sqlglot", "tinker")
"""Packages whose version changes the numbers (kernels, tokenizers, SQL parsing)."""


def _package_root(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _digest_tree(digest: hashlib._Hash, label: str, root: Path) -> None:
    for path in sorted(root.rglob("*")):
        if path.is_file() and path.suffix in CODE_SUFFIXES and "__pycache__" not in path.parts:
            digest.update(f"{label}/{path.relative_to(root).as_posix()}\0".encode())
            digest.update(path.read_bytes())


@functools.cache
def code_digest(packages: tuple[str, ...] = NUMBER_CODE) -> str:
    """A hash of every source and data file of `packages` (a missing package counts as such)."""
    digest = hashlib.sha256()
    for name in packages:
        root = _package_root(name)
        if root is None:
            digest.update(f"{name}: missing\0".encode())
        else:
            _digest_tree(digest, name, root)
    return digest.hexdigest()[:16]


def _versions() -> dict[str, str]:
    return package_versions(KERNEL_PACKAGES)


def environment_facts(server_url: str | None, api_key: str) -> dict[str, Any]:
    """What of the environment a cached result depends on. An embedded server runs on this
    machine (its dtype and kernels follow this CPU); a named server reports its own."""
    cpu = cpu_facts()
    facts: dict[str, Any] = {
        "python": ".".join(platform.python_version_tuple()[:2]),
        "cpu": {"model": cpu["model"], "flags": cpu["flags"], "cores": cpu["cores"]},
        "packages": _versions(),
    }
    if server_url:
        facts["server"] = server_facts(server_url, api_key)
    else:
        facts["embedded"] = embedded_facts()
    return facts


def embedded_facts() -> dict[str, Any]:
    """What an embedded server started here would run on: its device and dtype as the engine
    chooses them, torch's thread count, and the engine's switches set in the environment."""
    import os

    import torch

    from server.engine.hardware import choose_dtype
    from server.engine.model_loading import pick_device

    device = pick_device(None)
    return {"device": device.type, "dtype": choose_dtype(device).name,
            "threads": torch.get_num_threads(),
            "switches": {k: os.environ[k] for k in ENGINE_ENV if k in os.environ}}


def numbers_scope(place: str, server_url: str | None, api_key: str) -> str:
    """`place` (where the checkpoints live) joined with the code and environment digests."""
    environment = json.dumps(environment_facts(server_url, api_key), sort_keys=True)
    env_digest = hashlib.sha256(environment.encode()).hexdigest()[:16]
    return f"{place}|code:{code_digest()}|env:{env_digest}"
