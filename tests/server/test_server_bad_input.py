"""Bad input gets a clear client error, and the server and other runs carry on untouched.

Each case goes through the SDK's error path (a `RequestFailedError` of category "user", or a
4xx `APIStatusError`), except the bodies the SDK cannot produce (garbage protobuf, oversized
or unauthenticated requests), which are sent with httpx or a raw socket. After every case a
bystander run's logprobs are compared bit for bit with those taken before.
"""

from __future__ import annotations

import base64
import json
import socket
from collections.abc import Callable
from urllib.parse import urlparse

import httpx
import numpy as np
import pytest
import tinker
from tinker import types

from tests.server.server_helpers import (
    API_KEY,
    forward_logprobs,
    new_run,
    rl_datum,
    sft_datum,
    sft_step,
)

OUT_OF_VOCAB = 10_000


@pytest.fixture(scope="module")
def bystander(tiny_server, base_model, tiny_tokenizer):
    """Another key's run, trained one step; its logprobs must never change below."""
    service = tinker.ServiceClient(base_url=tiny_server.url, api_key="tml-bystander")
    client = new_run(service, base_model, seed=40)
    data = [sft_datum(tiny_tokenizer.encode("hello world, hello server"))]
    sft_step(client, data)
    yield client, data, forward_logprobs(client, data)
    service.close("success").result()


@pytest.fixture
def check_bystander(bystander) -> Callable[[], None]:
    def check() -> None:
        client, data, expected = bystander
        for got, want in zip(forward_logprobs(client, data), expected, strict=True):
            assert np.array_equal(got, want)

    return check


def assert_client_error(call: Callable[[], object], *words: str) -> None:
    """The request fails as the client's fault, with a message naming the problem."""
    with pytest.raises((tinker.RequestFailedError, tinker.APIStatusError)) as err:
        call()
    if isinstance(err.value, tinker.RequestFailedError):
        assert err.value.category == "user", err.value
    else:
        assert 400 <= err.value.status_code < 500, err.value
    for word in words:
        assert word in str(err.value), err.value


def test_unknown_model_id(service_client, base_model, sequences, check_bystander):
    real = new_run(service_client, base_model, seed=41)
    ghost = tinker.TrainingClient(real.holder, 99, "sess-missing:train:0", info=real.get_info())
    assert_client_error(
        lambda: ghost.forward_backward([sft_datum(sequences[0])], "cross_entropy").result(),
        "unknown training run",
    )
    check_bystander()


def test_unknown_sampler(service_client, base_model, sequences, check_bystander):
    sampler = service_client.create_sampling_client(base_model=base_model).result()
    state = json.loads(base64.urlsafe_b64decode(sampler.get_sampler_handle()))
    state["sampling_session_id"] = state["session_id"] + ":sample:999"
    handle = base64.urlsafe_b64encode(json.dumps(state).encode()).decode()
    ghost = tinker.SamplingClient.from_sampler_handle(handle, api_key=API_KEY)
    prompt = types.ModelInput.from_ints(sequences[0][:3])
    assert_client_error(
        lambda: ghost.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result(),
        "unknown sampling session",
    )
    assert_client_error(
        lambda: service_client.create_sampling_client(
            model_path="tinker://sess-missing:train:0/sampler_weights/nope").result()
        .sample(prompt, 1, types.SamplingParams(max_tokens=2)).result(),
        "no checkpoint",
    )
    check_bystander()


@pytest.mark.parametrize("where", ["model_input", "target_tokens", "negative"])
def test_tokens_outside_the_vocabulary_in_training(
    service_client, base_model, sequences, check_bystander, where
):
    ids = list(sequences[0])
    datum = sft_datum(ids)
    if where == "model_input":
        datum = sft_datum([OUT_OF_VOCAB] + ids[1:])
    elif where == "target_tokens":
        datum = sft_datum(ids[:-1] + [OUT_OF_VOCAB])
    else:
        datum = sft_datum([-1] + ids[1:])
    client = new_run(service_client, base_model, seed=42)
    assert_client_error(lambda: client.forward_backward([datum], "cross_entropy").result(),
                        "outside the vocabulary")
    check_bystander()


def test_tokens_outside_the_vocabulary_in_sampling(
    service_client, base_model, sequences, check_bystander
):
    sampler = service_client.create_sampling_client(base_model=base_model).result()
    prompt = types.ModelInput.from_ints(sequences[0][:3] + [OUT_OF_VOCAB])
    assert_client_error(
        lambda: sampler.sample(prompt, 1, types.SamplingParams(max_tokens=2)).result(),
        "outside the vocabulary",
    )
    check_bystander()


def test_mismatched_tensor_lengths(service_client, base_model, sequences, check_bystander):
    ids = sequences[0]
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 3)},
    )
    client = new_run(service_client, base_model, seed=43)
    assert_client_error(lambda: client.forward_backward([datum], "cross_entropy").result(),
                        "weights")
    check_bystander()


def test_unknown_loss_fn(service_client, base_model, sequences, check_bystander):
    client = new_run(service_client, base_model, seed=44)
    assert_client_error(
        lambda: client.forward_backward([sft_datum(sequences[0])], "no_such_loss").result(),
        "no_such_loss",
    )
    check_bystander()


def test_missing_loss_inputs(service_client, base_model, sequences, check_bystander):
    without_advantages = rl_datum(sequences[0][:3], sequences[0][3:6], [-1.0] * 3, 1.0)
    del without_advantages.loss_fn_inputs["advantages"]
    client = new_run(service_client, base_model, seed=45)
    assert_client_error(
        lambda: client.forward_backward([without_advantages], "importance_sampling").result(),
        "advantages",
    )
    check_bystander()


def test_malformed_protobuf_body_is_a_400(tiny_server, check_bystander):
    response = httpx.post(
        tiny_server.url + "/api/v1/forward_backward",
        content=b"\xff\xfe not a protobuf \x00\x01\x02" * 8,
        headers={"X-API-Key": API_KEY, "Content-Type": "application/x-protobuf"},
    )
    assert response.status_code == 400
    assert "protobuf" in response.json()["error"]
    check_bystander()


def test_oversized_body_is_a_413_without_reading_it(tiny_server, check_bystander):
    """Only the headers are sent: the server refuses on the declared length alone."""
    url = urlparse(tiny_server.url)
    declared = 100 * 1024 * 1024
    request = (
        "POST /api/v1/forward_backward HTTP/1.1\r\n"
        f"Host: {url.hostname}:{url.port}\r\n"
        f"X-API-Key: {API_KEY}\r\n"
        "Content-Type: application/x-protobuf\r\n"
        f"Content-Length: {declared}\r\n\r\n"
    ).encode()
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(request + b"\x00" * 1024)
        reply = b""
        while b"\r\n\r\n" not in reply:
            chunk = sock.recv(4096)
            if not chunk:
                break
            reply += chunk
    status_line = reply.split(b"\r\n", 1)[0]
    assert b" 413 " in status_line + b" ", reply[:200]
    check_bystander()


def test_missing_api_key_is_a_401(tiny_server, check_bystander):
    response = httpx.post(tiny_server.url + "/api/v1/create_session", json={})
    assert response.status_code == 401
    not_sdk_format = httpx.post(tiny_server.url + "/api/v1/create_session", json={},
                                headers={"X-API-Key": "not-a-tinker-key"})
    assert not_sdk_format.status_code == 401
    check_bystander()
