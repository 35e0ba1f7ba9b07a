"""A client that sends what the SDK never would: raw bodies, wrong types, broken protobuf.

Used by the hostile-input tests and their fuzz test. Every answer is classified the way the
closing check needs it: a status class for direct answers, and for futures the category of the
failure ("user" or "server") once the future is done.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from tinker import types
from tinker.proto import request_conv
from tinker.proto import tinker_public_pb2 as pb

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

WRONG_TYPES = [
    ("POST", "/create_session", {"tags": {"a": 1}}),
    ("POST", "/create_session", {"tags": [], "user_metadata": [1, 2]}),
    ("POST", "/create_session", {"tags": [], "user_metadata": {"k": "x" * 20_000}}),
    ("POST", "/create_session", {"tags": [], "display_name": ["x"]}),
    ("POST", "/session_heartbeat", {"session_id": {"a": 1}}),
    ("POST", "/session_heartbeat", {"session_id": [1]}),
    ("POST", "/get_info", {"model_id": ["x"]}),
    ("POST", "/create_model", {"session_id": "{sid}", "model_seq_id": "²",
                               "base_model": "{base}"}),
    ("POST", "/create_model", {"session_id": "{sid}", "model_seq_id": 9, "base_model": "{base}",
                               "user_metadata": "not an object"}),
    ("POST", "/sessions/search", {"owner": [1]}),
    ("POST", "/sessions/search", {"limit": "many"}),
    ("POST", "/sessions/search", {"user_metadata": [1]}),
    ("POST", "/sessions/search", {"cursor": "abc"}),
    ("POST", "/asample", {"prompt": [1, 2], "num_samples": 1, "base_model": "{base}",
                          "sampling_params": {}}),
    ("POST", "/asample", {"prompt": {"chunks": {"a": 1}}, "num_samples": 1,
                          "base_model": "{base}", "sampling_params": {}}),
    ("POST", "/retrieve_future", {"request_id": [1]}),
    ("POST", "/save_weights", {"model_id": "{run}", "path": 123}),
    ("POST", "/save_weights", {"model_id": "{run}", "path": "ok", "user_metadata": [1]}),
    ("POST", "/load_weights", {"model_id": "{run}", "path": {"a": 1}}),
    ("POST", "/weights_info", {"tinker_path": [1]}),
    ("POST", "/sessions/{sid}/finish", {"reason": [1]}),
    ("POST", "/sessions/{sid}/finish", {"reason": {"type": {"a": 1}}}),
    ("GET", "/sessions?limit=²", None),
    ("GET", "/checkpoints?offset=¹", None),
    ("GET", "/training_runs?limit=-5", None),
    ("GET", "/checkpoints?offset=-1", None),
]



def fill(value, session_id: str, base_model: str, run_id: str):
    if isinstance(value, str):
        return value.replace("{sid}", session_id).replace("{base}", base_model) \
            .replace("{run}", run_id)
    if isinstance(value, dict):
        return {k: fill(v, session_id, base_model, run_id) for k, v in value.items()}
    if isinstance(value, list):
        return [fill(v, session_id, base_model, run_id) for v in value]
    return value


def odd_value(rng: random.Random):
    weird = [None, True, -1, 0, 10**30, 1.5, -1e308, "", "²", "x" * 3000, "a\x00b", [],
             [1, [2, [3]]], {}, {"type": {"type": 1}}, "NaN", [None] * 5, {"a": [{}] * 3},
             2**63 - 1, 2**63, -(2**63) - 1, 2**64, [2**63], [10**30], "r" * 255, "r" * 256,
             dict.fromkeys(["type", "tokens", "stop", "limit"])]
    return weird[rng.randrange(len(weird))]


def valid_bodies(session_id: str, base_model: str, run_id: str, tokens: list[int]
                 ) -> list[tuple[str, str, dict]]:
    """One well-formed body per JSON endpoint, for the fuzz to mutate."""
    prompt = {"chunks": [{"type": "encoded_text", "tokens": tokens[:4]}]}
    return [
        ("POST", "/create_session", {"tags": ["t"], "user_metadata": {"a": "b"},
                                     "sdk_version": "0.38.0", "type": "create_session"}),
        ("POST", "/session_heartbeat", {"session_id": session_id}),
        ("POST", "/get_info", {"model_id": run_id}),
        ("POST", "/optim_step", {"model_id": run_id,
                                 "adam_params": {"learning_rate": 1e-4}}),
        ("POST", "/save_weights", {"model_id": run_id, "path": "fz"}),
        ("POST", "/save_weights_for_sampler", {"model_id": run_id, "path": "fzs"}),
        ("POST", "/create_sampling_session", {"session_id": session_id,
                                              "sampling_session_seq_id": 0,
                                              "base_model": base_model}),
        ("POST", "/asample", {"prompt": prompt, "num_samples": 1, "base_model": base_model,
                              "sampling_params": {"max_tokens": 2, "temperature": 1.0,
                                                  "stop": [tokens[0]], "seed": 1}}),
        ("POST", "/sessions/search", {"limit": 5, "user_metadata": {"a": "b"}}),
        ("POST", "/weights_info", {"tinker_path": f"tinker://{run_id}/weights/fz"}),
        ("POST", "/copy_weights", {"source_path": f"tinker://{run_id}/weights/fz"}),
        ("POST", "/retrieve_future", {"request_id": "req-1-create_session"}),
        ("POST", "/load_weights", {"model_id": run_id,
                                   "path": f"tinker://{run_id}/weights/fz"}),
    ]


def mutate_body(body, rng: random.Random):
    """`body` with one value somewhere inside replaced by something odd, or a key added."""
    if isinstance(body, dict) and body:
        key = rng.choice([*body, "extra_key"])
        copy = dict(body)
        if key in body and isinstance(body[key], dict | list) and rng.random() < 0.5:
            copy[key] = mutate_body(body[key], rng)
        else:
            copy[key] = odd_value(rng)
        return copy
    if isinstance(body, list) and body:
        copy = list(body)
        index = rng.randrange(len(copy))
        copy[index] = mutate_body(copy[index], rng) if rng.random() < 0.5 else odd_value(rng)
        return copy
    return odd_value(rng)


def mutate_proto(message: pb.ForwardBackwardRequest, rng: random.Random) -> None:
    """One odd change inside the datum (its run and seq_id stay readable)."""
    datum = message.data[0]
    tensor = datum.loss_fn_inputs[rng.choice(["target_tokens", "weights"])]
    garbage = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
    choice = rng.randrange(9)
    if choice == 0:
        tensor.dtype = rng.randrange(-3, 12)
    elif choice == 1:
        del tensor.shape[:]
        tensor.shape.extend(rng.randrange(-2, 1 << 20) for _ in range(rng.randrange(0, 4)))
    elif choice == 2:
        tensor.dense = garbage
    elif choice == 3:
        tensor.ClearField("dense")
        tensor.sparse_csr.crow_indices = garbage
        tensor.sparse_csr.col_indices = garbage[::-1]
        tensor.sparse_csr.values = garbage
    elif choice == 4:
        datum.model_input[0].encoded_text.tokens = garbage
    elif choice == 5:
        message.loss_fn = rng.choice(["", "ppo", "gspo", "dro", "nope", "x" * 500])
    elif choice == 6:
        message.loss_fn_config[rng.choice(["beta", "clip_low_threshold", "?"])] = rng.choice(
            [math.nan, math.inf, -1.0, 1e30])
    elif choice == 7:
        datum.loss_fn_inputs["advantages"].CopyFrom(tensor)
    else:
        message.data.add().CopyFrom(datum)
        del message.data[-1].model_input[:]




def _json_or_none(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None
