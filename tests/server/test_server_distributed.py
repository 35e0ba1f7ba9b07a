"""The distributed server: gateways, a trainer worker and a sampler worker over a real Redis.

Every role runs as its own `python -m server <role>` process on the tiny model, and clients
talk to the gateways through the `tinker` SDK (or raw HTTP where a test needs a request id).
The reference for exactness is the single-process server (in process, fusion off, as the
trainer worker runs here), so "the same weights" means bit-for-bit equal logprobs on CPU.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from tinker import types

from tests.server.server_helpers import (
    API_KEY,
    NEEDS_REDIS,
    EngineProbe,
    forward_logprobs,
    new_run,
    output_logprobs,
    sft_datum,
    start_redis,
    start_server,
    wait_queued,
    wait_until,
)
from tools.processes import ServiceProcess, http_status, server_command, without_api_keys

redis = pytest.importorskip("redis", reason="the Python Redis client is not installed (pip "
                                             "install redis)")
pytestmark = NEEDS_REDIS

HEARTBEAT_TTL = 2.0
SAVE_EVERY = 2
STEP_LR = 5e-2
START_TIMEOUT = 240.0
OTHER_KEY = "tml-someone-else"


def _free_port() -> int:
    from server.entrypoints.runtime import free_port

    return free_port()


class Process(ServiceProcess):
    """One server role (`python -m server ROLE ...`) in its own process."""

    def __init__(self, args: list[str], log_path: Path, port: int):
        self.args, self.port = args, port
        super().__init__(server_command(*args, "--port", str(port)), log_path,
                         url=f"http://127.0.0.1:{port}", env=without_api_keys())


@dataclass
class Cluster:
    redis: redis.Redis
    redis_url: str
    data_dir: Path
    gateways: list[Process]
    trainer: Process
    sampler: Process
    trainer_args: list[str]
    logs: Path
    readyz_before_trainer: int | None = None
    extra: list[Process] = field(default_factory=list)

    def restart_trainer(self) -> Process:
        self.trainer = Process(self.trainer_args, self.logs / "trainer-2.log",
                               _free_port()).start()
        self.extra.append(self.trainer)
        return self.trainer

    def wait_gateways(self, expected: int, timeout: float = START_TIMEOUT) -> None:
        for gateway in self.gateways:
            gateway.wait_answers("/readyz", expected, timeout)


@pytest.fixture(scope="module")
def cluster(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("distributed")
    redis_server, url = start_redis(root)
    client = redis.Redis.from_url(url)
    data_dir = root / "data"
    model = ["--model", str(tiny_model_dir), "--device", "cpu", "--dtype", "float32",
             "--data-dir", str(data_dir)]
    common = ["--redis-url", url, "--heartbeat-ttl", str(HEARTBEAT_TTL)]
    trainer_args = ["trainer", *common, *model, "--no-fuse", "--save-every", str(SAVE_EVERY),
                    "--worker-id", "trainer-0"]
    processes: list[Process] = []
    cluster = None
    try:
        gateways = [Process(["gateway", *common], root / f"gateway-{i}.log", _free_port()).start()
                    for i in range(2)]
        sampler = Process(["sampler", *common, *model, "--worker-id", "sampler-0"],
                          root / "sampler.log", _free_port()).start()
        processes += [*gateways, sampler]
        for gateway in gateways:
            gateway.wait_answers("/api/v1/healthz", 200)
        before = http_status(gateways[0].url + "/readyz")
        trainer = Process(trainer_args, root / "trainer-1.log", _free_port()).start()
        processes.append(trainer)
        cluster = Cluster(client, url, data_dir, gateways, trainer, sampler, trainer_args, root,
                          readyz_before_trainer=before)
        cluster.wait_gateways(200)
        sampler.wait_answers("/readyz", 200)
        yield cluster
    finally:
        for process in processes + (cluster.extra if cluster else []):
            process.stop()
        redis_server.terminate()
        redis_server.wait(timeout=30)


@pytest.fixture(scope="module")
def reference_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """The single-process server, configured like the trainer worker (fusion off)."""
    server = start_server(tiny_model_dir, tmp_path_factory.mktemp("reference-data"), fuse=False)
    yield server
    server.stop()


def _sdk(url: str, key: str = API_KEY) -> tinker.ServiceClient:
    return tinker.ServiceClient(base_url=url, api_key=key)


def _data(tiny_tokenizer) -> list[types.Datum]:
    """Two sequences; the first is the prompt the sampling test scores."""
    texts = ["select name from users where id = 1;", "hello world, hello server"]
    return [sft_datum(tiny_tokenizer.encode(t)) for t in texts]


def _post(url: str, path: str, body: dict, key: str = API_KEY) -> dict:
    response = httpx.post(f"{url}/api/v1/{path}", json=body, headers={"X-API-Key": key},
                          timeout=60)
    response.raise_for_status()
    return response.json()


def test_a_gateway_refuses_an_access_grant_by_name(cluster: Cluster) -> None:
    """The SDK sends copy_weights' weights_access_token as a header; the gateway, which alone
    sees headers, refuses it as the single process does, rather than drop it and copy."""
    response = httpx.post(f"{cluster.gateways[0].url}/api/v1/copy_weights",
                          json={"source_path": "tinker://sess-x:train:0/weights/a"},
                          headers={"X-API-Key": API_KEY,
                                   "X-Tinker-Weights-Access-Token": "grant"}, timeout=60)
    assert response.status_code == 400
    assert "weights_access_token" in response.json()["error"]


# ------------------------------------------------------------------ readiness
def test_gateway_is_not_ready_until_a_trainer_heartbeats(cluster: Cluster) -> None:
    assert cluster.readyz_before_trainer == 503
    ready = httpx.get(cluster.gateways[1].url + "/readyz", timeout=5).json()
    [trainer] = ready["trainers"]
    assert trainer.startswith("trainer-0-")  # the given id plus a suffix per life
    assert http_status(cluster.gateways[0].url + "/api/v1/healthz") == 200


def test_single_process_readyz_fails_while_the_engine_is_stuck_with_work_queued(
        reference_server, base_model: str, tiny_tokenizer) -> None:
    scheduler = reference_server.service.scheduler
    assert httpx.get(reference_server.url + "/readyz").status_code == 200
    probe = EngineProbe(reference_server.service.engine)
    try:
        with _sdk(reference_server.url) as svc:
            client = new_run(svc, base_model, seed=3)
            probe.arm()
            held = client.forward_backward(_data(tiny_tokenizer), "cross_entropy")
            probe.wait_held()
            queued = client.forward_backward(_data(tiny_tokenizer), "cross_entropy")
            wait_queued(scheduler, {client.model_id: 1})
            scheduler.stall_limit = 0.3
            time.sleep(0.6)
            stuck = httpx.get(reference_server.url + "/readyz")
            assert stuck.status_code == 503
            assert stuck.json()["status"] == "engine stalled"
            assert httpx.get(reference_server.url + "/api/v1/healthz").status_code == 200
            assert httpx.get(reference_server.url + "/livez").status_code == 200  # not a hang
            scheduler.hang_limit = 0.3
            hung = httpx.get(reference_server.url + "/livez")
            assert hung.status_code == 503 and hung.json()["status"] == "engine hung"
            probe.release()
            held.result(timeout=60)
            queued.result(timeout=60)
            assert httpx.get(reference_server.url + "/readyz").status_code == 200
    finally:
        scheduler.stall_limit, scheduler.hang_limit = 120.0, 1800.0
        probe.restore()


# --------------------------------------------------------------------- futures
def test_a_future_submitted_through_one_gateway_is_retrieved_through_another(
        cluster: Cluster, base_model: str) -> None:
    gateway_a, gateway_b = (g.url for g in cluster.gateways)
    session = _post(gateway_a, "create_session", {"tags": [], "user_metadata": {}})
    submitted = _post(gateway_a, "create_model", {
        "session_id": session["session_id"], "model_seq_id": 0, "base_model": base_model,
        "lora_config": {"rank": 4, "seed": 1}})

    answer = _post(gateway_b, "retrieve_future", {"request_id": submitted["request_id"]})
    while answer.get("type") == "try_again":
        answer = _post(gateway_b, "retrieve_future", {"request_id": submitted["request_id"]})

    assert answer["model_id"] == f"{session['session_id']}:train:0"
    assert _post(gateway_a, "retrieve_future", submitted) == answer  # stored once, read twice
    stranger = _post(gateway_b, "retrieve_future", submitted, key=OTHER_KEY)
    assert stranger["category"] == "user" and "unknown request id" in stranger["error"]
    info = _post(gateway_b, "get_info", {"model_id": answer["model_id"]})
    assert info["lora_rank"] == 4


def test_an_sdk_retry_of_the_same_request_is_executed_once(cluster: Cluster) -> None:
    gateway_a, gateway_b = (g.url for g in cluster.gateways)
    headers = {"X-API-Key": API_KEY, "X-Idempotency-Key": "retry-of-one-request"}
    first = httpx.post(gateway_a + "/api/v1/create_session", json={"tags": ["once"]},
                       headers=headers, timeout=60).json()
    retried = httpx.post(gateway_b + "/api/v1/create_session", json={"tags": ["once"]},
                         headers=headers, timeout=60).json()
    assert retried == first
    listed = httpx.get(gateway_a + "/api/v1/sessions", params={"limit": 1000},
                       headers={"X-API-Key": API_KEY}, timeout=60).json()["sessions"]
    assert listed.count(first["session_id"]) == 1


# ------------------------------------------------------------ end to end
def test_training_and_sampling_end_to_end_through_the_gateways(
        cluster: Cluster, base_model: str, tiny_tokenizer) -> None:
    data = _data(tiny_tokenizer)
    text = "select name from users where id = 1;"
    prompt = types.ModelInput.from_ints(tiny_tokenizer.encode(text))
    with _sdk(cluster.gateways[0].url) as svc:
        client = new_run(svc, base_model, seed=7)
        losses = []
        for _ in range(3):
            fb = client.forward_backward(data, "cross_entropy")
            client.optim_step(types.AdamParams(learning_rate=STEP_LR)).result()
            losses.append(fb.result().metrics["loss:sum"])
        trained = forward_logprobs(client, data)
        sampler = client.save_weights_and_get_sampling_client("end-to-end")
        before = int(cluster.redis.hget("ar:stats", "sampled:sampler-0") or 0)
        response = sampler.sample(prompt, num_samples=2, sampling_params=types.SamplingParams(
            max_tokens=6, temperature=1.0, seed=11)).result()
        scored = sampler.compute_logprobs(prompt).result()
        snapshots = [p for p in (cluster.data_dir / "snapshots").iterdir()
                     if not p.name.startswith(".")]
        assert snapshots and all((p / "adapter_model.safetensors").exists() for p in snapshots)
    # The session ended: its sampling sessions leave Redis and their snapshots the storage.
    session_keys = f"ar:sampler-session:{client.model_id.split(':')[0]}*"
    wait_until(lambda: not any(p.exists() for p in snapshots)
               and not list(cluster.redis.scan_iter(match=session_keys)),
               what="the ended session's snapshots and sampling sessions to be freed")
    with _sdk(cluster.gateways[1].url) as svc:
        base = svc.create_sampling_client(base_model=base_model)
        base_scored = base.compute_logprobs(prompt).result()

    assert losses[-1] < losses[0]
    assert [len(s.tokens) for s in response.sequences] == [6, 6]
    assert int(cluster.redis.hget("ar:stats", "sampled:sampler-0") or 0) >= before + 2
    # The sampler worker scores with exactly the weights the trainer trained.
    np.testing.assert_allclose(np.array(scored[1:], dtype=np.float64), trained[0],
                               rtol=1e-4, atol=1e-5)
    assert sum(scored[1:]) > sum(base_scored[1:])


def _scoring(data: list[types.Datum]) -> list[types.Datum]:
    """The data with zero weights: a forward pass that only reads logprobs."""
    return [types.Datum(model_input=d.model_input,
                        loss_fn_inputs={"target_tokens": d.loss_fn_inputs["target_tokens"],
                                        "weights": [0.0] * d.model_input.length})
            for d in data]


def _reference_run(server_url: str, base_model: str, data: list[types.Datum],
                   steps: int) -> tuple[list[float], list[np.ndarray]]:
    with _sdk(server_url) as svc:
        client = new_run(svc, base_model, seed=5)
        losses = []
        for _ in range(steps):
            fb = client.forward_backward(data, "cross_entropy")
            client.optim_step(types.AdamParams(learning_rate=STEP_LR)).result()
            losses.append(fb.result().metrics["loss:sum"])
        return losses, output_logprobs(client.forward(_scoring(data), "cross_entropy").result())


def _ops_with_path(client: redis.Redis, queue: str, *paths: bytes) -> list[bytes]:
    """Ids of the ops in `queue` (a Redis list) for one of `paths`."""
    return [op_id for op_id in client.lrange(queue, 0, -1)
            if client.hget(f"ar:op:{op_id.decode()}", "path") in paths]


def _post_until_answered(url: str, path: str, body: dict, idempotency_key: str,
                         timeout: float = START_TIMEOUT) -> dict:
    """POST as the SDK does: retry 503s with the same idempotency key."""
    headers = {"X-API-Key": API_KEY, "X-Idempotency-Key": idempotency_key}
    deadline = time.monotonic() + timeout
    while True:
        response = httpx.post(f"{url}/api/v1/{path}", json=body, headers=headers, timeout=60)
        if response.status_code != 503 or time.monotonic() > deadline:
            response.raise_for_status()
            return response.json()
        time.sleep(0.5)


def test_a_trainer_killed_mid_queue_loses_and_duplicates_nothing(
        cluster: Cluster, reference_server, base_model: str, tiny_tokenizer) -> None:
    data = _data(tiny_tokenizer)
    first, second = 3, 3
    ref_losses, ref_logprobs = _reference_run(reference_server.url, base_model, data,
                                              first + second)

    with _sdk(cluster.gateways[0].url) as svc, ThreadPoolExecutor(1) as pool:
        client = new_run(svc, base_model, seed=5)
        losses = []
        for _ in range(first):  # state saved after step 2; step 3 is only in the journal
            fb = client.forward_backward(data, "cross_entropy")
            client.optim_step(types.AdamParams(learning_rate=STEP_LR)).result()
            losses.append(fb.result().metrics["loss:sum"])
        stored = {k: cluster.redis.get(k) for k in cluster.redis.scan_iter("ar:result:*")
                  if not k.endswith(b":n")}

        queued = [(client.forward_backward(data, "cross_entropy"),
                   client.optim_step(types.AdamParams(learning_rate=STEP_LR)))
                  for _ in range(second)]
        scored = client.forward(_scoring(data), "cross_entropy")
        queued[0][0].result(timeout=120)
        [old] = httpx.get(cluster.gateways[1].url + "/readyz", timeout=5).json()["trainers"]
        queue, taken = f"ar:ops:queue:{old}", f"ar:ops:taken:{old}"
        cluster.trainer.send(signal.SIGSTOP)
        # A request reaches the frozen trainer's queue; the trainer dies holding it.
        late = pool.submit(_post_until_answered, cluster.gateways[1].url, "create_session",
                           {"tags": ["late"]}, "late-session")
        deadline = time.monotonic() + 60
        while not _ops_with_path(cluster.redis, taken, b"/create_session"):
            # The frozen trainer's last BLMOVE may still take it; else it is taken for it.
            for op_id in _ops_with_path(cluster.redis, queue, b"/create_session"):
                move = cluster.redis.pipeline(transaction=True)
                move.lrem(queue, 1, op_id).lpush(taken, op_id).execute()
            assert time.monotonic() < deadline, "the request never reached the queue"
            time.sleep(0.05)
        cluster.trainer.send(signal.SIGKILL)
        cluster.wait_gateways(503, timeout=30)

        cluster.restart_trainer()
        cluster.wait_gateways(200)
        losses += [fb.result(timeout=180).metrics["loss:sum"] for fb, _ in queued]
        final = output_logprobs(scored.result(timeout=180))
        late_session = late.result(timeout=180)["session_id"]

    assert losses == ref_losses
    for got, want in zip(final, ref_logprobs, strict=True):
        np.testing.assert_array_equal(got, want)
    # Results stored before the crash were recomputed by the replay but never rewritten.
    assert {k: cluster.redis.get(k) for k in stored} == stored
    assert int(cluster.redis.hget("ar:stats", "duplicate_writes_suppressed") or 0) > 0
    sessions = httpx.get(cluster.gateways[0].url + "/api/v1/sessions", params={"limit": 1000},
                         headers={"X-API-Key": API_KEY}, timeout=60).json()["sessions"]
    assert sessions.count(late_session) == 1
    [new] = httpx.get(cluster.gateways[1].url + "/readyz", timeout=5).json()["trainers"]
    assert new != old and not cluster.redis.exists(queue, taken)  # moved, then taken
    assert cluster.redis.llen(f"ar:ops:taken:{new}") == 0
    assert not _ops_with_path(cluster.redis, f"ar:ops:queue:{new}", b"/forward_backward",
                              b"/optim_step")
