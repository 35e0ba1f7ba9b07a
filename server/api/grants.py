"""Headers that carry a grant the hosted service issues, which this server cannot check.

The SDK sends `weights_access_token` for `copy_weights` as a header, not a body field (a secret
header, kept out of logs). Here a checkpoint is read with its owner's API key, so a request that
carries such a grant is refused by the grant's name, on every process that answers the API (the
single process and the gateways), rather than served as if the grant had been checked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response

from server.api.errors import error_response
from server.service.checkpoints import ACCESS_TOKEN_REFUSAL

ACCESS_TOKEN_HEADER = "x-tinker-weights-access-token"


def refuse_grants(app: FastAPI) -> None:
    """Answer 400, naming the field, to any request that carries an access grant."""

    @app.middleware("http")
    async def no_grants(request: Request,
                        call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.headers.get(ACCESS_TOKEN_HEADER):
            return error_response(400, ACCESS_TOKEN_REFUSAL, "invalid_request", retry=False)
        return await call_next(request)
