"""End to end on the packaged Gemma 3 270M: train, sample, save and load through the SDK."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
import tinker
from tinker import types

from tests.server.server_helpers import API_KEY, forward_logprobs, sft_datum, start_server

pytestmark = pytest.mark.gemma


@pytest.fixture(scope="module")
def gemma_server(tmp_path_factory) -> Iterator:
    server = start_server(None, tmp_path_factory.mktemp("gemma-data"))
    yield server
    server.stop()


def test_gemma_sft_step_sample_and_checkpoint_round_trip(gemma_server):
    from server.engine.model_loading import EMBEDDED_MODEL_NAME

    with tinker.ServiceClient(base_url=gemma_server.url, api_key=API_KEY) as service:
        capabilities = service.get_server_capabilities()
        assert [m.model_name for m in capabilities.supported_models] == [EMBEDDED_MODEL_NAME]
        client = service.create_lora_training_client(base_model=EMBEDDED_MODEL_NAME, rank=8,
                                                     seed=0).result()
        tokenizer = gemma_server.service.engine.tokenizer  # the one the SDK would download
        ids = tokenizer.encode("SELECT name FROM users WHERE id = 1;")
        data = [sft_datum(ids)]

        fb = client.forward_backward(data, "cross_entropy").result()
        client.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        trained = forward_logprobs(client, data)
        assert math.isfinite(fb.metrics["loss:sum"])
        assert -float(np.sum(trained[0])) < fb.metrics["loss:sum"]  # the step lowered the loss

        sampler = client.save_weights_and_get_sampling_client().result()
        prompt = types.ModelInput.from_ints(tokenizer.encode("SELECT"))
        seq = sampler.sample(prompt, 1, types.SamplingParams(max_tokens=4, temperature=1.0,
                                                             seed=0)).result().sequences[0]
        assert 1 <= len(seq.tokens) <= 4
        assert len(seq.logprobs) == len(seq.tokens)
        assert all(lp <= 0 for lp in seq.logprobs)

        path = client.save_state("gemma-step1").result().path
        restored = service.create_training_client_from_state_with_optimizer(path).result()
        for got, want in zip(forward_logprobs(restored, data), trained, strict=True):
            assert np.array_equal(got, want)
