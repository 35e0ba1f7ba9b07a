"""A digest of this package's source, taken when a process loads it.

Scoring workers are fresh interpreters that import `rewards` from disk when they start, and a
pool replaces a worker after every kill. If the package changed on disk after the pool's own
process loaded it (an upgrade under a running server or study), a new worker would run other
code than its pool and could not even unpickle the pool's jobs, so every answer would score
`crashed`. Comparing the two digests turns that silent corruption of scores into a clear error.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def source_digest() -> str:
    """A short hash of every module of this package as it stands on disk now."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


LOADED = source_digest()
"""The digest when this process imported the package: the code it runs."""
