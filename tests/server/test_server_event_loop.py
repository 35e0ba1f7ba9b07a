"""Slow service work (disk reads, decoding) never stalls the HTTP event loop, and a
checkpoint's adapter is read from disk once however often it is named."""

from __future__ import annotations

import threading

import httpx
from tinker import types

from tests.server.server_helpers import API_KEY, new_run


def test_a_slow_request_does_not_stall_other_requests(tiny_server, monkeypatch):
    """The health check is answered while another request is provably inside a service call
    that does not return until the test lets it: no timing involved."""
    service = tiny_server.service
    real = service.weights_info
    entered, release = threading.Event(), threading.Event()

    def held(*args, **kwargs):
        entered.set()
        assert release.wait(60), "the test never released the held call"
        return real(*args, **kwargs)

    monkeypatch.setattr(service, "weights_info", held)
    headers = {"X-API-Key": API_KEY}
    slow_call = threading.Thread(target=lambda: httpx.post(
        f"{tiny_server.url}/api/v1/weights_info", headers=headers,
        json={"tinker_path": "tinker://nowhere/weights/x"}, timeout=90))
    slow_call.start()
    try:
        assert entered.wait(30), "the slow request never reached the service"
        assert httpx.get(f"{tiny_server.url}/api/v1/healthz", timeout=30).status_code == 200
        assert slow_call.is_alive() and not release.is_set()  # answered while it was held
    finally:
        release.set()
        slow_call.join(90)


def test_a_checkpoint_adapter_is_loaded_once_for_many_samples(tiny_server, service_client,
                                                              base_model, sequences):
    run = new_run(service_client, base_model, seed=12)
    path = run.save_weights_for_sampler("cached").result().path
    before = tiny_server.service.adapters.loads
    params = types.SamplingParams(max_tokens=2, temperature=0.0)
    for _ in range(3):
        sampler = service_client.create_sampling_client(model_path=path)
        sampler.sample(types.ModelInput.from_ints(sequences[0][:4]), 1, params).result()
    assert tiny_server.service.adapters.loads - before == 1
