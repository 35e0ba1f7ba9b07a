"""API keys: runs are private to the key that made them, and unknown keys are turned away."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tinker
from tinker import types

from tests.server.server_helpers import forward_logprobs, new_run, sft_datum, sft_step, start_server

ALICE, BOB = "tml-alice", "tml-bob"


@pytest.fixture(scope="module")
def keyed_server(tiny_model_dir, tmp_path_factory) -> Iterator:
    server = start_server(tiny_model_dir, tmp_path_factory.mktemp("keyed-data"),
                          api_keys=f"{ALICE},{BOB}")
    yield server
    server.stop()


def _client_for(server, key: str) -> tinker.ServiceClient:
    return tinker.ServiceClient(base_url=server.url, api_key=key)


def test_another_key_cannot_see_or_use_a_run(keyed_server, base_model, sequences):
    data = [sft_datum(sequences[0])]
    with _client_for(keyed_server, ALICE) as alice, _client_for(keyed_server, BOB) as bob:
        run = new_run(alice, base_model, seed=30)
        sft_step(run, data)
        state_path = run.save_state("private").result().path
        sampler_path = run.save_weights_for_sampler("private-sampler").result().path
        sampler = run.save_weights_and_get_sampling_client().result()
        before = forward_logprobs(run, data)

        bob_rest = tinker.RestClient(base_url=keyed_server.url, api_key=BOB)
        with pytest.raises(tinker.NotFoundError):
            bob_rest.get_training_run(run.model_id).result()
        listed = bob_rest.list_training_runs().result().training_runs
        assert run.model_id not in [r.training_run_id for r in listed]
        with pytest.raises(tinker.NotFoundError):
            bob_rest.list_checkpoints(run.model_id).result()

        with pytest.raises((tinker.APIStatusError, tinker.RequestFailedError)):
            bob.create_sampling_client(model_path=sampler_path).result().sample(
                types.ModelInput.from_ints(sequences[1][:3]), 1, types.SamplingParams(max_tokens=2)
            ).result()
        with pytest.raises((tinker.APIStatusError, tinker.RequestFailedError)):
            bob.create_training_client_from_state(state_path).result()

        bobs_own = new_run(bob, base_model, seed=31)
        hijack = tinker.TrainingClient(bobs_own.holder, 99, run.model_id, info=bobs_own.get_info())
        with pytest.raises(tinker.NotFoundError):
            hijack.forward_backward(data, "cross_entropy").result()

        stolen = tinker.SamplingClient.from_sampler_handle(sampler.get_sampler_handle(),
                                                           api_key=BOB)
        with pytest.raises(tinker.NotFoundError):
            stolen.sample(types.ModelInput.from_ints(sequences[1][:3]), 1,
                          types.SamplingParams(max_tokens=2)).result()

        # The owner still sees and uses all of it, unchanged.
        alice_rest = tinker.RestClient(base_url=keyed_server.url, api_key=ALICE)
        assert alice_rest.get_training_run(run.model_id).result().training_run_id == run.model_id
        for got, want in zip(forward_logprobs(run, data), before, strict=True):
            assert np.array_equal(got, want)


def test_unknown_and_missing_api_keys_are_rejected_with_401(keyed_server, base_model):
    with _client_for(keyed_server, "tml-mallory") as stranger:  # noqa: SIM117
        with pytest.raises(tinker.AuthenticationError):
            stranger.create_lora_training_client(base_model=base_model, rank=4).result()

    missing = httpx.post(keyed_server.url + "/api/v1/create_session", json={})
    assert missing.status_code == 401
    unknown = httpx.post(keyed_server.url + "/api/v1/create_session", json={},
                         headers={"X-API-Key": "tml-mallory"})
    assert unknown.status_code == 401
    assert "error" in unknown.json()

    with _client_for(keyed_server, ALICE) as alice:  # the server keeps serving known keys
        assert new_run(alice, base_model, seed=32).model_id


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("localhost", True),
     ("0.0.0.0", False), ("::", False), ("192.168.1.5", False), ("example.com", False)],
)
def test_is_loopback(host, loopback):
    from server.entrypoints.runtime import is_loopback

    assert is_loopback(host) is loopback


def test_open_server_refuses_to_listen_beyond_loopback(tmp_path):
    """Checked before the model loads: the model path here does not even exist."""
    from server.entrypoints.runtime import ServerConfig, build_service

    config = ServerConfig(model=str(tmp_path / "no-such-model"), host="0.0.0.0", api_keys="",
                          data_dir=tmp_path / "data")
    with pytest.raises(SystemExit, match="API keys"):
        build_service(config)
