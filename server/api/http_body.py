"""Reading request bodies safely: a size cap before and after zstd, shared by every front end.

Kept free of torch so the distributed gateway can use it without loading the engine.
"""

from __future__ import annotations

import asyncio

import zstandard
from starlette.requests import Request

MAX_BODY_BYTES = 64 * 1024 * 1024
BODY_READ_SECONDS = 120.0
"""A whole body must arrive within this (64 MiB at about 0.5 MB/s); a client trickling one
holds a connection and a worker no longer than that."""


class BodyTooLarge(ValueError):
    """A body over `MAX_BODY_BYTES` (declared, streamed or decompressed): HTTP 413."""


class BodyTooSlow(TimeoutError):
    """A body that did not arrive within `BODY_READ_SECONDS`: HTTP 408."""


class MalformedBody(ValueError):
    """A body that cannot be read as sent (a corrupt zstd frame, a bad length): HTTP 400."""


async def _read_capped(request: Request) -> bytes:
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise BodyTooLarge(f"request body exceeds {MAX_BODY_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def read_body(request: Request) -> bytes:
    declared = request.headers.get("content-length")
    if declared and declared.isascii() and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise BodyTooLarge(f"request body of {declared} bytes exceeds {MAX_BODY_BYTES}")
    try:
        async with asyncio.timeout(BODY_READ_SECONDS):
            body = await _read_capped(request)
    except TimeoutError:
        raise BodyTooSlow(f"request body not received within {BODY_READ_SECONDS:.0f} s") from None
    if request.headers.get("content-encoding", "").lower() == "zstd":
        body = _unzstd(body)
    return body


def _unzstd(body: bytes, step: int = 1024) -> bytes:
    """Decompress a zstd body fed a KiB at a time, so the output is capped as it grows (a
    small body cannot expand past `MAX_BODY_BYTES` in memory), and refuse a frame that does not
    end: a truncated or corrupt body is an error, not an empty or partial request."""
    decompressor = zstandard.ZstdDecompressor().decompressobj()
    parts, size = [], 0
    try:
        for first in range(0, len(body), step):
            part = decompressor.decompress(body[first : first + step])
            size += len(part)
            if size > MAX_BODY_BYTES:
                raise BodyTooLarge(f"decompressed body exceeds {MAX_BODY_BYTES} bytes")
            parts.append(part)
            if decompressor.eof:
                break
    except zstandard.ZstdError as exc:
        raise MalformedBody(f"invalid zstd body: {exc}") from None
    if not decompressor.eof:
        raise MalformedBody("invalid zstd body: the frame is truncated")
    return b"".join(parts)
