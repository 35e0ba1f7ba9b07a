"""Runs sharing one server do not affect each other.

Two runs are trained interleaved (their requests queued together, so the scheduler alternates
or fuses them) and compared with each run trained alone on the same server. Without fusion the
results must be bit-identical. With fusion, rows of both runs share padded batches through the
base model, so results may differ only by float rounding: within FUSED_TOLERANCE.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tinker
from tinker import types

from tests.server.server_helpers import (
    API_KEY,
    EngineProbe,
    forward_logprobs,
    new_run,
    sft_datum,
    start_server,
    wait_queued,
)

FUSED_TOLERANCE = 1e-5
STEPS = 3
LR = 1e-2


@pytest.fixture(scope="module")
def unfused_server(tiny_model_dir, tmp_path_factory) -> Iterator:
    server = start_server(tiny_model_dir, tmp_path_factory.mktemp("unfused-data"), fuse=False)
    yield server
    server.stop()


def _datasets(sequences: list[list[int]]) -> dict[str, list[types.Datum]]:
    # Different lengths and row counts, so a fused batch pads one run's rows to the other's.
    return {"a": [sft_datum(sequences[0]), sft_datum(sequences[1])],
            "b": [sft_datum(sequences[2])]}


def _alone(service, base_model, seed, data) -> tuple[list[float], list[np.ndarray]]:
    client = new_run(service, base_model, seed=seed)
    losses = []
    for _ in range(STEPS):
        fb = client.forward_backward(data, "cross_entropy")
        client.optim_step(types.AdamParams(learning_rate=LR)).result()
        losses.append(fb.result().metrics["loss:sum"])
    return losses, forward_logprobs(client, data)


def _interleaved(server, service, base_model, datasets, seeds):
    """Train both runs step by step, each step's requests queued together before any runs."""
    clients = {name: new_run(service, base_model, seed=seeds[name]) for name in datasets}
    holder = new_run(service, base_model, seed=0)
    probe = EngineProbe(server.service.engine)
    losses: dict[str, list[float]] = {name: [] for name in datasets}
    try:
        for _ in range(STEPS):
            probe.arm()
            held = holder.forward([sft_datum([1, 2, 3])], "cross_entropy")
            probe.wait_held()
            futures = {}
            for name, client in clients.items():
                futures[name] = client.forward_backward(datasets[name], "cross_entropy")
                client.optim_step(types.AdamParams(learning_rate=LR))
            wait_queued(server.service.scheduler, {c.model_id: 2 for c in clients.values()})
            probe.release()
            held.result()
            for name, future in futures.items():
                losses[name].append(future.result().metrics["loss:sum"])
        logprobs = {name: forward_logprobs(c, datasets[name]) for name, c in clients.items()}
    finally:
        probe.restore()
    return losses, logprobs, probe.calls


@pytest.mark.parametrize("fused", [False, True], ids=["unfused", "fused"])
def test_interleaved_runs_match_each_run_trained_alone(
    request, base_model, sequences, fused
):
    server = request.getfixturevalue("tiny_server" if fused else "unfused_server")
    datasets = _datasets(sequences)
    seeds = {"a": 21, "b": 22}
    with tinker.ServiceClient(base_url=server.url, api_key=API_KEY) as service:
        alone = {name: _alone(service, base_model, seeds[name], datasets[name])
                 for name in datasets}
        losses, logprobs, calls = _interleaved(server, service, base_model, datasets, seeds)

    if fused:
        assert max(calls) >= 2, f"the two runs were never fused into one batch: {calls}"
    else:
        assert max(calls) == 1, calls
    for name in datasets:
        alone_losses, alone_logprobs = alone[name]
        if fused:
            np.testing.assert_allclose(losses[name], alone_losses, rtol=FUSED_TOLERANCE)
            for got, want in zip(logprobs[name], alone_logprobs, strict=True):
                np.testing.assert_allclose(got, want, atol=FUSED_TOLERANCE)
        else:
            assert losses[name] == alone_losses
            for got, want in zip(logprobs[name], alone_logprobs, strict=True):
                assert np.array_equal(got, want)
