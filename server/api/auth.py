"""API keys: who is calling. Runs, checkpoints and samplers belong to the key that made them.

Keys come from a file (one per line, `#` comments allowed) and/or `AUTORESEARCH_API_KEYS`
(comma-separated). With no keys configured the server is open: it accepts any `tml-` key (the
SDK's own format check) but must then only listen on loopback, which `server.entrypoints`
enforces.
Ownership is a hash of the key, so keys never sit in memory-resident metadata or on disk.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
from pathlib import Path


class AuthError(PermissionError):
    """Missing or unknown API key."""


def owner_of(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode()).hexdigest()[:24]


class KeyRing:
    def __init__(self, keys: set[str]):
        self._keys = keys

    @property
    def open(self) -> bool:
        """No keys configured: any `tml-` key is accepted (loopback only)."""
        return not self._keys

    @classmethod
    def from_sources(cls, keys_file: str | Path | None = None, env: str | None = None) -> KeyRing:
        keys: set[str] = set()
        if keys_file:
            for line in Path(keys_file).read_text().splitlines():
                line = line.split("#", 1)[0].strip()
                if line:
                    keys.add(line)
        raw = env if env is not None else os.environ.get("AUTORESEARCH_API_KEYS", "")
        keys.update(k.strip() for k in raw.split(",") if k.strip())
        return cls(keys)

    def authenticate(self, key: str | None) -> str:
        """The owner id for this key, or AuthError."""
        if not key:
            raise AuthError("missing X-API-Key header")
        if self.open:
            if not key.startswith("tml-"):
                raise AuthError("API keys must start with 'tml-'")
            return owner_of(key)
        # Bytes, not str: `compare_digest` raises on non-ASCII strings, and a header may carry any.
        sent = key.encode("utf-8", "surrogatepass")
        if any(hmac.compare_digest(sent, known.encode()) for known in self._keys):
            return owner_of(key)
        raise AuthError("unknown API key")


def is_loopback(host: str) -> bool:
    """Only loopback addresses may serve without API keys."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
