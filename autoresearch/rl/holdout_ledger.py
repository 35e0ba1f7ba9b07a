"""The held-out split's ledger: every read of the frozen split, appended, never rewritten.

A held-out set stays held out only if nobody tunes on it. `autoresearch holdout` is the one
command that scores the frozen split (`sqltasks.holdout`), and each time it appends what was
scored, how, by which code, on which version of the split, and the result, to
`ledger.jsonl` beside the split. Reading the ledger says how many times the split has been
looked at before a number from it is believed.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from sqltasks.holdout.split import LEDGER, content_hash


def code_version() -> str | None:
    """The checkout's commit (with `+changes` when the tree is dirty), where git can tell."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=10,
                               check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+changes" if dirty else "")


def entry(answer: dict[str, Any], command: list[str], note: str | None) -> dict[str, Any]:
    """The ledger line for one read: what `autoresearch eval` reports, trimmed of samples."""
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": command,
        "split_hash": content_hash(),
        "code": code_version(),
        "model": answer["model"],
        "accuracy": answer["accuracy"],
        "execute_rate": answer["execute_rate"],
        "parse_rate": answer["parse_rate"],
        "per_tier": answer["per_tier"],
        "decoding": answer.get("decoding"),
        "note": note,
    }


def append(line: dict[str, Any], path: Path = LEDGER) -> int:
    """Append one read; returns how many reads the ledger now holds."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as out:
        out.write(json.dumps(line, sort_keys=True) + "\n")
    return len(reads(path))


def reads(path: Path = LEDGER) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
