"""Finished trials reused across studies: the same experiment is not paid for twice.

A trial's outcome is decided by its config (model, seed, starting checkpoint, data, training,
evaluation) and by the server it runs on; its display name is not part of it. Studies that
share a warm-up and a base config (a rerun, a second proposer on the same problem, the study
benchmark's controls) propose identical trials: the baseline, its confirmation re-runs, the
proposer's seeded start-up samples. With a trial cache declared, a trial that finished in one
study is replayed in the next instead of trained again: its record is written to the new trial's
directory entry by entry, its steps and evaluations go through the study's sink as they did the
first time (so pruning and progress see them, and a pruner may stop the replay where it would
have stopped the run), and its final checkpoint is installed into the study's server. The test
check of a cached trial is itself a trial (a 0-step trial from that checkpoint) and is reused
the same way, so the test split is not scored again either.

Only trials that ran to the end are stored; a pruned, stopped or crashed trial is run afresh
next time. Entries are keyed by a hash of the config without its name and by the numbers'
scope (`cache_scope`: where it ran, the code that computes the numbers and the environment),
so changed code or another machine trains afresh.

    cache/<key>/entry.json                what it was (config, checkpoint, when)
    cache/<key>/record.jsonl              the trial's record, as it ran
    cache/<key>/server-data/runs/...      its final checkpoint (embedded server only)
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autoresearch.rl.config import TrialConfig
from autoresearch.rl.record import RECORD_FILE, TrialRecord
from autoresearch.rl.tasks import data_digest
from autoresearch.rl.trial import TrialResult
from autoresearch.study.cache_files import (
    copy_checkpoint,
    default_cache_dir,
    install_checkpoint,
    publish_entry,
)
from autoresearch.study.executors.base import Executor, StepSink, TrialJob

log = logging.getLogger(__name__)

ENTRY_FILE = "entry.json"


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("autoresearch")
    except PackageNotFoundError:
        return "source"


def cache_root(directory: str | None) -> Path:
    return Path(directory) if directory else default_cache_dir("trials")


def trial_key(config: TrialConfig, scope: str) -> str:
    """What decides a trial's outcome, hashed: its config minus the name, where it runs, and
    the code that runs it, and the user's task files when it reads any."""
    key = {"config": {k: v for k, v in config.canonical().items() if k != "name"},
           "scope": scope, "version": _version()}
    data = data_digest(config)
    if data is not None:
        key["data"] = data
    blob = json.dumps(key, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


class TrialCache:
    """A directory of finished trials, one entry per key, each written whole and renamed into
    place (two studies storing the same trial at once: either copy wins, both are the same)."""

    def __init__(self, root: str | Path, scope: str):
        self.root = Path(root)
        self.scope = scope

    def key(self, config: TrialConfig) -> str:
        return trial_key(config, self.scope)

    def entry_dir(self, key: str) -> Path:
        return self.root / key

    def load(self, key: str) -> dict[str, Any] | None:
        directory = self.entry_dir(key)
        try:
            entry = json.loads((directory / ENTRY_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return None
        if TrialRecord(directory).final() is None:
            return None
        return entry

    def store(self, key: str, config: TrialConfig, result: TrialResult,
              server_data: Path | None) -> None:
        def fill(staging: Path) -> None:
            shutil.copy2(Path(result.directory) / RECORD_FILE, staging / RECORD_FILE)
            if server_data is not None and result.checkpoint:
                copy_checkpoint(server_data, staging / "server-data", result.checkpoint)
            entry = {"key": key, "scope": self.scope, "name": config.name,
                     "config": config.model_dump(mode="json"), "checkpoint": result.checkpoint,
                     "wall_seconds": result.wall_seconds, "created": time.time()}
            (staging / ENTRY_FILE).write_text(json.dumps(entry, indent=2))

        publish_entry(self.entry_dir(key), fill)


def _as_progress(entry: dict[str, Any]) -> dict[str, Any] | None:
    """A recorded entry as the running trial reported it to its sink (None: not reported)."""
    if entry["type"] == "step":
        return entry
    if entry["type"] == "eval":
        accuracy = entry.get("accuracy")
        value = accuracy.get("value") if isinstance(accuracy, dict) else accuracy
        n = accuracy.get("n") if isinstance(accuracy, dict) else entry.get("n")
        return {"type": "eval", "phase": "eval", "stage": entry.get("stage"),
                "split": entry.get("split"), "step": entry.get("step"), "n": n,
                "accuracy": value}
    return None


class CachingExecutor:
    """Wraps a study's executor: replays a trial the cache holds, else runs it and stores it.

    `server_data`/`owner`: the embedded server's data directory and the trials' owner, where
    cached checkpoints are installed; None for a named server, where a cached entry is used
    only while `checkpoint_exists` says that server still holds its checkpoint."""

    def __init__(self, inner: Executor, cache: TrialCache, server_data: Path | None,
                 owner: str | None, checkpoint_exists: Callable[[str], bool] | None = None):
        self.inner = inner
        self.cache = cache
        self.server_data = server_data
        self.owner = owner
        self.checkpoint_exists = checkpoint_exists or (lambda _: True)
        self.replayed: list[str] = []

    def run(self, job: TrialJob, on_step: StepSink) -> TrialResult:
        key = self.cache.key(job.config)
        entry = self.cache.load(key)
        fresh = not (Path(job.directory) / RECORD_FILE).exists()
        if entry is not None and fresh and self._usable(key, entry):
            return self._replay(job, key, entry, on_step)
        result = self.inner.run(job, on_step)
        try:
            self.cache.store(key, job.config, result, self.server_data)
        except Exception as exc:  # noqa: BLE001 - a cache that cannot be written costs reuse only
            log.warning("could not cache trial %s: %s", job.id, exc)
        return result

    def close(self) -> None:
        self.inner.close()

    # ------------------------------------------------------------ internals
    def _usable(self, key: str, entry: dict[str, Any]) -> bool:
        checkpoint = entry.get("checkpoint")
        if not checkpoint:
            return True
        if self.server_data is not None:
            return (self.cache.entry_dir(key) / "server-data").exists()
        return self.checkpoint_exists(checkpoint)

    def _replay(self, job: TrialJob, key: str, entry: dict[str, Any],
                on_step: StepSink) -> TrialResult:
        source = self.cache.entry_dir(key)
        checkpoint = entry.get("checkpoint")
        if checkpoint and self.server_data is not None and self.owner is not None:
            install_checkpoint(source / "server-data", self.server_data, checkpoint, self.owner)
        record = TrialRecord(job.directory)
        record.write_config(job.config.to_yaml())
        record.append("event", message=f"replayed from the trial cache {source} (the same "
                      f"config ran as {entry.get('name')!r} in {entry['wall_seconds']:.0f} s)",
                      cache_key=key)
        log.info("%s: replaying a cached run of the same config (%s)", job.id, source)
        final = None
        with open(record.path, "a", encoding="utf-8") as handle:
            for cached in TrialRecord(source).entries():
                handle.write(json.dumps(cached) + "\n")
                handle.flush()
                if cached["type"] == "final":
                    final = cached
                reported = _as_progress(cached)
                if reported is not None:
                    on_step(reported)  # may stop the replay here (pruned), as it would the run
            os.fsync(handle.fileno())
        assert final is not None  # load() returns only entries whose record is final
        self.replayed.append(job.id)
        return TrialResult(Path(job.directory), final.get("dev"), final.get("test"),
                           final["steps"], final["tokens"], final["wall_seconds"],
                           final.get("checkpoint"))
