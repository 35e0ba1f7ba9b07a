"""A client that sends what the SDK never would: raw bodies, wrong types, broken protobuf.

Used by the hostile-input tests and their fuzz test. Every answer is classified the way the
closing check needs it: a status class for direct answers, and for futures the category of the
failure ("user" or "server") once the future is done.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from tinker import types
from tinker.proto import request_conv

API = "/api/v1"
POLL_DEADLINE = 60.0


@dataclass
class Outcome:
    """What one hostile request got: its HTTP status and, for a future, how it ended."""

    status: int
    future: str | None = None
    """"ok", "user" or "server" for a future the request started; None otherwise."""
    body: Any = None

    @property
    def server_fault(self) -> bool:
        return self.status >= 500 or self.future == "server"


@dataclass
class HostileClient:
    url: str
    key: str
    http: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        self.http = httpx.Client(base_url=self.url + API, timeout=90.0)

    def close(self) -> None:
        self.http.close()

    def send(self, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
             headers: dict[str, Any] | None = None, key: Any = None) -> Outcome:
        """One request; a future it starts is followed to its end."""
        sent = {"x-api-key": self.key if key is None else key, **(headers or {})}
        if raw is not None:
            response = self.http.request(method, path, content=raw, headers=sent)
        elif body is not None:
            response = self.http.request(method, path, json=body, headers=sent)
        else:
            response = self.http.request(method, path, headers=sent)
        outcome = Outcome(response.status_code, body=_json_or_none(response))
        request_id = (outcome.body or {}).get("request_id") if isinstance(outcome.body,
                                                                           dict) else None
        if response.status_code == 200 and isinstance(request_id, str):
            outcome.future = self.follow(request_id)
        return outcome

    def follow(self, request_id: str) -> str:
        """"ok", "user" or "server": how the future ended."""
        deadline = time.monotonic() + POLL_DEADLINE
        while time.monotonic() < deadline:
            response = self.http.post("/retrieve_future", json={"request_id": request_id},
                                      headers={"x-api-key": self.key})
            if response.status_code >= 500:
                return "server"
            if response.headers.get("content-type", "").startswith("application/x-protobuf"):
                return "ok"
            body = response.json()
            if body.get("type") == "try_again":
                continue
            if "error" in body:
                return body.get("category", "user")
            return "ok"
        raise TimeoutError(f"future {request_id} never finished")

    # ------------------------------------------------------------ set-up
    def session(self) -> str:
        out = self.send("POST", "/create_session",
                        {"tags": [], "sdk_version": "0.38.0", "type": "create_session"})
        return out.body["session_id"]

    def run(self, session_id: str, base_model: str, seq: int) -> str:
        response = self.http.post("/create_model", headers={"x-api-key": self.key}, json={
            "session_id": session_id, "model_seq_id": seq, "base_model": base_model,
            "lora_config": {"rank": 4, "seed": 1}, "type": "create_model"})
        assert self.follow(response.json()["request_id"]) == "ok"
        return f"{session_id}:train:{seq}"


def forward_backward_body(model_id: str, seq_id: int, data: list[types.Datum],
                          loss_fn: str = "cross_entropy",
                          config: dict[str, float] | None = None) -> bytes:
    """A ForwardBackwardRequest protobuf as the SDK encodes it."""
    request = types.ForwardBackwardRequest(
        forward_backward_input=types.ForwardBackwardInput(data=data, loss_fn=loss_fn,
                                                          loss_fn_config=config),
        model_id=model_id, seq_id=seq_id)
    return request_conv.forward_backward_request_to_proto(request).SerializeToString()


PROTOBUF = {"content-type": "application/x-protobuf"}


def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None
