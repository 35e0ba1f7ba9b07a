"""The small HTTP surface of a worker process: liveness, readiness and metrics for probes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response

Readiness = Callable[[], tuple[bool, dict[str, Any]]]


def health_app(title: str, readiness: Readiness,
               metrics: Callable[[], bytes] | None = None) -> FastAPI:
    app = FastAPI(title=title, docs_url=None, redoc_url=None)

    @app.get("/api/v1/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Response:
        ready, detail = readiness()
        return JSONResponse({"status": "ready" if ready else "not ready", **detail},
                            status_code=200 if ready else 503)

    if metrics is not None:
        @app.get("/metrics")
        async def prometheus() -> Response:
            return Response(metrics(), media_type="text/plain; version=0.0.4")

    return app
