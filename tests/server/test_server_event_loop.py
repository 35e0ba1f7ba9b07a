"""Slow service work (disk reads, decoding) never stalls the HTTP event loop, and a
checkpoint's adapter is read from disk once however often it is named."""

from __future__ import annotations

import threading
import time

import httpx
from tinker import types

from tests.server.server_helpers import API_KEY, new_run


def test_a_slow_request_does_not_stall_other_requests(tiny_server, monkeypatch):
    service = tiny_server.service
    real = service.weights_info

    def slow(*args, **kwargs):
        time.sleep(3.0)
        return real(*args, **kwargs)

    monkeypatch.setattr(service, "weights_info", slow)
    headers = {"X-API-Key": API_KEY}
    slow_call = threading.Thread(target=lambda: httpx.post(
        f"{tiny_server.url}/api/v1/weights_info", headers=headers,
        json={"tinker_path": "tinker://nowhere/weights/x"}, timeout=30))
    slow_call.start()
    time.sleep(0.3)
    started = time.monotonic()
    assert httpx.get(f"{tiny_server.url}/api/v1/healthz", timeout=30).status_code == 200
    assert time.monotonic() - started < 1.5
    slow_call.join()


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
