"""Typed access to fields of a client's JSON body, where every failure is the client's fault.

A server bug that raises `KeyError` or `ValueError` must surface as a 500, while a missing or
ill-typed field is a 400 naming the field. So request parsing never relies on bare `int()` or
`body[key]` (whose errors look like bugs): it goes through these helpers, which raise
`FieldError` (a `UserError`) with the field's name.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from server.engine.engine import UserError


class FieldError(UserError):
    """A request field is missing or has the wrong type."""


DECIMAL = re.compile(r"\s*-?[0-9]+\s*")
"""An integer as text: ASCII digits only (`str.isdigit` accepts superscripts `int` refuses)."""


class RequestBody(dict):
    """A decoded JSON object whose missing keys raise `FieldError` naming the key."""

    def __missing__(self, key: str) -> Any:
        raise FieldError(f"missing field {key!r}")


def integer(value: Any, name: str) -> int:
    """An integer field (a JSON integer, or a float with no fractional part)."""
    if isinstance(value, bool):
        raise FieldError(f"{name} must be an integer, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and DECIMAL.fullmatch(value):
        return int(value)
    raise FieldError(f"{name} must be an integer, got {value!r}")


def number(value: Any, name: str) -> float:
    """A finite real number (JSON integers and floats; booleans and strings are refused)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FieldError(f"{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise FieldError(f"{name} must be finite, got {value!r}")
    return float(value)


def flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise FieldError(f"{name} must be true or false, got {value!r}")
    return value


def optional_integer(value: Any, name: str) -> int | None:
    return None if value is None else integer(value, name)


def parse_json_object(raw: bytes) -> RequestBody:
    """A request body as a JSON object, or `FieldError` saying why it is not one."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise FieldError("request body is nested too deeply to parse") from None
    except ValueError as exc:
        raise FieldError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise FieldError("request body must be a JSON object")
    return RequestBody(value)


MAX_TTL_SECONDS = 10 * 365 * 24 * 3600
"""Ten years: a TTL beyond it is refused rather than overflowing the date it sets."""


def ttl_seconds(value: Any, name: str = "ttl_seconds") -> int:
    """A time to live in whole seconds, at least 1 and at most `MAX_TTL_SECONDS`."""
    seconds = integer(value, name)
    if not 1 <= seconds <= MAX_TTL_SECONDS:
        raise FieldError(f"{name} must be between 1 and {MAX_TTL_SECONDS} seconds, got {seconds}")
    return seconds


MAX_METADATA_BYTES = 16 * 1024
"""User metadata (a session's, a run's, a checkpoint's) is kept for the server's lifetime and
written beside checkpoints: far more than any label needs, far less than a body can carry."""
MAX_TEXT_CHARS = 256
MAX_TAGS = 64


def metadata(value: Any, name: str = "user_metadata") -> dict[str, Any]:
    """A user-metadata object of at most `MAX_METADATA_BYTES` as JSON."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FieldError(f"{name} must be an object, got {type(value).__name__}")
    size = len(json.dumps(value, default=str))
    if size > MAX_METADATA_BYTES:
        raise FieldError(f"{name} is {size} bytes as JSON; the limit is {MAX_METADATA_BYTES}")
    return dict(value)


def short_text(value: Any, name: str) -> str | None:
    """An optional label of at most `MAX_TEXT_CHARS` characters."""
    if value is None:
        return None
    if not isinstance(value, str):
        raise FieldError(f"{name} must be a string, got {type(value).__name__}")
    if len(value) > MAX_TEXT_CHARS:
        raise FieldError(f"{name} has {len(value)} characters; the limit is {MAX_TEXT_CHARS}")
    return value


def tags(value: Any, name: str = "tags") -> list[str]:
    """At most `MAX_TAGS` short string labels."""
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_TAGS:
        raise FieldError(f"{name} must be a list of at most {MAX_TAGS} strings")
    return [short_text(tag, f"{name}[{i}]") or "" for i, tag in enumerate(value)]
