"""Two studies' journals, compared number for number: did a re-run reproduce the study?

Every table of the journal (trials, steps, evals, decisions, proposals, events, the study) is
read in a stable order, with what depends on the clock left out: timestamps, durations, the
server's and the machine's facts that are measured rather than computed (load, wall time), and
the session ids a server names checkpoints by (`tinker://sess-...:train:0/weights/final` is
compared as `tinker://<session>:train:0/weights/final`). Everything else must be equal: every
loss, grad norm, sampler-trainer KL, sampled token count, reward, score, interval, p-value,
proposal and decision. Floats are compared exactly.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoresearch.study.journal import Journal

CLOCK_KEYS = frozenset({
    "time", "created", "updated", "started", "finished", "wall_seconds", "seconds",
    "down_seconds", "elapsed_seconds", "load_average", "directory", "output_dir",
    "server_url", "tokens_per_second", "sample_seconds", "train_seconds", "eval_seconds",
    "step_seconds", "checkpoint", "cache_dir",
    # hashes of a config together with where it runs (the server's scope, the starting
    # checkpoint's session): the config itself is compared field by field
    "fingerprint", "config_key", "cache_key",
})
"""Keys whose values depend on when and where the study ran, not on what it computed."""
SESSION_ID = re.compile(r"tinker://[^:/\s]+:")
"""A checkpoint path's session part: a random name the server chose, not a result."""
ORDER = {
    "study": "name",
    "trials": "id",
    "steps": "trial_id, phase, step",
    "evals": "trial_id, stage, split",
    "decisions": "candidate, incumbent, rule",
    "proposals": "id",
    "events": "trial_id, kind, message",
}


@dataclass(frozen=True)
class Difference:
    table: str
    row: str
    field: str
    first: Any
    second: Any

    def __str__(self) -> str:
        return f"{self.table} {self.row} {self.field}: {self.first!r} != {self.second!r}"


def comparable(value: Any) -> Any:
    """A journal value without its clock-dependent parts (JSON text is parsed first)."""
    if isinstance(value, str) and value[:1] in "{[":
        try:
            value = json.loads(value)
        except ValueError:
            return value
    if isinstance(value, dict):
        return {k: comparable(v) for k, v in sorted(value.items()) if k not in CLOCK_KEYS}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    if isinstance(value, str):
        return SESSION_ID.sub("tinker://<session>:", value)
    return value


def _rows(journal: Journal, table: str) -> list[dict[str, Any]]:
    rows = journal.query(f"SELECT * FROM {table} ORDER BY {ORDER[table]}")
    out = [{k: comparable(v) for k, v in row.items() if k not in CLOCK_KEYS} for row in rows]
    if table == "events":  # several trials' events interleave by time: sort what remains
        out.sort(key=lambda r: json.dumps(r, sort_keys=True, default=str))
    return out


def compare(first: str | Path, second: str | Path) -> list[Difference]:
    """Every difference between two studies' journals (empty: the same study, reproduced)."""
    a, b = Journal(first, read_only=True), Journal(second, read_only=True)
    differences: list[Difference] = []
    for table in ORDER:
        rows_a, rows_b = _rows(a, table), _rows(b, table)
        if len(rows_a) != len(rows_b):
            differences.append(Difference(table, "*", "rows", len(rows_a), len(rows_b)))
        for k, (x, y) in enumerate(zip(rows_a, rows_b)):
            name = str(x.get("id") or x.get("trial_id") or k)
            for field in sorted(set(x) | set(y)):
                if x.get(field) != y.get(field):
                    differences.append(Difference(table, name, field, x.get(field), y.get(field)))
    return differences
