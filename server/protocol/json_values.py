"""JSON results that every client can parse, whatever floats they carry.

JSON has no NaN or infinity, and strict parsers (orjson, Starlette's encoder with
`allow_nan=False`) refuse them, so a result holding one used to fail outside the request
handler and the SDK retried it forever. Non-finite floats are written as the strings "NaN",
"Infinity" and "-Infinity": the SDK's pydantic models read those back as the float values, and a
plain JSON parser sees a string instead of failing.
"""

from __future__ import annotations

import json
import math
from typing import Any

NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _float(value: float) -> float | str:
    if math.isfinite(value):
        return value
    return "NaN" if math.isnan(value) else NON_FINITE[value]


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float replaced by its string spelling, checked to encode
    as strict JSON (a `ValueError` here is a server fault, raised where it is reported)."""
    safe = _convert(value)
    json.dumps(safe, allow_nan=False)
    return safe


def _convert(value: Any) -> Any:
    if isinstance(value, float):
        return _float(value)
    if isinstance(value, dict):
        return {key: _convert(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_convert(item) for item in value]
    return value
