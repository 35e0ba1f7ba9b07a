"""Errors in the SDK's shape, shared by the single-process app and the gateway.

The SDK reads `{"error", "type"}` bodies and decides on retries from the status and the
`x-should-retry` / `retry-after` headers. Errors of the request itself (its key, its body's size
or deadline, its encoding) must read the same whichever front door answered, so both map them
here; the service's own errors (quota, not found, a user error in the data) arise only behind
the app and are mapped there.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

from server.api.auth import AuthError
from server.api.http_body import BodyTooLarge, BodyTooSlow, MalformedBody


def error_response(
    status: int, message: str, kind: str, *, retry: bool | None = None,
    retry_after: int | None = None,
) -> JSONResponse:
    response = JSONResponse({"error": message, "type": kind}, status_code=status)
    if retry is not None:
        response.headers["x-should-retry"] = "true" if retry else "false"
    if retry_after is not None:
        response.headers["retry-after"] = str(retry_after)
    return response


def request_error(exc: BaseException) -> JSONResponse | None:
    """The response for an error of the request as sent, or None for any other error."""
    if isinstance(exc, AuthError):
        return error_response(401, str(exc), "authentication_error")
    if isinstance(exc, BodyTooLarge):
        return error_response(413, str(exc), "payload_too_large")
    if isinstance(exc, BodyTooSlow):
        return error_response(408, str(exc), "request_timeout")
    if isinstance(exc, MalformedBody):
        return error_response(400, str(exc), "invalid_request")
    return None
