"""Reading request bodies safely: a size cap before and after zstd, shared by every front end.

Kept free of torch so the distributed gateway can use it without loading the engine.
"""

from __future__ import annotations

import zstandard
from starlette.requests import Request

MAX_BODY_BYTES = 64 * 1024 * 1024


class BodyTooLarge(ValueError):
    """A body over `MAX_BODY_BYTES` (declared, streamed or decompressed): HTTP 413."""


class MalformedBody(ValueError):
    """A body that cannot be read as sent (a corrupt zstd frame, a bad length): HTTP 400."""


async def read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isascii() and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise BodyTooLarge(f"request body of {declared} bytes exceeds {MAX_BODY_BYTES}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BodyTooLarge(f"request body exceeds {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    body = b"".join(chunks)
    if request.headers.get("content-encoding", "").lower() == "zstd":
        try:
            body = zstandard.ZstdDecompressor().stream_reader(body).read(MAX_BODY_BYTES + 1)
        except zstandard.ZstdError as exc:
            raise MalformedBody(f"invalid zstd body: {exc}") from None
        if len(body) > MAX_BODY_BYTES:
            raise BodyTooLarge(f"decompressed body exceeds {MAX_BODY_BYTES} bytes")
    return body
