"""The study-level warm-up: trained once, journaled, cached by its config, forked by every trial.

A study that declares `warmup:` first runs it as a trial of its own (role `warmup`, id `warmup`,
directory `<study>/warmup`) through the study's executor, so under Kubernetes it is a Job like
any trial, and a killed study resumes it from its last checkpoint. Its final checkpoint then
becomes the `init_checkpoint` of every trial: each starts from the same weights with a fresh
optimizer, so the warm-up's cost and its variance leave every comparison.

A finished warm-up is published to a cache directory outside the study, keyed by a hash of its
trial config and of the server it lives on. Where the server is the embedded one, the study's
server data directory is private to the study, so the cache entry also keeps a copy of the
checkpoint files (a standard PEFT adapter and the run's metadata); a later study installs that
copy into its own server's data directory, where the server reads it like any checkpoint it
wrote (checkpoints are read from disk when used, and the run id is a random, unique one). On a
shared server the checkpoint stays where it is, and the entry is reused only while that server
still has it.

    cache/<key>/warmup.json      what it was and what it scored (dev before and after)
    cache/<key>/record.jsonl     the warm-up trial's record (its curve, for reports)
    cache/<key>/server-data/runs/...   the checkpoint, laid out as in a server's data directory
                                       (embedded server only)
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
from autoresearch.rl.record import TrialRecord
from autoresearch.rl.tasks import data_digest
from autoresearch.rl.trial import TrialResult
from autoresearch.study.cache_files import (
    checkpoint_paths,
    copy_checkpoint,
    default_cache_dir,
    install_checkpoint,
    publish_entry,
)
from autoresearch.study.cache_scope import numbers_scope
from autoresearch.study.environment import api_key
from autoresearch.study.executors.base import Executor, StepSink, TrialJob
from autoresearch.study.journal import Journal
from autoresearch.study.spec import PRIMARY_WARMUP, WARMUP_DIMENSION, WARMUP_ID, Study

log = logging.getLogger(__name__)

ENTRY_FILE = "warmup.json"


class WarmupFailed(RuntimeError):
    """The warm-up did not finish: no trial can start; the study can be resumed."""


def cache_root(study: Study) -> Path:
    spec = study.warmup
    if spec is not None and spec.cache_dir:
        return Path(spec.cache_dir)
    if os.environ.get("AUTORESEARCH_WARMUPS"):
        return Path(os.environ["AUTORESEARCH_WARMUPS"])
    return default_cache_dir("warmups")


def server_scope(study: Study) -> str:
    """Where the warm-up's checkpoint lives: a named server, or the embedded one (portable)."""
    url = study.resolved_server_url()
    return f"server:{url}" if url else f"embedded:{study.embedded_model or 'packaged'}"


def continues(config: TrialConfig, prefix: TrialConfig) -> bool:
    """Whether training `config` from scratch passes through `prefix`'s final state, so that
    starting there ends with the same bits: the same run but for more SFT steps (the learning
    rate is constant and each step's batch is drawn from the seed and the step alone), and
    `prefix` has no RL of its own (what `config` does after its SFT steps is its own)."""
    if prefix.rl.steps or not 0 < prefix.sft.steps < config.sft.steps:
        return False
    alike = {"name": "warmup", "checkpoint_every": 1, "sft.steps": 1,
             "rl": config.rl.model_dump(mode="json")}
    try:
        return prefix.with_changes(alike).canonical() == config.with_changes(alike).canonical()
    except ValueError:  # `config`'s RL does not fit the other's evaluation settings
        return False


