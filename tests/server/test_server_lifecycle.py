"""What a long-running server keeps, and for how long (docs/lifecycle.md).

Ephemeral sampler snapshots are capped per run (the newest kept), freed when their session
ends or stops heartbeating, and freed after a TTL; a freed one answers a clear error and leaves
no file behind. Dedup records stay bounded, and a named checkpoint whose TTL passed is swept.
"""

from __future__ import annotations

import datetime as dt

import httpx
import pytest
import tinker
from tinker import types

from server.service.lifecycle import LifecyclePolicy
from server.service.service import Limits
from server.storage.checkpoints import TinkerPath
from server.storage.spill import spill_path
from tests.server.server_helpers import (
    API_KEY,
    new_run,
    sft_datum,
    start_server,
    wait_until,
)

TIMEOUT = 60


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    policy = LifecyclePolicy(
        snapshots_per_run=2,
        dedup_window=4,
        checkpoint_sweep_seconds=0.5,
        session_timeout_seconds=3600,
    )
    limits = Limits(max_resident_samplers=1, lifecycle=policy)
    server = start_server(tiny_model_dir, tmp_path_factory.mktemp("lifecycle"), limits=limits)
    yield server
    server.stop()


@pytest.fixture
def svc(server):
    with tinker.ServiceClient(base_url=server.url, api_key=API_KEY) as client:
        yield client


def api(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/api/v1{path}", headers={"X-API-Key": API_KEY}, json=body,
                      timeout=TIMEOUT)


