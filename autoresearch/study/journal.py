"""The study journal: one DuckDB file holding everything a study did, queryable with SQL.

Tables
    study      the declaration (as JSON), when it started, its state and current best trial
    trials     every trial ever proposed: config, proposer, rationale, status, scores with
               95% intervals, cost, checkpoint, the diff of its config against the best, and
               where it is (`progress`: phase, step of total, last metrics, time left)
    steps      per-step training metrics, copied from each trial's record as it streams
    evals      every evaluation of every trial (dev only; the study's final test check is
               stored on the best and baseline rows)
    proposals  every call to a proposer: outcome (valid, repaired, fallback), attempts, errors
    decisions  every keep/discard decision: the paired difference and its interval, wins and
               losses, the exact p-value and the alpha it was held to, and what the rule
               concluded, in words (`decision_text`)
    events     everything else worth a line (crashes, resumes, budget stops)

DuckDB locks a database file per process, so the study never holds a connection open: each
write transaction opens the file, commits and closes it, under a lock shared by every `Journal`
on the same file in this process. Between writes anyone can open the file read-only
(`autoresearch status`, a notebook: `duckdb.connect("journal.duckdb", read_only=True)`); a writer
that meets such a reader retries for a while. Each write is one transaction, so a crash loses
at most the write in flight, never the file. The writing process is the journal's only writer,
so it keeps the `study` and `trials` rows it wrote in memory and reads them from there.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb

JOURNAL_FILE = "journal.duckdb"
STATUSES = ("queued", "running", "done", "crashed", "stopped", "pruned", "discarded",
            "kept")
STUDY_STATES = ("running", "interrupted", "finished", "failed")

SCHEMA = """
CREATE TABLE IF NOT EXISTS study (
    name VARCHAR, spec JSON, created DOUBLE, updated DOUBLE, state VARCHAR, best_trial VARCHAR
);
CREATE TABLE IF NOT EXISTS trials (
    id VARCHAR PRIMARY KEY, number INTEGER, role VARCHAR, status VARCHAR,
    proposer VARCHAR, proposal_id INTEGER, rationale VARCHAR,
    changes JSON, config JSON, fingerprint VARCHAR, config_key VARCHAR, seed INTEGER,
    replicate_of VARCHAR, best_at_proposal VARCHAR, diff_vs_best JSON, directory VARCHAR,
    created DOUBLE, started DOUBLE, finished DOUBLE, attempts INTEGER,
    dev_accuracy DOUBLE, dev_low DOUBLE, dev_high DOUBLE, dev_n INTEGER,
    test_accuracy DOUBLE, test_low DOUBLE, test_high DOUBLE, test_n INTEGER,
    dev JSON, test JSON, steps INTEGER, tokens BIGINT, wall_seconds DOUBLE,
    checkpoint VARCHAR, error VARCHAR, decision JSON, progress JSON
);
ALTER TABLE trials ADD COLUMN IF NOT EXISTS progress JSON;
ALTER TABLE study ADD COLUMN IF NOT EXISTS evidence_key VARCHAR;
CREATE TABLE IF NOT EXISTS steps (
    trial_id VARCHAR, phase VARCHAR, step INTEGER, time DOUBLE, reward_mean DOUBLE,
    accuracy DOUBLE, loss DOUBLE, tokens BIGINT, metrics JSON
);
CREATE TABLE IF NOT EXISTS evals (
    trial_id VARCHAR, stage VARCHAR, split VARCHAR, time DOUBLE, accuracy DOUBLE, low DOUBLE,
    high DOUBLE, n INTEGER, mean_reward DOUBLE, summary JSON
);
CREATE TABLE IF NOT EXISTS proposals (
    id INTEGER, time DOUBLE, proposer VARCHAR, requested INTEGER, outcome VARCHAR,
    attempts INTEGER, errors JSON, response VARCHAR, trial_ids JSON, seconds DOUBLE
);
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER, time DOUBLE, candidate VARCHAR, incumbent VARCHAR, rule VARCHAR,
    difference DOUBLE, low DOUBLE, high DOUBLE, n INTEGER, seeds JSON, verdict VARCHAR,
    note VARCHAR, conclusion VARCHAR, wins DOUBLE, losses DOUBLE, p_value DOUBLE, alpha DOUBLE
);
ALTER TABLE decisions ADD COLUMN IF NOT EXISTS conclusion VARCHAR;
ALTER TABLE decisions ADD COLUMN IF NOT EXISTS wins DOUBLE;
ALTER TABLE decisions ADD COLUMN IF NOT EXISTS losses DOUBLE;
ALTER TABLE decisions ADD COLUMN IF NOT EXISTS p_value DOUBLE;
ALTER TABLE decisions ADD COLUMN IF NOT EXISTS alpha DOUBLE;
CREATE TABLE IF NOT EXISTS events (
    time DOUBLE, trial_id VARCHAR, kind VARCHAR, message VARCHAR, data JSON
);
"""

JSON_COLUMNS = {"spec", "changes", "config", "diff_vs_best", "dev", "test", "decision", "metrics",
                "summary", "errors", "trial_ids", "seeds", "data", "progress"}
TRIAL_COLUMNS = (
    "id", "number", "role", "status", "proposer", "proposal_id", "rationale", "changes", "config",
    "fingerprint", "config_key", "seed", "replicate_of", "best_at_proposal", "diff_vs_best",
    "directory", "created", "started", "finished", "attempts", "dev_accuracy", "dev_low",
    "dev_high", "dev_n", "test_accuracy", "test_low", "test_high", "test_n", "dev", "test",
    "steps", "tokens", "wall_seconds", "checkpoint", "error", "decision", "progress",
)
STEP_METRICS = ("reward_mean", "accuracy", "loss_per_token", "loss")

_LOCKS: dict[str, threading.RLock] = {}
_LOCKS_GUARD = threading.Lock()


def _lock_for(path: Path) -> threading.RLock:
    key = str(path.resolve())
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(key, threading.RLock())


def _encode(column: str, value: Any) -> Any:
    if column in JSON_COLUMNS and value is not None:
        return json.dumps(value, default=str)
    return value


def _decode(columns: Sequence[str], row: Sequence[Any]) -> dict[str, Any]:
    out = {}
    for column, value in zip(columns, row):
        if column in JSON_COLUMNS and isinstance(value, str):
            value = json.loads(value)
        out[column] = value
    return out


def _is_lock_error(exc: Exception) -> bool:
    text = str(exc).lower()
    return "lock" in text or "conflicting" in text or "different configuration" in text


# Declaration fields that describe a study without changing what it runs.
NOT_EVIDENCE = ("expected_time",)


def evidence_key(spec: dict[str, Any]) -> str:
    """What a new study's evidence seeds are drawn from: its first declaration, whole. Two
    studies declared differently (another search space, name or seed) get other seed-bank and
    confirmation seeds, so their runs are fresh evidence; the same declaration run again
    reproduces its runs. Journaled once, so re-declaring a resumed study keeps its seeds. What
    a study is expected to cost (`expected_time`) describes it and is left out."""
    experiment = {k: v for k, v in spec.items() if k not in NOT_EVIDENCE}
    text = json.dumps(experiment, sort_keys=True, default=str)
    return "spec-" + hashlib.sha256(text.encode()).hexdigest()[:16]


class Journal:
    """Reads and writes one journal file; safe to share between threads."""

    def __init__(self, path: str | Path, read_only: bool = False, lock_timeout: float = 60.0):
        path = Path(path)
        # A study directory, or the journal file itself (a copy someone was sent).
        self.path = path if path.suffix == ".duckdb" or path.is_file() else path / JOURNAL_FILE
        self.read_only = read_only
        self.lock_timeout = lock_timeout
        self._lock = _lock_for(self.path)
        self._study: dict[str, Any] | None = None
        self._trials: dict[str, dict[str, Any]] | None = None
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self._connect() as db:
                db.execute(SCHEMA)
            self._trials = {t["id"]: t for t in self._select("SELECT * FROM trials")}
            rows = self._select("SELECT * FROM study")
            self._study = rows[0] if rows else None
        elif not self.path.exists():
            raise FileNotFoundError(f"no journal at {self.path}")

    @contextlib.contextmanager
    def _connect(self, read_only: bool | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
        """One connection for one transaction; retries while another process holds the file."""
        read_only = self.read_only if read_only is None else read_only
        deadline = time.monotonic() + self.lock_timeout
        delay = 0.05
        with self._lock:
            while True:
                try:
                    db = duckdb.connect(str(self.path), read_only=read_only)
                    break
                except (duckdb.IOException, duckdb.ConnectionException) as exc:
                    if not _is_lock_error(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(delay)
                    delay = min(1.0, delay * 2)
            try:
                if read_only:
                    yield db
                else:
                    db.execute("BEGIN TRANSACTION")
                    try:
                        yield db
                    except BaseException:
                        db.execute("ROLLBACK")
                        raise
                    db.execute("COMMIT")
            finally:
                db.close()

    def _select(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        with self._connect(read_only=True) as db:
            cursor = db.execute(sql, list(params))
            columns = [d[0] for d in cursor.description]
            return [_decode(columns, row) for row in cursor.fetchall()]

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """Any SQL against the journal, rows as dicts (JSON columns parsed)."""
        return self._select(sql, params)

    # ------------------------------------------------------------- study
    def init_study(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        """Record the study's declaration once; a resumed study must declare the same one."""
        now = time.time()
        with self._connect() as db:
            row = db.execute("SELECT name, spec FROM study").fetchone()
            if row is None:
                db.execute("INSERT INTO study (name, spec, created, updated, state, best_trial, "
                           "evidence_key) VALUES (?, ?, ?, ?, 'running', NULL, ?)",
                           [name, json.dumps(spec), now, now, evidence_key(spec)])
            else:
                if row[0] != name:
                    raise ValueError(f"{self.path} belongs to study {row[0]!r}, not {name!r}")
                db.execute("UPDATE study SET state = 'running', updated = ?", [now])
        self._study = self._select("SELECT * FROM study")[0]
        return dict(self._study)

    def last_activity(self) -> float | None:
        """When the study last wrote anything (an event, a step, an evaluation, a state), or
        None for a new journal: on a resume, the time since then is time the study was down."""
        if not self.path.exists():
            return None
        rows = self._select(
            "SELECT max(t) AS t FROM (SELECT max(time) AS t FROM events UNION ALL "
            "SELECT max(time) FROM steps UNION ALL SELECT max(time) FROM evals UNION ALL "
            "SELECT max(updated) FROM study)")
        return rows[0]["t"] if rows else None

    def study(self) -> dict[str, Any]:
        if self._study is not None:
            return dict(self._study)
        rows = self._select("SELECT * FROM study")
        if not rows:
            raise ValueError(f"{self.path} holds no study")
        return rows[0]

    def set_study(self, **fields: Any) -> None:
        assignments = ", ".join(f"{k} = ?" for k in fields)
        now = time.time()
        with self._connect() as db:
            db.execute(f"UPDATE study SET {assignments}, updated = ?",
                       [_encode(k, v) for k, v in fields.items()] + [now])
        if self._study is not None:
            self._study.update(fields, updated=now)

    # ------------------------------------------------------------ trials
    def add_proposal(self, proposal: dict[str, Any], trials: Sequence[dict[str, Any]]) -> int:
        """Journal a proposer call and the trials it queued, in one transaction."""
        with self._connect() as db:
            proposal_id = db.execute("SELECT coalesce(max(id), 0) + 1 FROM proposals").fetchone()[0]
            self._insert(db, "proposals", {**proposal, "id": proposal_id,
                                           "trial_ids": [t["id"] for t in trials]})
            for trial in trials:
                self._insert(db, "trials", {**trial, "proposal_id": proposal_id})
        self._remember([{**t, "proposal_id": proposal_id} for t in trials])
        return proposal_id

    def add_trials(self, trials: Sequence[dict[str, Any]]) -> None:
        with self._connect() as db:
            for trial in trials:
                self._insert(db, "trials", trial)
        self._remember(trials)

    def _remember(self, trials: Sequence[dict[str, Any]]) -> None:
        if self._trials is not None:
            for trial in trials:
                self._trials[trial["id"]] = {c: trial.get(c) for c in TRIAL_COLUMNS}

    def update_trial(self, trial_id: str, **fields: Any) -> None:
        unknown = set(fields) - set(TRIAL_COLUMNS)
        if unknown:
            raise ValueError(f"unknown trial columns: {sorted(unknown)}")
        self.finish_trial(trial_id, **fields)

    def finish_trial(self, trial_id: str, step_entries: Sequence[dict[str, Any]] | None = None,
                     eval_entries: Sequence[dict[str, Any]] | None = None,
                     **fields: Any) -> None:
        """Update a trial's row, and replace its steps and evals, in one transaction."""
        assignments = ", ".join(f"{k} = ?" for k in fields)
        with self._connect() as db:
            if fields:
                db.execute(f"UPDATE trials SET {assignments} WHERE id = ?",
                           [_encode(k, v) for k, v in fields.items()] + [trial_id])
            if step_entries is not None:
                self._put_steps(db, trial_id, step_entries, replace=True)
            if eval_entries is not None:
                self._put_evals(db, trial_id, eval_entries)
        if self._trials is not None and trial_id in self._trials:
            self._trials[trial_id].update(fields)

    def next_number(self) -> int:
        if self._trials is not None:
            return max((t["number"] for t in self._trials.values()), default=0) + 1
        return self._select("SELECT coalesce(max(number), 0) + 1 AS n FROM trials")[0]["n"]

    def trials(self, where: str = "", params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        if self._trials is not None and not where:
            return [dict(t) for t in sorted(self._trials.values(), key=lambda t: t["number"])]
        clause = f"WHERE {where}" if where else ""
        return self._select(f"SELECT * FROM trials {clause} ORDER BY number", params)

    def trial(self, trial_id: str) -> dict[str, Any]:
        if self._trials is not None:
            if trial_id not in self._trials:
                raise KeyError(trial_id)
            return dict(self._trials[trial_id])
        rows = self.trials("id = ?", [trial_id])
        if not rows:
            raise KeyError(trial_id)
        return rows[0]

    # ----------------------------------------------------------- metrics
    def put_steps(self, trial_id: str, entries: Sequence[dict[str, Any]],
                  replace: bool = False, progress: dict[str, Any] | None = None) -> None:
        """Upsert step entries of a trial record (`replace`: the record is authoritative), and
        the trial's progress state with them, in one transaction."""
        with self._connect() as db:
            self._put_steps(db, trial_id, entries, replace)
            if progress is not None:
                db.execute("UPDATE trials SET progress = ? WHERE id = ?",
                           [_encode("progress", progress), trial_id])
        if progress is not None and self._trials is not None and trial_id in self._trials:
            self._trials[trial_id]["progress"] = progress

    @classmethod
    def _put_steps(cls, db: duckdb.DuckDBPyConnection, trial_id: str,
                   entries: Sequence[dict[str, Any]], replace: bool) -> None:
        if replace:
            db.execute("DELETE FROM steps WHERE trial_id = ?", [trial_id])
        for e in entries:
            if not replace:
                db.execute("DELETE FROM steps WHERE trial_id = ? AND phase = ? AND step = ?",
                           [trial_id, e.get("phase"), e.get("step")])
            loss = e.get("loss_per_token", e.get("loss"))
            cls._insert(db, "steps", {
                "trial_id": trial_id, "phase": e.get("phase"), "step": e.get("step"),
                "time": e.get("time"), "reward_mean": e.get("reward_mean"),
                "accuracy": e.get("accuracy"), "loss": loss, "tokens": e.get("tokens"),
                "metrics": {k: v for k, v in e.items() if k not in ("type", "time")},
            })

    def put_evals(self, trial_id: str, entries: Sequence[dict[str, Any]],
                  replace: bool = True) -> None:
        """Store evaluations of a trial (`replace`: the record is authoritative; else they are
        added, as evaluations streamed during training are)."""
        with self._connect() as db:
            self._put_evals(db, trial_id, entries, replace)

    @classmethod
    def _put_evals(cls, db: duckdb.DuckDBPyConnection, trial_id: str,
                   entries: Sequence[dict[str, Any]], replace: bool = True) -> None:
        if replace:
            db.execute("DELETE FROM evals WHERE trial_id = ?", [trial_id])
        for e in entries:
            if not replace:
                db.execute("DELETE FROM evals WHERE trial_id = ? AND stage = ? AND split = ?",
                           [trial_id, e.get("stage"), e.get("split")])
            accuracy = e.get("accuracy") or {}
            cls._insert(db, "evals", {
                "trial_id": trial_id, "stage": e.get("stage"), "split": e.get("split"),
                "time": e.get("time"), "accuracy": accuracy.get("value"),
                "low": accuracy.get("low"), "high": accuracy.get("high"),
                "n": accuracy.get("n"), "mean_reward": e.get("mean_reward"),
                "summary": {k: v for k, v in e.items() if k not in ("type", "samples")},
            })

    def steps(self, trial_id: str) -> list[dict[str, Any]]:
        return self._select("SELECT * FROM steps WHERE trial_id = ? ORDER BY phase = 'rl', step",
                            [trial_id])

    def evals(self, trial_id: str) -> list[dict[str, Any]]:
        return self._select("SELECT * FROM evals WHERE trial_id = ? ORDER BY time", [trial_id])

    # --------------------------------------------------------- decisions
    def add_decision(self, decision: dict[str, Any], trial_updates: dict[str, dict[str, Any]],
                     best_trial: str | None = None) -> None:
        """A decision, the statuses it sets and the new best, in one transaction."""
        with self._connect() as db:
            decision_id = db.execute("SELECT coalesce(max(id), 0) + 1 FROM decisions").fetchone()[0]
            self._insert(db, "decisions", {**decision, "id": decision_id, "time": time.time()})
            for trial_id, fields in trial_updates.items():
                assignments = ", ".join(f"{k} = ?" for k in fields)
                db.execute(f"UPDATE trials SET {assignments} WHERE id = ?",
                           [_encode(k, v) for k, v in fields.items()] + [trial_id])
            if best_trial is not None:
                db.execute("UPDATE study SET best_trial = ?, updated = ?",
                           [best_trial, time.time()])
        if self._trials is not None:
            for trial_id, fields in trial_updates.items():
                self._trials[trial_id].update(fields)
        if self._study is not None and best_trial is not None:
            self._study["best_trial"] = best_trial

    def decisions(self) -> list[dict[str, Any]]:
        return self._select("SELECT * FROM decisions ORDER BY id")

    def proposals(self) -> list[dict[str, Any]]:
        return self._select("SELECT * FROM proposals ORDER BY id")

    # ------------------------------------------------------------ events
    def event(self, kind: str, message: str, trial_id: str | None = None, **data: Any) -> None:
        with self._connect() as db:
            self._insert(db, "events", {"time": time.time(), "trial_id": trial_id, "kind": kind,
                                        "message": message, "data": data or None})

    def events(self) -> list[dict[str, Any]]:
        return self._select("SELECT * FROM events ORDER BY time")

    # ----------------------------------------------------------- helpers
    @staticmethod
    def _insert(db: duckdb.DuckDBPyConnection, table: str, row: dict[str, Any]) -> None:
        columns = list(row)
        db.execute(f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
                   f"({', '.join('?' for _ in columns)})", [_encode(c, row[c]) for c in columns])
