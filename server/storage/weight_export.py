"""External weights: a checkpoint's PEFT adapter served as files behind signed, expiring URLs.

`save_weights_external` stores the adapter a run already is (`adapter_model.safetensors` and
`adapter_config.json`, which `peft` loads as they are) under `external_weights/<name>`,
optionally age-encrypted to the caller's recipients (files then end in `.age`, as Tinker does).
`get_external_weights_urls` answers one URL per file. A URL carries its own authorisation (so
plain `urllib` can fetch it, as the cookbook's `weights.download` does): an HMAC over the
owner, the checkpoint, the file and the expiry time, under a secret only this server knows.
The download handler re-checks that the checkpoint still exists and still belongs to that
owner, so a URL never outlives its checkpoint or reaches another key's files.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from pathlib import Path

URL_LIFETIME_SECONDS = 3600
AGE_SUFFIX = ".age"
METADATA_FILE = "checkpoint.json"


class ExportError(ValueError):
    """A bad export request or download link: the client's fault."""


def encrypt_in_place(directory: Path, recipients: list[str]) -> None:
    """Encrypt every file of `directory` to the age recipients, keeping only `<file>.age`."""
    import pyrage

    if not recipients or len(recipients) > 10:
        raise ExportError("age_encryption_recipients takes 1 to 10 recipients")
    parsed = []
    for recipient in recipients:
        try:
            if recipient.startswith("age1"):
                parsed.append(pyrage.x25519.Recipient.from_str(recipient))
            else:
                parsed.append(pyrage.ssh.Recipient.from_str(recipient))
        except Exception as exc:  # noqa: BLE001 - pyrage raises its own error types
            raise ExportError(f"invalid age recipient {recipient[:24]!r}: {exc}") from None
    for file in sorted(p for p in directory.iterdir() if p.is_file()):
        pyrage.encrypt_file(str(file), str(file) + AGE_SUFFIX, parsed)
        file.unlink()


def downloadable_files(directory: Path) -> list[str]:
    """The files a client downloads (everything but the server's own metadata)."""
    return sorted(p.name for p in directory.iterdir() if p.is_file() and p.name != METADATA_FILE)


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class UrlSigner:
    """Signs and checks download tokens; the secret lives only in this process (restarting the
    server invalidates outstanding URLs, and the client simply asks for new ones)."""

    def __init__(self, secret: bytes | None = None, lifetime: float = URL_LIFETIME_SECONDS):
        self._secret = secret or os.urandom(32)
        self.lifetime = lifetime

    def _mac(self, payload: bytes) -> str:
        return _b64(hmac.new(self._secret, payload, hashlib.sha256).digest())

    def sign(self, owner: str, tinker_path: str, file: str, expires: float) -> str:
        payload = json.dumps([owner_hash(owner), tinker_path, file, int(expires)]).encode()
        return f"{_b64(payload)}.{self._mac(payload)}"

    def verify(self, token: str, now: float | None = None) -> tuple[str, str, str]:
        """(owner hash, tinker path, file) of a valid, unexpired token; else `ExportError`."""
        try:
            encoded, mac = token.split(".", 1)
            payload = _unb64(encoded)
            owner_hash, tinker_path, file, expires = json.loads(payload)
        except (ValueError, TypeError):
            raise ExportError("malformed download link") from None
        if not hmac.compare_digest(mac, self._mac(payload)):
            raise ExportError("invalid download link")
        if (now if now is not None else time.time()) >= expires:
            raise ExportError("this download link has expired; ask for new URLs")
        return owner_hash, tinker_path, file


def owner_hash(owner: str) -> str:
    return hashlib.sha256(owner.encode()).hexdigest()
