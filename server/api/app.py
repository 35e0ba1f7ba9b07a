"""HTTP: the `/api/v1` surface of the `tinker` SDK 0.38, on FastAPI.

Handlers only parse, authenticate and translate errors; the work is in `TrainingService`.
Errors take the SDK's own shapes: a future that fails answers `{"error", "category"}` (the SDK
raises `RequestFailedError`), a bad direct request answers 4xx with a JSON body (the SDK raises
`BadRequestError`, `AuthenticationError`, `NotFoundError`...). Nothing a client sends can crash
the process or reach another key's runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response

from server.api.auth import KeyRing
from server.api.errors import error_response, request_error
from server.api.grants import refuse_grants
from server.api.http_body import read_body
from server.api.request_schemas import check_fields
from server.engine.engine import UserError
from server.engine.losses import LossError
from server.protocol.codec import WireError, decode_forward_backward
from server.protocol.futures import LONG_POLL_SECONDS, FutureRecord
from server.protocol.json_values import json_safe
from server.service.request_fields import FieldError, RequestBody, integer, parse_json_object
from server.service.service import (
    Backpressure,
    NotFound,
    QuotaExceeded,
    SessionGone,
    TrainingService,
)
from server.storage.checkpoints import CheckpointError
from server.storage.tokenizer_files import TokenizerFiles
from server.storage.weight_export import ExportError

log = logging.getLogger(__name__)

CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,
    "use_pyqwest_transport": True,
    "proto_compress_fwdbwd": False,
    "parallel_fwdbwd_chunks": True,
    "fwdbwd_max_chunk_len": 1024,
    "fwdbwd_max_chunk_bytes_count": 5_000_000,
    "sample_use_retrieve_futures": False,
    "sample_join_sampling_session": False,
    "custom_loss_server_side": False,
}


JSON_ON_LOOP_BYTES = 64 * 1024
"""Bodies up to this size are parsed on the event loop; larger ones on a worker thread, so a
50 MB body does not hold up every other client's long poll."""


async def _json(request: Request) -> dict[str, Any]:
    """The body as a JSON object whose fields the SDK's request model accepts."""
    raw = await read_body(request)
    if not raw:
        return RequestBody()
    route = request.url.path.removeprefix("/api/v1")
    if len(raw) <= JSON_ON_LOOP_BYTES:
        return _typed_body(route, raw)
    return await asyncio.to_thread(_typed_body, route, raw)


def _typed_body(route: str, raw: bytes) -> RequestBody:
    body = parse_json_object(raw)
    check_fields(route, body)
    return body


MAX_PAGE = 1000


def _page(request: Request, default_limit: int) -> tuple[int, int]:
    """`?limit=&offset=`: non-negative integers; a limit past `MAX_PAGE` lists `MAX_PAGE`."""
    q = request.query_params
    limit = integer(q.get("limit", default_limit), "limit")
    offset = integer(q.get("offset", 0), "offset")
    if limit < 0 or offset < 0:
        raise FieldError(f"limit and offset must not be negative, got {limit} and {offset}")
    return min(limit, MAX_PAGE), offset


def _error_for(exc: Exception, method: str, path: str) -> JSONResponse:
    """The SDK-shaped response for what a handler raised."""
    response = request_error(exc)
    if response is not None:
        return response
    if isinstance(exc, NotFound):
        return error_response(404, str(exc), "not_found")
    if isinstance(exc, SessionGone):
        return error_response(410, str(exc), "session_gone")
    if isinstance(exc, QuotaExceeded):
        return error_response(429, str(exc), "quota_exceeded", retry=False)
    if isinstance(exc, Backpressure):
        return error_response(429, str(exc), "backpressure", retry_after=1)
    if isinstance(exc, (UserError, LossError, CheckpointError, ExportError, WireError)):
        return error_response(400, str(exc), "invalid_request")
    # Anything else is the server's fault, whatever its type (a ValueError from a bug is no
    # user error): a 500 with the traceback in the log.
    log.error("%s %s failed", method, path, exc_info=exc)
    return error_response(500, f"internal server error ({type(exc).__name__})", "server_error")