def cache_key(config: TrialConfig, scope: str) -> str:
    key = {"config": config.canonical(), "scope": scope}
    data = data_digest(config)
    if data is not None:  # the user's task files: other data, another warm-up
        key["data"] = data
    blob = json.dumps(key, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


class WarmupCache:
    """One cache entry (a directory); written whole and renamed into place."""

    def __init__(self, root: Path, key: str):
        self.root = Path(root)
        self.dir = self.root / key

    def load(self) -> dict[str, Any] | None:
        try:
            return json.loads((self.dir / ENTRY_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return None

    def store(self, entry: dict[str, Any], record: Path,
              server_data: Path | None = None) -> None:
        """Publish a finished warm-up (a concurrent study publishing the same one wins or
        loses the rename; either copy is the same warm-up)."""
        def fill(staging: Path) -> None:
            if record.exists():
                shutil.copy2(record, staging / "record.jsonl")
            if server_data is not None:
                copy_checkpoint(server_data, staging / "server-data", entry["checkpoint"])
            (staging / ENTRY_FILE).write_text(json.dumps(entry, indent=2))

        publish_entry(self.dir, fill)

    def install(self, checkpoint: str, server_data: Path, owner: str) -> None:
        """Make the cached checkpoint loadable by a server whose data directory is
        `server_data`, owned by `owner` (the key the study's trials use)."""
        try:
            install_checkpoint(self.dir / "server-data", server_data, checkpoint, owner)
        except FileNotFoundError as exc:
            raise WarmupFailed(f"the cache entry {self.dir} holds no copy of {checkpoint}") \
                from exc


def remote_checkpoint_exists(server_url: str, api_key: str, checkpoint: str) -> bool:
    """Whether a named server still holds the checkpoint: False only when it says it has none
    (a server that cannot be reached fails the trials with its own clear error instead)."""
    import tinker

    rest = tinker.RestClient(base_url=server_url, api_key=api_key)
    try:
        rest.get_weights_info_by_tinker_path(checkpoint).result(timeout=60)
    except (tinker.NotFoundError, tinker.BadRequestError, tinker.PermissionDeniedError):
        return False
    except Exception:  # noqa: BLE001 - unreachable or busy: not evidence that it is gone
        log.warning("could not ask %s about %s; using the cached warm-up", server_url,
                    checkpoint)
    return True


def _eval_summary(entry: dict[str, Any] | None) -> dict[str, Any] | None:
    if entry is None:
        return None
    return {k: v for k, v in entry.items() if k not in ("type", "samples")}


def _dev_evals(record: TrialRecord) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    evals = [e for e in record.of_type("eval") if e.get("split") == "dev"]
    start = next((e for e in evals if e.get("stage") == "start"), None)
    final = next((e for e in reversed(evals) if e.get("stage") == "final"), None)
    return _eval_summary(start), _eval_summary(final)


class WarmupStage:
    """Gets the study its warm-up checkpoint: from the journal (a resumed study), from the cache
    (another study trained it), or by running it now."""

    def __init__(self, study: Study, journal: Journal, directory: Path,
                 server_data: Path | None, owner: str | None,
                 checkpoint_exists: Callable[[str], bool] | None = None,
                 name: str = PRIMARY_WARMUP):
        self.study = study
        self.name = name
        self.trial_id = warmup_id(name)
        """`warmup` for the study's own warm-up, `warmup-<name>` for a declared choice."""
        self.journal = journal
        self.directory = directory
        self.server_data = server_data
        """The embedded server's data directory (None: a named server holds checkpoints)."""
        self.owner = owner
        self.checkpoint_exists = checkpoint_exists or (lambda _: True)
        self.config = study.warmup_trial(name)
        self.key = cache_key(self.config, numbers_scope(
            server_scope(study), study.resolved_server_url(), api_key()))
        self.cache = WarmupCache(cache_root(study), self.key)

    def ensure(self, executor: Executor, on_step: StepSink) -> str:
        row = self._row()
        if row is not None and row["status"] == "done" and row["checkpoint"]:
            self._install(row["checkpoint"])
            return row["checkpoint"]
        entry = self.cache.load()
        if entry is not None and self._usable(entry):
            return self._reuse(entry, row)
        return self._train(executor, on_step, row)

    # ------------------------------------------------------------ internals
    def _row(self) -> dict[str, Any] | None:
        try:
            return self.journal.trial(self.trial_id)
        except KeyError:
            return None

    def _install(self, checkpoint: str) -> None:
        if self.server_data is None or self.owner is None:
            return
        if checkpoint_paths(self.server_data, checkpoint)[1].exists():
            return  # this study's own server trained it
        self.cache.install(checkpoint, self.server_data, self.owner)

    def _usable(self, entry: dict[str, Any]) -> bool:
        if self.server_data is not None:
            return (self.cache.dir / "server-data").exists()
        return self.checkpoint_exists(entry["checkpoint"])

    def _new_row(self, status: str, rationale: str) -> dict[str, Any]:
        config = self.config.with_changes({"name": f"{self.study.name}-{self.trial_id}"})
        return {
            "id": self.trial_id, "number": 0, "role": "warmup", "status": status,
            "proposer": "warmup", "rationale": rationale, "changes": {},
            "config": config.model_dump(mode="json"), "fingerprint": self.key,
            "config_key": f"warmup-{self.key}", "seed": config.seed, "replicate_of": None,
            "best_at_proposal": None, "diff_vs_best": {}, "directory": self.trial_id,
            "created": time.time(), "attempts": 0,
        }

    def _describe(self) -> str:
        w = self.study.warmup_spec(self.name)
        parts = []
        if w.sft.steps:
            parts.append(f"SFT {w.sft.steps} steps x {w.sft.batch_size} gold queries at lr "
                         f"{w.sft.adam.learning_rate:g}")
        if w.rl.steps:
            parts.append(f"RL {w.rl.steps} steps x {w.rl.prompts_per_step}x{w.rl.group_size}")
        if self.name == PRIMARY_WARMUP:
            return "Study warm-up (" + ", ".join(parts) + "): every trial starts from it"
        return (f"Warm-up choice {self.name!r} (" + ", ".join(parts) + "): trials that choose "
                f"`{WARMUP_DIMENSION}: {self.name}` start from it")

    def _reuse(self, entry: dict[str, Any], row: dict[str, Any] | None) -> str:
        checkpoint = entry["checkpoint"]
        self._install(checkpoint)
        rationale = (f"{self._describe()}. Reused from the cache {self.cache.dir} (trained "
                     f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(entry['created']))} in "
                     f"{entry['wall_seconds']:.0f} s).")
        if row is None:
            self.journal.add_trials([self._new_row("queued", rationale)])
        record = TrialRecord(self.cache.dir)
        final = entry.get("final") or {}
        acc = final.get("accuracy") or {}
        self.journal.finish_trial(
            self.trial_id, record.of_type("step"), record.of_type("eval"), status="done",
            rationale=rationale, finished=time.time(), dev=final or None,
            dev_accuracy=acc.get("value"), dev_low=acc.get("low"), dev_high=acc.get("high"),
            dev_n=acc.get("n"), steps=0, tokens=0, wall_seconds=0.0, checkpoint=checkpoint)
        self.journal.event("warmup", f"warm-up reused from {self.cache.dir}: {checkpoint}",
                           self.trial_id, key=self.key)
        log.info("warm-up reused from the cache (%s): %s", self.cache.dir, checkpoint)
        return checkpoint

    def _prefix(self) -> tuple[WarmupStage, dict[str, Any]] | None:
        """The longest other declared warm-up, finished and cached, that this one continues."""
        found: tuple[WarmupStage, dict[str, Any]] | None = None
        for name in self.study.warmup_names():
            other = WarmupStage(self.study, self.journal, self.directory, self.server_data,
                                self.owner, self.checkpoint_exists, name)
            if name == self.name or not continues(self.config, other.config):
                continue
            entry = other.cache.load()
            if entry is None or not other._usable(entry) \
                    or not (other.cache.dir / "record.jsonl").exists():
                continue
            if found is None or other.config.sft.steps > found[0].config.sft.steps:
                found = (other, entry)
        return found

    def _continue(self, record: TrialRecord) -> None:
        """Start this warm-up's record where a shorter warm-up it continues ended: its steps
        and its first dev score, then a checkpoint at its final state (weights and optimizer),
        from which the trial resumes and runs only the remaining steps."""
        prefix = self._prefix()
        if prefix is None:
            return
        other, entry = prefix
        entries = TrialRecord(other.cache.dir).entries()
        marks = [i for i, e in enumerate(entries) if e["type"] == "checkpoint"]
        if not marks or entries[marks[-1]].get("phase") != "sft" \
                or entries[marks[-1]].get("step") != other.config.sft.steps:
            return
        other._install(entry["checkpoint"])
        steps = other.config.sft.steps
        event = {"type": "event", "time": round(time.time(), 3),
                 "message": f"continues warm-up {other.name!r} from its final state after "
                            f"{steps} SFT steps: the same weights and optimizer state as this "
                            f"warm-up's own step {steps}",
                 "continues": other.key, "step": steps,
                 "prefix_seconds": entry.get("wall_seconds", 0.0)}
        record.start_with([*entries[:marks[-1]], event,
                           {**entries[marks[-1]], "path": entry["checkpoint"]}])
        self.journal.event("warmup", f"{self.trial_id} continues {other.trial_id} from its "
                           f"final state: {self.config.sft.steps - steps} of its "
                           f"{self.config.sft.steps} SFT steps left to run", self.trial_id,
                           continues=other.trial_id, cache_key=other.key)

    def _train(self, executor: Executor, on_step: StepSink, row: dict[str, Any] | None) -> str:
        if row is None:
            self.journal.add_trials([self._new_row("queued", self._describe() + ".")])
            row = self._row()
            assert row is not None
        elif row["status"] == "running":
            self.journal.event("trial", "resuming the warm-up (resumed study)", self.trial_id)
        self.journal.update_trial(self.trial_id, status="running",
                                  started=row.get("started") or time.time(),
                                  attempts=(row.get("attempts") or 0) + 1)
        directory = (self.directory / self.trial_id).resolve()
        log.info("running the warm-up (cache key %s)", self.key)
        record = TrialRecord(directory)
        if not record.entries():
            self._continue(record)
        try:
            result: TrialResult = executor.run(
                TrialJob(self.trial_id, TrialConfig.model_validate(row["config"]), directory),
                on_step)
        except Exception as exc:
            self.journal.finish_trial(self.trial_id, record.of_type("step"), record.of_type("eval"),
                                      status="crashed", finished=time.time(),
                                      error=f"{type(exc).__name__}: {exc}"[-4000:])
            self.journal.event("warmup", f"the warm-up failed: {type(exc).__name__}: {exc}",
                               self.trial_id)
            raise WarmupFailed(f"the study warm-up failed: {exc}; fix the cause and resume "
                               "the study") from exc
        if not result.checkpoint:
            raise WarmupFailed("the warm-up finished without a checkpoint")
        start, final = _dev_evals(record)
        final = final or _eval_summary(result.dev)
        acc = (final or {}).get("accuracy") or {}
        wall = _wall_seconds(record, result.wall_seconds)
        self.journal.finish_trial(
            self.trial_id, record.of_type("step"), record.of_type("eval"), status="done",
            finished=time.time(), dev=final, dev_accuracy=acc.get("value"),
            dev_low=acc.get("low"), dev_high=acc.get("high"), dev_n=acc.get("n"),
            steps=result.steps, tokens=result.tokens, wall_seconds=wall,
            checkpoint=result.checkpoint)
        self.cache.store({"key": self.key, "scope": server_scope(self.study),
                          "config": self.config.model_dump(mode="json"),
                          "checkpoint": result.checkpoint, "start": start, "final": final,
                          "steps": result.steps, "tokens": result.tokens,
                          "wall_seconds": wall, "created": time.time()},
                         record.path, self.server_data)
        self.journal.event("warmup", f"warm-up done: {result.checkpoint}", self.trial_id,
                           cache_key=self.key, cache_dir=str(self.cache.dir),
                           seconds=round(wall, 1))
        log.info("warm-up done (%.0f s): %s", wall, result.checkpoint)
        return result.checkpoint


def _wall_seconds(record: TrialRecord, measured: float) -> float:
    """The warm-up's training time: for one that continued another, that one's time plus the
    time since it started here (its record begins with the other's older entries)."""
    seeded = next((e for e in record.of_type("event") if "continues" in e), None)
    if seeded is None:
        return measured
    return float(seeded.get("prefix_seconds") or 0.0) + time.time() - seeded["time"]


def warmup_id(name: str = PRIMARY_WARMUP) -> str:
    """The journal id of a warm-up: `warmup`, or `warmup-<name>` for a declared choice."""
    return WARMUP_ID if name == PRIMARY_WARMUP else f"{WARMUP_ID}-{name}"


def warmup_effect(journal: Journal, trial_id: str = WARMUP_ID
                  ) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """A warm-up's dev scores before and after (eval summaries with verdicts), if journaled."""
    rows = journal.query("SELECT stage, summary FROM evals WHERE trial_id = ? AND split = 'dev'",
                         [trial_id])
    by_stage = {r["stage"]: r["summary"] for r in rows}
    if "start" in by_stage and "final" in by_stage:
        return by_stage["start"], by_stage["final"]
    return None
