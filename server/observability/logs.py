"""Logging setup: plain lines for people, or one JSON object per line for log pipelines.

Request completions are logged with `request_id`, `run_id`, `kind`, `outcome` and `seconds` as
structured fields (`extra=`), so both formats carry them.
"""

from __future__ import annotations

import json
import logging
import time

FIELDS = ("request_id", "run_id", "kind", "outcome", "seconds", "category")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: getattr(record, k) for k in FIELDS if hasattr(record, k)})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extras = " ".join(f"{k}={getattr(record, k)}" for k in FIELDS if hasattr(record, k))
        return f"{line} {extras}" if extras else line


def configure(json_lines: bool = False, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(
        JsonFormatter()
        if json_lines
        else KeyValueFormatter("%(asctime)s %(levelname)s %(name)s %(message)s")
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