def _future(record: FutureRecord, **extra: Any) -> dict[str, Any]:
    return {"request_id": record.request_id, **extra}


def create_app(service: TrainingService, keys: KeyRing) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await asyncio.to_thread(service.scheduler.stop)

    app = FastAPI(
        title="autoresearch training server", docs_url=None, redoc_url=None, lifespan=lifespan
    )
    app.state.service = service
    refuse_grants(app)
    api = "/api/v1"
    service_lock = threading.Lock()

    async def off(fn: Callable[..., Any], *args: Any) -> Any:
        """Run service code on a worker thread, one call at a time.

        It may read checkpoints from disk or decode large bodies; on the event loop that would
        stall every long-poll meanwhile. The lock keeps service calls from interleaving, as
        they did when they all ran on the loop; the engine thread is unaffected.
        """
        service.futures.bind(asyncio.get_running_loop())

        def locked() -> Any:
            with service_lock:
                return fn(*args)

        return await asyncio.to_thread(locked)

    def owner(request: Request) -> str:
        return keys.authenticate(request.headers.get("x-api-key"))

    Handler = Callable[[Request], Awaitable[Any]]

    def _ckpt(request: Request) -> tuple[str, str, str]:
        p = request.path_params
        return p["run_id"], p["kind"], p["name"]

    def route(method: str, path: str, authenticated: bool = True):
        """Register a handler whose exceptions become the SDK's error shapes."""

        def decorate(handler: Handler) -> Handler:
            requests_seen = service.metrics.api_requests.labels(method, api + path)

            async def endpoint(request: Request) -> Response:
                requests_seen.inc()
                try:
                    who = owner(request) if authenticated else ""
                    result = (
                        await handler(request, who) if authenticated else await handler(request)
                    )
                    if not isinstance(result, Response):
                        result = json_safe(result if result is not None else {"status": "ok"})
                except Exception as exc:  # noqa: BLE001 - never crash the server on a request
                    return _error_for(exc, method, path)
                if isinstance(result, Response):
                    return result
                return JSONResponse(result)

            app.add_api_route(api + path, endpoint, methods=[method])
            return handler

        return decorate

    # ------------------------------------------------------- bootstrap
    @route("POST", "/client/config", authenticated=False)
    async def client_config(request: Request):
        return CLIENT_CONFIG

    @route("POST", "/client/dynamic_config", authenticated=False)
    async def dynamic_config(request: Request):
        return {"refresh_interval_sec": 300, "sample_cancel_enabled": False}

    @route("GET", "/healthz", authenticated=False)
    async def healthz(request: Request):
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Response:
        """Readiness: the engine thread is alive and not stuck while work waits for it. Where
        this process is the only one serving the API (one GPU), a long call should not take it
        out of its Service: probe readiness with `/api/v1/healthz` there and liveness with
        `/livez`."""
        stalled = service.scheduler.stalled_seconds()
        if stalled > service.scheduler.stall_limit:
            reason = "engine stalled" if stalled < float("inf") else "engine thread stopped"
            return JSONResponse({"status": reason}, 503)
        return JSONResponse({"status": "ready"})

    @app.get("/livez")
    async def livez() -> Response:
        """Liveness: the engine thread runs and has not been stuck past `hang_limit` while work
        waits (a call that long is a hang, not a long batch): otherwise restart the process."""
        stalled = service.scheduler.stalled_seconds()
        if stalled > service.scheduler.hang_limit:
            reason = "engine hung" if stalled < float("inf") else "engine thread stopped"
            return JSONResponse({"status": reason}, 503)
        return JSONResponse({"status": "alive"})

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus scrape endpoint (no key: scrape it from inside the cluster only)."""
        gauge = service.metrics.queue_depth
        gauge.clear()
        for run_id, depth in service.scheduler.queue_depths().items():
            if run_id == "_sampling":
                service.metrics.sampling_queue.set(depth)
            elif not run_id.startswith("_"):
                gauge.labels(run_id).set(depth)
        return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")

    @route("GET", "/get_server_capabilities")
    async def capabilities(request: Request, who: str):
        return {
            "supported_models": [
                {
                    "model_name": service.base_model,
                    "max_context_length": service.engine.max_context,
                    "trainable": True,
                    "sampleable": True,
                    **service.base_model_facts(),
                }
            ]
        }

    @route("POST", "/telemetry")
    async def telemetry(request: Request, who: str):
        await read_body(request)
        return {"status": "accepted"}

    tokenizer_files = TokenizerFiles(
        service.engine.tokenizer, service.engine.model.config, service.store.root
    )

    @route("GET", "/tokenizer")
    async def tokenizer(request: Request, who: str):
        """The tokenizer files, for clients to install under the base model's Hub id."""
        listing = await asyncio.to_thread(tokenizer_files.listing)
        return {"hub_id": service.base_model, "files": listing}

    @route("GET", "/tokenizer/{name}")
    async def tokenizer_file(request: Request, who: str):
        path = await asyncio.to_thread(tokenizer_files.path, request.path_params["name"])
        if path is None:
            raise NotFound(f"no tokenizer file {request.path_params['name']!r}")
        return FileResponse(path, media_type="application/octet-stream")

    # -------------------------------------------------------- sessions
    @route("POST", "/create_session")
    async def create_session(request: Request, who: str):
        return await off(service.create_session, who, await _json(request))

    @route("POST", "/session_heartbeat")
    async def heartbeat(request: Request, who: str):
        return await off(service.heartbeat, who, (await _json(request))["session_id"])

    @route("POST", "/sessions/{session_id}/finish")
    async def finish(request: Request, who: str):
        body = await _json(request)
        raw = body.get("reason") or {}
        reason = raw.get("type", "success") if isinstance(raw, dict) else raw
        if not isinstance(reason, str) or len(reason) > 64:
            raise FieldError("reason.type must be a short string, e.g. 'success'")
        return await off(service.finish_session, who, request.path_params["session_id"], reason)

    @route("GET", "/sessions")
    async def sessions(request: Request, who: str):
        return await off(service.list_sessions, who, *_page(request, 20))

    @route("POST", "/sessions/search")
    async def search_sessions(request: Request, who: str):
        return await off(service.search_sessions, who, await _json(request))

    @route("GET", "/sessions/{session_id}")
    async def session(request: Request, who: str):
        return await off(service.get_session, who, request.path_params["session_id"])

    # -------------------------------------------------------- training
    @route("POST", "/create_model")
    async def create_model(request: Request, who: str):
        record = await off(service.create_model, who, await _json(request))
        return _future(record)

    @route("POST", "/get_info")
    async def get_info(request: Request, who: str):
        return await off(service.get_info, who, (await _json(request))["model_id"])

    @route("POST", "/forward_backward")
    async def forward_backward(request: Request, who: str):
        body = await read_body(request)
        if request.headers.get("content-type", "").startswith("application/json"):
            raise WireError("forward_backward takes a protobuf body (tinker SDK >= 0.25)")
        call = await off(decode_forward_backward, body)
        record = await off(service.forward_backward, who, call)
        return _future(record, model_id=call.model_id)

    @route("POST", "/optim_step")
    async def optim_step(request: Request, who: str):
        body = await _json(request)
        return _future(await off(service.optim_step, who, body), model_id=body["model_id"])

    @route("POST", "/save_weights")
    async def save_weights(request: Request, who: str):
        body = await _json(request)
        return _future(await off(service.save_weights, who, body), model_id=body["model_id"])

    @route("POST", "/save_weights_for_sampler")
    async def save_for_sampler(request: Request, who: str):
        body = await _json(request)
        return _future(
            await off(service.save_weights_for_sampler, who, body), model_id=body["model_id"]
        )

    @route("POST", "/save_weights_external")
    async def save_weights_external(request: Request, who: str):
        body = await _json(request)
        record = await off(service.save_weights_external, who, body)
        return _future(record, model_id=body["model_id"])

    @route("GET", "/training_runs/{run_id}/checkpoints/{kind}/{name}/external_weights_urls")
    async def external_weights_urls(request: Request, who: str):
        return await off(
            service.external_weights_urls, who, *_ckpt(request), str(request.base_url)
        )

    @route("GET", "/external_weights/{token}/{file}", authenticated=False)
    async def external_weights_file(request: Request):
        """A signed download link: the token is the authorisation (no API key header)."""
        p = request.path_params
        path = await asyncio.to_thread(service.external_weights_file, p["token"], p["file"])
        return FileResponse(path, media_type="application/octet-stream", filename=p["file"])

    @route("POST", "/load_weights")
    async def load_weights(request: Request, who: str):
        return _future(await off(service.load_weights, who, await _json(request)))

    @route("POST", "/weights_info")
    async def weights_info(request: Request, who: str):
        return await off(service.weights_info, who, (await _json(request))["tinker_path"])

    # -------------------------------------------------------- sampling
    @route("POST", "/create_sampling_session")
    async def create_sampling_session(request: Request, who: str):
        return await off(service.create_sampling_session, who, await _json(request))

    @route("GET", "/samplers/{sampler_id}")
    async def get_sampler(request: Request, who: str):
        return await off(service.get_sampler, who, request.path_params["sampler_id"])

    @route("POST", "/asample")
    async def asample(request: Request, who: str):
        record, ids = await off(service.sample, who, await _json(request))
        return _future(record, sample_sequence_ids=ids)

    # --------------------------------------------------------- futures
    @route("POST", "/retrieve_future")
    async def retrieve_future(request: Request, who: str):
        body = await _json(request)
        record = service.futures.get(str(body.get("request_id")))
        if record is None or record.owner != who:
            return {"error": f"unknown request id {body.get('request_id')!r}", "category": "user"}
        if not record.done.is_set():
            finished = await service.futures.wait(record, LONG_POLL_SECONDS)
            if not finished:
                return {
                    "type": "try_again",
                    "request_id": record.request_id,
                    "queue_state": record.queue_state,
                }
        if record.error is not None:
            return {"error": record.error, "category": record.category}
        if record.proto_result is not None:
            return Response(record.proto_result, media_type="application/x-protobuf")
        return record.json_result

    @route("POST", "/cancel_future")
    async def cancel_future(request: Request, who: str):
        await _json(request)
        return {"status": "ok"}

    # ------------------------------------------------------------ rest
    @route("GET", "/training_runs")
    async def training_runs(request: Request, who: str):
        return await off(service.list_training_runs, who, *_page(request, 20))

    @route("GET", "/training_runs/{run_id}")
    async def training_run(request: Request, who: str):
        return await off(service.training_run, who, request.path_params["run_id"])

    @route("DELETE", "/training_runs/{run_id}")
    async def delete_run(request: Request, who: str):
        await off(service.delete_run, who, request.path_params["run_id"])
        return Response(status_code=204)

    @route("GET", "/training_runs/{run_id}/checkpoints")
    async def run_checkpoints(request: Request, who: str):
        return await off(service.list_checkpoints, who, request.path_params["run_id"])

    @route("GET", "/checkpoints")
    async def user_checkpoints(request: Request, who: str):
        return await off(service.list_user_checkpoints, who, *_page(request, 100))

    @route("DELETE", "/training_runs/{run_id}/checkpoints/{kind}/{name}")
    async def delete_checkpoint(request: Request, who: str):
        await off(service.delete_checkpoint, who, *_ckpt(request))
        return Response(status_code=204)

    @route("PUT", "/training_runs/{run_id}/checkpoints/{kind}/{name}/ttl")
    async def set_ttl(request: Request, who: str):
        body = await _json(request)
        await off(service.set_ttl, who, *_ckpt(request), body.get("ttl_seconds"))
        return Response(status_code=204)

    @route("POST", "/training_runs/{run_id}/checkpoints/{kind}/{name}/publish")
    async def publish(request: Request, who: str):
        await off(service.set_public, who, *_ckpt(request), True)
        return Response(status_code=204)

    @route("DELETE", "/training_runs/{run_id}/checkpoints/{kind}/{name}/publish")
    async def unpublish(request: Request, who: str):
        await off(service.set_public, who, *_ckpt(request), False)
        return Response(status_code=204)

    @route("POST", "/copy_weights")
    async def copy_weights(request: Request, who: str):
        return await off(service.copy_weights, who, await _json(request))

    return app
