"""The gateway: the `/api/v1` HTTP surface, holding no state of its own.

Every request except health, readiness and futures becomes an op in Redis, pushed to the queue
of the trainer that owns the op's session (`placement.py`; a new session goes to the live
trainer with the least load, then the fewest sessions). The trainer answers with the
single-process server's own handlers, so answers and error shapes are identical. An SDK retry
carries the same `X-Idempotency-Key`, which names the same op: a retried request is enqueued
once and gets the first attempt's answer. `retrieve_future` long-polls the result in Redis, so
a future can be collected from any gateway. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator

import redis.asyncio as aioredis
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from server.api.auth import AuthError, KeyRing
from server.api.errors import error_response, request_error
from server.api.grants import refuse_grants
from server.api.http_body import BodyTooLarge, BodyTooSlow, read_body
from server.distributed.placement import (
    ENQUEUE_ROUTED,
    NEW_SESSION_TOKENS,
    WITHDRAW_ROUTED,
    shard_of,
)
from server.distributed.store import REPLY_TTL_SECONDS, Keys, decode_reply, decode_result
from server.protocol.futures import LONG_POLL_SECONDS

log = logging.getLogger(__name__)

API = "/api/v1"
REPLY_WAIT_SECONDS = 25.0
"""Twice this stays under the SDK's 60 s request timeout."""
UNAUTHENTICATED = {"client/config", "client/dynamic_config"}


def _refused(exc: Exception) -> JSONResponse:
    """A request the gateway refuses before queueing it: the app's shapes, or a 400 for a body
    that is not the JSON it must be."""
    return request_error(exc) or error_response(400, str(exc), "invalid_request")


def op_id_for(owner: str, method: str, path: str, idempotency_key: str | None) -> str:
    """One op per client request: retries with the same idempotency key share the id."""
    if not idempotency_key:
        return f"op-{uuid.uuid4().hex}"
    digest = hashlib.sha256("\0".join((owner, method, path, idempotency_key)).encode())
    return f"op-{digest.hexdigest()[:32]}"


class Gateway:
    """Redis operations of one gateway process (asyncio)."""

    def __init__(self, client: aioredis.Redis, keys: Keys):
        self.redis = client
        self.keys = keys
        self._enqueue = client.register_script(ENQUEUE_ROUTED)
        self._withdraw = client.register_script(WITHDRAW_ROUTED)
        self._trainers: tuple[float, list[str]] = (0.0, [])

    async def wait_value(self, key: str, timeout: float) -> bytes | None:
        value = await self.redis.get(key)
        if value is None:
            await self.redis.blmove(key + ":n", key + ":n", timeout, "RIGHT", "LEFT")
            value = await self.redis.get(key)
        return value

    async def trainers(self) -> list[str]:
        """The live trainers (looked up at most once a second): where new sessions may go."""
        checked, live = self._trainers
        if time.monotonic() - checked > 1.0:
            live = await self.live_trainers()
            self._trainers = (time.monotonic(), live)
        return live

    async def submit(self, op_id: str, session: str | None, creates: bool,
                     fields: dict[str, str | bytes]) -> None:
        flat: list[str | bytes] = [item for pair in fields.items() for item in pair]
        live = await self.trainers()
        await self._enqueue(keys=[self.keys.claim(op_id), self.keys.op(op_id),
                                  self.keys.reply(op_id)],
                            args=[REPLY_TTL_SECONDS, op_id, self.keys.prefix, session or "",
                                  str(NEW_SESSION_TOKENS) if creates else "0", len(live), *live,
                                  *flat])

    async def withdraw(self, op_id: str) -> bool:
        """Take back an op no trainer has taken yet (so a retry may enqueue it again)."""
        return bool(await self._withdraw(keys=[self.keys.op(op_id), self.keys.claim(op_id)],
                                         args=[op_id]))

    async def call(self, op_id: str, session: str | None, creates: bool,
                   fields: dict[str, str | bytes]) -> Response:
        await self.submit(op_id, session, creates, fields)
        reply = await self.wait_value(self.keys.reply(op_id), REPLY_WAIT_SECONDS)
        if reply is None:
            if await self.withdraw(op_id):
                return error_response(503, "no trainer took the request in time; retry",
                                      "unavailable", retry=True)
            reply = await self.wait_value(self.keys.reply(op_id), REPLY_WAIT_SECONDS)
        if reply is None:
            return error_response(503, "the trainer is still working on the request; retry",
                                  "unavailable", retry=True)
        status, media_type, body = decode_reply(reply)
        return Response(body, status_code=status, media_type=media_type or None)

    async def live_trainers(self) -> list[str]:
        members = sorted(m.decode()
                         for m in await self.redis.smembers(self.keys.members("trainer")))
        if not members:
            return []
        beats = await self.redis.mget([self.keys.alive("trainer", m) for m in members])
        return [m for m, beat in zip(members, beats, strict=True) if beat is not None]


