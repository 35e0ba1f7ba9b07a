"""Weight export: PEFT adapters for download over signed URLs."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

from server.engine.engine import UserError
from server.protocol.futures import FutureRecord
from server.service.errors import NotFound
from server.service.ordering import RunOrdering
from server.service.request_fields import optional_integer
from server.storage.checkpoints import TinkerPath, validate_name
from server.storage.weight_export import (
    ExportError,
    downloadable_files,
    encrypt_in_place,
    owner_hash,
)


class WeightExports(RunOrdering):
    """A run's adapter exported as PEFT files and downloaded over signed, expiring URLs."""

    def save_weights_external(self, owner: str, body: dict[str, Any]) -> FutureRecord:
        """Export the run's adapter as it is (a PEFT adapter), for download over signed URLs."""
        run = self._run(owner, body["model_id"])
        seq_id = optional_integer(body.get("seq_id"), "seq_id")
        with self._refusal_keeps_order(owner, run, seq_id, "save_weights_external"):
            name = body.get("path")
            if not name:
                raise UserError("save_weights_external needs a name (path)")
            validate_name(name)
            path = TinkerPath(run.run_id, "external_weights", name)
            recipients = body.get("age_encryption_recipients")
            if recipients is not None and (
                not isinstance(recipients, list) or not 1 <= len(recipients) <= 10
            ):
                raise UserError("age_encryption_recipients takes a list of 1 to 10 recipients")
            meta = self._ttl_meta(body)
        prepare = None if not recipients else lambda d: encrypt_in_place(d, list(recipients))

        def save() -> dict[str, Any]:
            state = self._require_state(run)
            record = self.store.save(
                path, state.adapter, run.base_model, None, meta, prepare=prepare
            )
            return {
                "path": str(path),
                "size_bytes": record["size_bytes"],
                "type": "save_weights_external",
            }

        return self._ordered_action(owner, run, seq_id, "save_weights_external", save)

    def external_weights_urls(
        self, owner: str, run_id: str, kind: str, name: str, base_url: str
    ) -> dict[str, Any]:
        """Signed, expiring download URLs for each file of an export the caller owns."""
        if kind != "external_weights":
            raise UserError(
                "download URLs exist only for external weights "
                "(tinker://<run>/external_weights/<name>); export with save_weights_external"
            )
        path = self._owned_path(owner, run_id, kind, name)
        expires = time.time() + self.url_signer.lifetime
        urls = {
            file: f"{base_url.rstrip('/')}/api/v1/external_weights/"
            f"{self.url_signer.sign(owner, str(path), file, expires)}/{file}"
            for file in downloadable_files(self.store.checkpoint_dir(path))
        }
        expiry = dt.datetime.fromtimestamp(int(expires), dt.UTC)
        return {"urls": urls, "expires": expiry.isoformat()}

    def external_weights_file(self, token: str, file: str) -> Path:
        """The file a signed URL names, if the link is valid and its owner still owns it."""
        signed_owner, tinker_path, signed_file = self.url_signer.verify(token)
        if file != signed_file:
            raise ExportError("this download link is for another file")
        path = TinkerPath.parse(tinker_path)
        run_owner = (self.store.read_run(path.run_id) or {}).get("owner")
        directory = self.store.checkpoint_dir(path)
        if run_owner is None or owner_hash(run_owner) != signed_owner:
            raise NotFound("no such export")
        if file not in (downloadable_files(directory) if directory.is_dir() else []):
            raise NotFound("no such export (it was deleted or has expired)")
        expires_at = self.store.read_meta(path).get("expires_at")
        if expires_at and dt.datetime.fromisoformat(expires_at) <= dt.datetime.now(dt.UTC):
            raise NotFound("this export has expired")
        return directory / file
