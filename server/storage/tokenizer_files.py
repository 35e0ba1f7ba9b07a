"""The tokenizer files the server hands to clients (`GET /api/v1/tokenizer`).

The loaded tokenizer and the model's `config.json` (which `AutoTokenizer` reads to pick the
tokenizer class; no weights) are saved once under the data directory and listed with sizes and
hashes, so a client (`server.entrypoints.install_tokenizer`) can install exactly the files the
server trains with under the model's Hub id.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import threading
from pathlib import Path

TOKENIZER_DIR = ".tokenizer"


class TokenizerFiles:
    """The tokenizer and model config saved once to `data_dir/.tokenizer`, with a listing."""

    def __init__(self, tokenizer: object, model_config: object, data_dir: Path):
        self._tokenizer = tokenizer
        self._model_config = model_config
        self._dir = Path(data_dir) / TOKENIZER_DIR
        self._lock = threading.Lock()
        self._listing: dict[str, dict[str, object]] | None = None

    def listing(self) -> dict[str, dict[str, object]]:
        with self._lock:
            if self._listing is None:
                staging = Path(tempfile.mkdtemp(prefix=".tok-", dir=self._dir.parent))
                try:
                    self._tokenizer.save_pretrained(staging)  # type: ignore[attr-defined]
                    self._model_config.save_pretrained(staging)  # type: ignore[attr-defined]
                    shutil.rmtree(self._dir, ignore_errors=True)
                    os.replace(staging, self._dir)
                finally:
                    shutil.rmtree(staging, ignore_errors=True)
                self._listing = {
                    p.name: {"size": p.stat().st_size, "sha256": _sha256(p.read_bytes())}
                    for p in sorted(self._dir.iterdir())
                    if p.is_file()
                }
            return self._listing

    def path(self, name: str) -> Path | None:
        return self._dir / name if name in self.listing() else None



def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
