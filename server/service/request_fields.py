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
