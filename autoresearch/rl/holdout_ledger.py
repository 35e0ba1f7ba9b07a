"""The held-out split's ledger: every read of the frozen split, appended, never rewritten.

A held-out set stays held out only if nobody tunes on it. `autoresearch holdout` is the one
command that scores the frozen split (`sqltasks.holdout`), and each time it appends what was
scored, how, by which code, on which version of the split, and the aggregate result, to
`ledger.jsonl` beside the split. Rules that make the record more than a convention:

- each line carries `prev`, the SHA-256 of every byte before it, so a line edited, dropped or
  reordered after the fact breaks the chain and every later read refuses to go on;
- a read from a working tree with uncommitted changes is refused: the code that produced a
  number must be a commit someone else can check out;
- only aggregates are written (accuracy, per tier, executing rate), never which questions a
  model got right, which is what tuning on the split would need;
- each recipe (the trial config read, less its seed and its evaluation settings) has a budget
  of `READS_PER_RECIPE` reads: its seeds, once each.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from pathlib import Path
from typing import Any

from autoresearch.rl.config import TrialConfig
from sqltasks.holdout.split import LEDGER, content_hash

# Three seeds of one recipe, each read once; a fourth read of the same recipe is a re-read.
READS_PER_RECIPE = 3
# Lines written before the chain existed carry no `prev`; they may only open the file.
CHAIN_FIELD = "prev"


class LedgerRefused(RuntimeError):
    """A read the ledger's rules forbid: a broken chain, a dirty tree, a spent budget."""


def ledger_path() -> Path:
    """Where reads go: the file beside the split (tests point this elsewhere)."""
    return LEDGER


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


def committed_code() -> str:
    """The commit a read is made from; refuses a dirty tree or one git cannot name."""
    version = code_version()
    if version is None:
        raise LedgerRefused("the held-out split is read only from a git checkout: the ledger "
                            "names the commit that produced each number")
    if version.endswith("+changes"):
        raise LedgerRefused("the working tree has uncommitted changes: commit them first, so "
                            "that the number this read gives belongs to code others can check "
                            "out (`git status` lists them)")
    return version


def recipe_key(config: TrialConfig, checkpoint: str | None = None) -> str:
    """What a read is a read of: the training recipe as its config file says (before any
    command-line override), the same for each of its seeds and for every way of decoding it
    (vote, snapping, token limits are how it is read, not what). A checkpoint named without a
    config is its own recipe."""
    data = config.model_dump(mode="json")
    for field in ("seed", "eval", "name", "tokenizer", "init_checkpoint"):
        data.pop(field, None)
    data["checkpoint"] = checkpoint
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def entry(answer: dict[str, Any], command: list[str], note: str | None, recipe: str,
          code: str) -> dict[str, Any]:
    """The ledger line for one read: what `autoresearch eval` reports, in aggregate only."""
    return {
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": command,
        "split_hash": content_hash(),
        "code": code,
        "recipe": recipe,
        "model": answer["model"],
        "accuracy": answer["accuracy"],
        "execute_rate": answer["execute_rate"],
        "parse_rate": answer["parse_rate"],
        "per_tier": answer["per_tier"],
        "decoding": _aggregates(answer.get("decoding")),
        "note": note,
    }


def _aggregates(decoding: dict[str, Any] | None) -> dict[str, Any] | None:
    """How the answers were decoded, in numbers only: a vote's per-question verdicts (which
    greedy answer was right) are dropped."""
    if decoding is None:
        return None
    return {k: v for k, v in decoding.items() if not isinstance(v, dict | list)}


def check_budget(recipe: str, path: Path | None = None) -> int:
    """How many reads `recipe` has left; refuses when none are."""
    used = sum(1 for line in reads(path) if line.get("recipe") == recipe)
    if used >= READS_PER_RECIPE:
        raise LedgerRefused(f"recipe {recipe} has had its {READS_PER_RECIPE} reads of the "
                            "held-out split; a further read would be tuning on it. Choose on dev "
                            "and transfer, and read a new recipe")
    return READS_PER_RECIPE - used


def append(line: dict[str, Any], path: Path | None = None) -> int:
    """Append one read, chained to everything before it; returns how many reads it holds."""
    path = path or ledger_path()
    before = _verified_bytes(path)
    chained = {**line, CHAIN_FIELD: hashlib.sha256(before).hexdigest()}
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("ab") as out:
        out.write((json.dumps(chained, sort_keys=True) + "\n").encode())
    return len(reads(path))


def reads(path: Path | None = None) -> list[dict[str, Any]]:
    """Every read on record, after checking the chain."""
    data = _verified_bytes(path or ledger_path())
    return [json.loads(line) for line in data.decode().splitlines() if line]


def _verified_bytes(path: Path) -> bytes:
    """The ledger's bytes, refused unless every chained line hashes all that precedes it."""
    if not path.exists():
        return b""
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        raise LedgerRefused(f"{path} ends in a partial line: it was cut or edited")
    offset, chained = 0, False
    for number, raw in enumerate(data.splitlines(keepends=True), 1):
        line = json.loads(raw)
        if CHAIN_FIELD in line:
            chained = True
            if line[CHAIN_FIELD] != hashlib.sha256(data[:offset]).hexdigest():
                raise LedgerRefused(f"{path} line {number} does not chain to the lines before "
                                    "it: the ledger was edited after it was written")
        elif chained:
            raise LedgerRefused(f"{path} line {number} has no chain after chained lines: it "
                                "was added by hand")
        offset += len(raw)
    return data
