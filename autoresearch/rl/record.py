"""The trial record: an append-only JSON-lines file that survives any crash.

One line per event (`step`, `eval`, `checkpoint`, `event`, `final`), each written whole and
fsynced before the next step starts, so a reader never sees half a step. A torn last line (the
process died mid-write) is ignored on read. Resuming keeps everything up to the last checkpoint
and drops the steps after it, which are then redone: the record ends as it would have without
the interruption, minus the lost work (which is logged as an `event`).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RECORD_FILE = "record.jsonl"
CONFIG_FILE = "config.yaml"


@dataclass(frozen=True)
class ResumePoint:
    phase: str
    step: int
    """Steps of `phase` completed (the next step to run has this index)."""
    path: str
    tokens: int
    line: int


class TrialRecord:
    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / RECORD_FILE

    # ------------------------------------------------------------ writing
    def append(self, kind: str, **fields: Any) -> dict[str, Any]:
        entry = {"type": kind, "time": round(time.time(), 3), **fields}
        line = json.dumps(entry, default=_jsonable) + "\n"
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        return entry

    def start_with(self, entries: list[dict[str, Any]]) -> None:
        """Begin an empty record with another record's entries (a run that continues where
        another ended: resuming then starts from the last checkpoint among them)."""
        if self.entries():
            raise ValueError(f"{self.path} is not empty: a record starts with entries only once")
        _atomic_write(self.path, "".join(json.dumps(e, default=_jsonable) + "\n"
                                         for e in entries))

    def write_config(self, text: str) -> None:
        target = self.dir / CONFIG_FILE
        if target.exists() and target.read_text() != text:
            raise ValueError(f"{self.dir} already holds a trial with a different config")
        _atomic_write(target, text)

    # ------------------------------------------------------------ reading
    def entries(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        out = []
        for raw in self.path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(raw))
            except ValueError:
                continue  # a torn last line from a crash
        return out

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.entries() if e["type"] == kind]

    def final(self) -> dict[str, Any] | None:
        finals = self.of_type("final")
        return finals[-1] if finals else None

    def resume_point(self) -> ResumePoint | None:
        entries = self.entries()
        for index in range(len(entries) - 1, -1, -1):
            entry = entries[index]
            if entry["type"] == "checkpoint":
                return ResumePoint(
                    entry["phase"], entry["step"], entry["path"], entry.get("tokens", 0), index
                )
        return None

    def rewind_to(self, point: ResumePoint | None) -> int:
        """Drop what came after the checkpoint we resume from; returns how many steps were lost."""
        entries = self.entries()
        keep = entries[: point.line + 1] if point is not None else []
        lost = sum(1 for e in entries[len(keep) :] if e["type"] == "step")
        _atomic_write(self.path, "".join(json.dumps(e, default=_jsonable) + "\n" for e in keep))
        return lost


def step_seconds(entry: dict[str, Any]) -> float:
    """A step entry's duration: an SFT step records one number, an RL step its phases'
    (sampling, scoring, training) by name."""
    value = entry["seconds"]
    return float(sum(value.values())) if isinstance(value, dict) else float(value)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "as_dict"):
        return value.as_dict()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _atomic_write(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
