"""Reading a study while it runs: journal snapshots, leaderboard rows, hypotheses, server health.

    snap = read_snapshot("runs/studies/demo")     # what the dashboard draws

Everything here reads the journal the way any outside reader does: read-only, one short
connection per query, retrying briefly while the study holds the file. So a dashboard can watch
a study run by `autoresearch run` in another process just as well as one started here.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from autoresearch.rl.config import TrialConfig
from autoresearch.study.journal import JOURNAL_FILE, Journal
from autoresearch.study.space import config_diff

TRIAL_COLUMNS = ("id, number, role, status, proposer, rationale, changes, config, "
                 "diff_vs_best, created, started, finished, attempts, dev_accuracy, dev_low, "
                 "dev_high, dev_n, test_accuracy, steps, tokens, wall_seconds, checkpoint, error, "
                 "directory")


@dataclass
class StudySnapshot:
    """One consistent-enough reading of a journal (each table read in one short query)."""

    directory: Path
    study: dict[str, Any]
    trials: list[dict[str, Any]]
    steps: dict[str, list[dict[str, Any]]]
    evals: dict[str, list[dict[str, Any]]]
    events: list[dict[str, Any]]
    proposals: list[dict[str, Any]]
    read_at: float = field(default_factory=time.time)

    @property
    def best_id(self) -> str | None:
        return self.study.get("best_trial")

    @property
    def finished(self) -> bool:
        return self.study.get("state") == "finished"

    def trial(self, trial_id: str) -> dict[str, Any] | None:
        return next((t for t in self.trials if t["id"] == trial_id), None)


def read_snapshot(directory: str | Path, lock_timeout: float = 5.0) -> StudySnapshot | None:
    """The journal's current content, or None while the study has not created it yet."""
    directory = Path(directory)
    path = directory if directory.suffix == ".duckdb" else directory / JOURNAL_FILE
    if not path.exists():
        return None
    try:
        journal = Journal(path, read_only=True, lock_timeout=lock_timeout)
        studies = journal.query("SELECT * FROM study")
        if not studies:
            return None
        try:
            trials = journal.query(f"SELECT {TRIAL_COLUMNS}, progress FROM trials ORDER BY number")
        except duckdb.BinderException:  # a journal written before trials kept their progress
            trials = journal.query(f"SELECT {TRIAL_COLUMNS}, NULL AS progress FROM trials "
                                   "ORDER BY number")
        step_rows = journal.query(
            "SELECT trial_id, phase, step, time, reward_mean, accuracy, loss FROM steps "
            "ORDER BY trial_id, phase = 'rl', step")
        eval_rows = journal.query("SELECT trial_id, stage, split, time, accuracy, low, high, n, "
                                  "mean_reward FROM evals ORDER BY time")
        events = journal.query("SELECT * FROM events ORDER BY time DESC LIMIT 12")
        proposals = journal.query("SELECT id, time, proposer, requested, outcome, attempts, "
                                  "trial_ids FROM proposals ORDER BY id DESC LIMIT 6")
    except (duckdb.Error, FileNotFoundError):
        return None  # the study is creating the file, or held it longer than we waited
    steps: dict[str, list[dict[str, Any]]] = {}
    for row in step_rows:
        steps.setdefault(row["trial_id"], []).append(row)
    evals: dict[str, list[dict[str, Any]]] = {}
    for row in eval_rows:
        evals.setdefault(row["trial_id"], []).append(row)
    return StudySnapshot(path.parent, studies[0], trials, steps, evals, events, proposals)


# ------------------------------------------------------------ leaderboard
def fmt_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def diff_text(diff: dict[str, dict[str, Any]]) -> str:
    return ", ".join(f"{path}: {fmt_value(d['from'])} → {fmt_value(d['to'])}"
                     for path, d in diff.items())


def leaderboard(snapshot: StudySnapshot, now: float | None = None) -> list[dict[str, Any]]:
    """Trials ranked by dev accuracy (unscored last), with their config diff against the current
    best (the baseline until there is one), their interval, progress and cost; the rows the
    dashboard's table shows."""
    now = time.time() if now is None else now
    best = snapshot.trial(snapshot.best_id) if snapshot.best_id else None
    # Before any decision the baseline (the declared base config) is the reference.
    reference = best or next((t for t in snapshot.trials if t["role"] == "baseline"), None)
    best_config = TrialConfig.model_validate(reference["config"]) if reference else None
    rows = []
    for t in snapshot.trials:
        config = TrialConfig.model_validate(t["config"])
        if best_config is None:
            diff = {}
        elif best is not None and t["id"] == best["id"]:
            diff = None  # it is the best
        else:
            diff = config_diff(config, best_config, ignore=("name", "seed"))
        total = config.sft.steps + config.rl.steps
        done = len(snapshot.steps.get(t["id"], []))
        if t["status"] in ("done", "kept", "discarded"):
            done = t["steps"] or total
        started, finished = t.get("started"), t.get("finished")
        wall = t["wall_seconds"]
        if wall is None and started:
            wall = (finished or now) - started
        rows.append({
            "id": t["id"], "number": t["number"], "role": t["role"], "status": t["status"],
            "best": best is not None and t["id"] == best["id"], "proposer": t["proposer"],
            "diff": diff, "diff_text": "best" if diff is None else (diff_text(diff) or "same"),
            "dev": t["dev_accuracy"], "dev_low": t["dev_low"], "dev_high": t["dev_high"],
            "dev_n": t["dev_n"], "steps_done": min(done, total), "steps_total": total,
            "tokens": t["tokens"], "wall_seconds": wall, "seed": config.seed,
            "error": (t.get("error") or "").strip().splitlines()[-1:] or None,
        })
    rows.sort(key=lambda r: (r["dev"] is None, -(r["dev"] or 0.0), r["number"]))
    for rank, row in enumerate(rows, 1):
        row["rank"] = rank
    return rows


def hypotheses(snapshot: StudySnapshot, limit: int = 4) -> list[dict[str, Any]]:
    """The latest proposals with the proposer's reasoning, newest first."""
    proposed = [t for t in snapshot.trials if t["role"] in ("explore", "confirm")]
    proposed.sort(key=lambda t: t["number"], reverse=True)
    return [{"id": t["id"], "proposer": t["proposer"], "status": t["status"],
             "changes": t["changes"] or {}, "rationale": (t["rationale"] or "").strip()}
            for t in proposed[:limit]]


# ------------------------------------------------------------ server health
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition -> {name: value}, summing over label sets."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or line.startswith("#"):
            continue
        try:
            value = float(match.group(3))
        except ValueError:
            continue
        out[match.group(1)] = out.get(match.group(1), 0.0) + value
    return out


def server_health(url: str | None, timeout: float = 2.0) -> dict[str, Any] | None:
    """Queue depth, duty cycle and resident runs of a training server, or None if unreachable."""
    if not url:
        return None
    import httpx

    try:
        response = httpx.get(url.rstrip("/") + "/metrics", timeout=timeout)
        response.raise_for_status()
    except httpx.HTTPError:
        return None
    m = parse_metrics(response.text)
    return {
        "url": url,
        "queue_depth": int(m.get("autoresearch_queue_depth", 0)),
        "sampling_queue": int(m.get("autoresearch_sampling_queue_depth", 0)),
        "duty_cycle": m.get("autoresearch_engine_duty_cycle", 0.0),
        "resident_runs": int(m.get("autoresearch_resident_adapters", 0)),
        "tokens_per_second": m.get("autoresearch_tokens_per_second", 0.0),
        "evictions": int(m.get("autoresearch_evictions_total", 0)),
    }