def result(server, response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    answer = api(server, "/retrieve_future", {"request_id": response.json()["request_id"]})
    return answer.json()


def sample_raw(server, sampler_id: str, prompt: list[int]) -> httpx.Response:
    return api(server, "/asample", {
        "sampling_session_id": sampler_id,
        "prompt": {"chunks": [{"type": "encoded_text", "tokens": prompt}]},
        "sampling_params": {"max_tokens": 2, "temperature": 0.0},
        "num_samples": 1,
    })


def snapshot_files(server) -> list:
    return sorted(server.service.sampler_cache.spill_dir.glob("*.pt"))


def sampler_id_of(client: tinker.SamplingClient) -> str:
    return client._sampling_session_id




def test_snapshots_are_capped_per_run_and_a_freed_one_says_so(server, svc, base_model,
                                                              sequences):
    run = new_run(svc, base_model, seed=1)
    prompt = sequences[0][:5]
    clients = []
    for _ in range(4):
        run.forward_backward([sft_datum(sequences[0])], "cross_entropy")
        run.optim_step(types.AdamParams(learning_rate=1e-2))
        clients.append(run.save_weights_and_get_sampling_client().result())
        params = types.SamplingParams(max_tokens=2, temperature=0.0)
        clients[-1].sample(types.ModelInput.from_ints(prompt), 1, params).result(TIMEOUT)
    ids = [sampler_id_of(c) for c in clients]
    live = [sid for sid in ids if sid in server.service.samplers]
    assert live == ids[-2:]
    # At most one snapshot stays in memory here, so the other live one is on disk, and the
    # freed ones' files are gone.
    files = snapshot_files(server)
    assert spill_path(server.service.sampler_cache.spill_dir, ids[0]) not in files
    assert spill_path(server.service.sampler_cache.spill_dir, ids[1]) not in files
    with pytest.raises(tinker.APIStatusError) as err:
        clients[0].sample(types.ModelInput.from_ints(prompt), 1,
                          types.SamplingParams(max_tokens=2)).result(TIMEOUT)
    assert err.value.status_code == 404
    assert "freed" in str(err.value) and "newest 2" in str(err.value)


def test_a_session_that_ends_leaves_no_ephemeral_snapshot(server, base_model, sequences):
    with tinker.ServiceClient(base_url=server.url, api_key=API_KEY) as svc:
        run = new_run(svc, base_model, seed=2)
        ids = [sampler_id_of(run.save_weights_and_get_sampling_client().result())
               for _ in range(2)]
        named = run.save_weights_for_sampler("kept").result(TIMEOUT).path
        assert all(sid in server.service.samplers for sid in ids)
    assert not any(sid in server.service.samplers for sid in ids)
    directory = server.service.sampler_cache.spill_dir
    assert not any(spill_path(directory, sid).exists() for sid in ids)
    response = sample_raw(server, ids[-1], sequences[0][:4])
    assert response.status_code == 404 and "session" in response.json()["error"]
    # Named checkpoints outlive the session.
    assert server.service.store.read_meta(TinkerPath.parse(named))


def test_a_session_that_stops_heartbeating_expires_and_frees_its_snapshots(
    server, base_model, sequences, monkeypatch
):
    """A client that vanishes: a session created by hand, which never heartbeats."""
    session_id = api(server, "/create_session", {"tags": []}).json()["session_id"]
    model = result(server, api(server, "/create_model", {
        "session_id": session_id, "model_seq_id": 0, "base_model": base_model,
        "lora_config": {"rank": 4},
    }))
    saved = result(server, api(server, "/save_weights_for_sampler", {
        "model_id": model["model_id"], "seq_id": 1, "sampling_session_seq_id": 0,
    }))
    sampler_id = saved["sampling_session_id"]
    assert sample_raw(server, sampler_id, sequences[0][:4]).status_code == 200

    monkeypatch.setattr(server.service.policy, "session_timeout_seconds", 1.5)
    wait_until(lambda: sampler_id not in server.service.samplers)
    assert not spill_path(server.service.sampler_cache.spill_dir, sampler_id).exists()
    response = sample_raw(server, sampler_id, sequences[0][:4])
    assert response.status_code == 404 and "expired" in response.json()["error"]
    gone = api(server, "/session_heartbeat", {"session_id": session_id})
    assert gone.status_code == 410


def test_unused_snapshots_expire_after_their_ttl(server, svc, base_model, monkeypatch):
    run = new_run(svc, base_model, seed=3)
    sampler_id = sampler_id_of(run.save_weights_and_get_sampling_client().result())
    assert sampler_id in server.service.samplers
    monkeypatch.setattr(server.service.policy, "snapshot_ttl_seconds", 1.0)
    wait_until(lambda: sampler_id not in server.service.samplers)
    assert "unused" in server.service.snapshots.why_freed(sampler_id)


def test_dedup_records_stay_bounded(server, svc, base_model):
    run = new_run(svc, base_model, seed=4)
    for _ in range(12):
        run.optim_step(types.AdamParams(learning_rate=1e-3))
    run.optim_step(types.AdamParams(learning_rate=1e-3)).result(TIMEOUT)
    kept = [seq for rid, seq in server.service._dedup if rid == run.model_id]
    assert len(kept) <= 4, kept  # the window, however far the queue had got at submit time
    assert max(kept) == 13


def test_a_checkpoint_past_its_ttl_is_swept(server, svc, base_model):
    run = new_run(svc, base_model, seed=5)
    path = TinkerPath.parse(run.save_state("short-lived", ttl_seconds=3600).result(TIMEOUT).path)
    past = (dt.datetime.now(dt.UTC) - dt.timedelta(seconds=1)).isoformat()
    server.service.store.update_meta(path, expires_at=past)
    wait_until(lambda: not server.service.store.checkpoint_dir(path).exists())


def test_runs_of_an_ended_session_are_spilled_then_freed(tiny_model_dir, tmp_path, sequences):
    policy = LifecyclePolicy(ended_session_retention_seconds=1.5, session_timeout_seconds=3600)
    server = start_server(tiny_model_dir, tmp_path / "data", limits=Limits(lifecycle=policy))
    try:
        service = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
        run = new_run(service, str(tiny_model_dir), seed=5)
        run.forward_backward([sft_datum(sequences[0])], "cross_entropy").result(TIMEOUT)
        run.optim_step(types.AdamParams(learning_rate=1e-3)).result(TIMEOUT)
        saved = run.save_state("kept").result(TIMEOUT).path
        record = server.service.runs[run.model_id]
        service.close("success").result(TIMEOUT)

        wait_until(lambda: record.state is None and record.spill_path is not None)
        spill = record.spill_path
        assert spill.exists()
        wait_until(lambda: run.model_id not in server.service.runs)
        assert not spill.exists()
        assert run.model_id not in server.service.scheduler.queue_depths()
        assert not [k for k in server.service._dedup if k[0] == run.model_id]
        # What the user saved stays, and still loads into a new run.
        with tinker.ServiceClient(base_url=server.url, api_key=API_KEY) as again:
            restored = again.create_training_client_from_state(saved)
            assert restored.get_info().model_id != run.model_id
        listed = httpx.get(f"{server.url}/api/v1/training_runs", headers={"X-API-Key": API_KEY},
                           timeout=TIMEOUT).json()
        assert run.model_id in [r["training_run_id"] for r in listed["training_runs"]]
    finally:
        server.stop()