def create_gateway_app(client: aioredis.Redis, keys: KeyRing, prefix: str = "ar") -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await client.aclose()

    app = FastAPI(title="autoresearch gateway", docs_url=None, redoc_url=None, lifespan=lifespan)
    refuse_grants(app)
    gateway = Gateway(client, Keys(prefix))
    app.state.gateway = gateway

    def owner(request: Request) -> str:
        return keys.authenticate(request.headers.get("x-api-key"))

    @app.get(API + "/healthz")
    async def healthz() -> dict[str, str]:
        """Liveness: the process serves HTTP (Redis and trainers are readiness concerns)."""
        return {"status": "ok"}

    @app.get("/readyz")
    async def readyz() -> Response:
        """Ready when Redis answers and at least one trainer has heartbeated recently."""
        try:
            trainers = await gateway.live_trainers()
        except aioredis.RedisError as exc:
            return JSONResponse({"status": "redis unavailable", "detail": str(exc)}, 503)
        if not trainers:
            return JSONResponse({"status": "no live trainer"}, 503)
        return JSONResponse({"status": "ready", "trainers": trainers})

    @app.get("/metrics")
    async def metrics() -> Response:
        """Queue depths as Prometheus text (the trainer exports the engine's own metrics)."""
        k = gateway.keys
        trainers = await gateway.live_trainers()
        pipe = gateway.redis.pipeline().llen(k.shared_ops).llen(k.samples)
        for trainer in trainers:
            pipe.llen(k.queue(trainer)).llen(k.taken(trainer)).scard(k.owned(trainer))
        unplaced, samples, *per_trainer = await pipe.execute()
        lines = ["# TYPE autoresearch_gateway_queue gauge",
                 f'autoresearch_gateway_queue{{queue="unplaced"}} {unplaced}',
                 f'autoresearch_gateway_queue{{queue="samples"}} {samples}']
        for i, trainer in enumerate(trainers):
            pending, taken, _ = per_trainer[3 * i: 3 * i + 3]
            lines.append(f'autoresearch_gateway_queue{{queue="pending",trainer="{trainer}"}} '
                         f"{pending}")
            lines.append(f'autoresearch_gateway_queue{{queue="taken",trainer="{trainer}"}} '
                         f"{taken}")
        lines.append("# TYPE autoresearch_trainer_sessions gauge")
        for i, trainer in enumerate(trainers):
            lines.append(f'autoresearch_trainer_sessions{{trainer="{trainer}"}} '
                         f"{per_trainer[3 * i + 2]}")
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    @app.post(API + "/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        try:
            who = owner(request)
            body = json.loads(await read_body(request) or b"{}")
        except (AuthError, BodyTooLarge, BodyTooSlow, ValueError) as exc:
            return _refused(exc)
        request_id = str(body.get("request_id"))
        meta = await gateway.redis.hgetall(gateway.keys.future(request_id))
        if not meta or meta.get(b"owner", b"").decode() != who:
            return JSONResponse({"error": f"unknown request id {body.get('request_id')!r}",
                                 "category": "user"})
        value = await gateway.wait_value(gateway.keys.result(request_id), LONG_POLL_SECONDS)
        if value is None:
            return JSONResponse({"type": "try_again", "request_id": request_id,
                                 "queue_state": "active"})
        kind, payload = decode_result(value)
        if kind == "proto":
            return Response(payload, media_type="application/x-protobuf")
        return JSONResponse(payload)

    @app.post(API + "/cancel_future")
    @app.post(API + "/telemetry")
    async def accepted(request: Request) -> Response:
        try:
            owner(request)
            await read_body(request)
        except (AuthError, BodyTooLarge, BodyTooSlow, ValueError) as exc:
            return _refused(exc)
        return JSONResponse({"status": "accepted" if request.url.path.endswith("telemetry")
                             else "ok"})

    @app.api_route(API + "/{path:path}", methods=["GET", "POST", "PUT", "DELETE"])
    async def forward(request: Request, path: str) -> Response:
        try:
            who = "" if path in UNAUTHENTICATED else owner(request)
            body = await read_body(request)
        except (AuthError, BodyTooLarge, BodyTooSlow, ValueError) as exc:
            return _refused(exc)
        op_id = op_id_for(who, request.method, path, request.headers.get("x-idempotency-key"))
        fields: dict[str, str | bytes] = {
            "method": request.method,
            "path": "/" + path,
            "query": request.url.query,
            "owner": who,
            "content_type": request.headers.get("content-type", ""),
            "body": body,
        }
        session = shard_of(op_id, request.method, "/" + path, body)
        try:
            creates = request.method == "POST" and path == "create_session"
            return await gateway.call(op_id, session, creates, fields)
        except aioredis.RedisError:
            log.exception("redis unavailable for %s", path)
            return error_response(503, "the server's queue is unavailable; retry", "unavailable",
                                  retry=True)

    return app

