"""What the server reports is true: loss sums do not depend on batch-mates, and get_info and
the capabilities say what the resident base model really is."""

from __future__ import annotations

import httpx
import numpy as np

from tests.server.server_helpers import API_KEY, new_run, rl_datum


def test_dro_loss_of_a_datum_does_not_depend_on_its_batch_mates(service_client, base_model,
                                                                sequences):
    run = new_run(service_client, base_model, seed=9)
    short = rl_datum(sequences[1][:3], sequences[1][3:8], [-1.5] * 5, 0.5)
    long = rl_datum(sequences[2][:4], sequences[2][4:40], [-2.0] * 36, -0.25)
    config = {"beta": 0.5}

    def loss(data) -> float:
        return run.forward(data, "dro", loss_fn_config=config).result().metrics["loss:sum"]

    alone = loss([short]) + loss([long])
    together = loss([short, long])
    np.testing.assert_allclose(together, alone, rtol=1e-5)


def test_get_info_and_capabilities_describe_the_resident_model(tiny_server, service_client,
                                                              base_model):
    run = new_run(service_client, base_model, seed=10)
    headers = {"X-API-Key": API_KEY}
    info = httpx.post(f"{tiny_server.url}/api/v1/get_info", headers=headers,
                      json={"model_id": run.model_id}).json()
    assert info["model_data"]["dtype"] == "float32"
    assert "served as float32" in info["model_data"]["base_model_origin"]
    assert info["model_data"]["dtype_reason"] == "requested with --dtype float32"
    caps = httpx.get(f"{tiny_server.url}/api/v1/get_server_capabilities", headers=headers).json()
    model = caps["supported_models"][0]
    assert model["dtype"] == "float32" and model["base_model_origin"]
    assert model["dtype_reason"] == info["model_data"]["dtype_reason"]
    # The default engine is batch-invariant, and says so (its sampler and trainer agree to the bit).
    assert model["batch_invariant"] is True and model["sampler_trainer_bitwise"] is True
    assert info["model_data"]["batch_invariant"] is True and model["threads"] >= 1
    # The CPU keeps the per-tensor AdamW its bitwise references use; one sampler, the engine.
    assert model["fused_optimizer"] is False and model["sampling_backend"] == "torch"
