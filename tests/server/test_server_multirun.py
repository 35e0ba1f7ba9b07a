"""Many runs on one accelerator: fusion, eviction, quotas, deletion and metrics, via the SDK.

Every test talks to in-process servers on the tiny random Gemma 3 through the real `tinker`
SDK. To make batches fuse deterministically, a test holds the engine thread on a control action
(`hold_engine`) while clients submit from their own threads, then lets it go: the scheduler
then finds every run's request waiting and takes them in one turn.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import numpy as np
import pytest
import tinker
from prometheus_client.parser import text_string_to_metric_families
from tinker import types

from server.scheduling.scheduler import Work
from server.service.service import Limits
from tests.server.server_helpers import (
    API_KEY,
    EngineProbe,
    forward_logprobs,
    new_run,
    output_logprobs,
    rl_datum,
    sft_datum,
    sft_step,
    start_server,
    wait_queued,
    wait_until,
)

RTOL, ATOL = 1e-4, 1e-5
"""Fused vs solo: the same math up to reassociation in batched matrix products."""
LEARNING_RATE = 5e-3
SAMPLE_LENGTHS = (3, 10, 6)
"""Each run's max_tokens: its rows finish at different steps, so a fused decode drops the
finished rows part-way through and must still match each run sampling alone."""


def sample_params(k: int) -> types.SamplingParams:
    return types.SamplingParams(max_tokens=SAMPLE_LENGTHS[k], temperature=1.0, seed=1234 + k,
                                stop=[])


# ------------------------------------------------------------------ helpers
@contextlib.contextmanager
def hold_engine(server) -> Iterator[None]:
    """Keep the engine thread busy on a control action until the block exits."""
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        entered.set()
        release.wait(timeout=60)

    server.service.scheduler.submit_control(
        Work(None, "hold", lambda *_: None, action=hold, owner="tests")
    )
    if not entered.wait(timeout=30):
        raise TimeoutError("the engine never picked up the hold")
    try:
        yield
    finally:
        release.set()


def metric(server, name: str, labels: dict[str, str] | None = None) -> float:
    return server.service.metrics.registry.get_sample_value(name, labels or {}) or 0.0


def batches_with_several_runs(server, kind: str) -> float:
    """How many `kind` batches carried more than one run (from the batch_runs histogram)."""
    total = metric(server, "autoresearch_batch_runs_count", {"kind": kind})
    single = metric(server, "autoresearch_batch_runs_bucket", {"kind": kind, "le": "1.0"})
    return total - single


def sft_data(sequences: list[list[int]], shift: int) -> list[types.Datum]:
    return [sft_datum(ids[shift:]) for ids in sequences]


def rl_data(sequences: list[list[int]], advantages: list[float]) -> list[types.Datum]:
    """Synthetic rollouts: fixed prompt/completion tokens and made-up sampler logprobs."""
    out = []
    for k, adv in enumerate(advantages):
        prompt = sequences[k % len(sequences)][:5]
        completion = sequences[(k + 1) % len(sequences)][2 : 9 + k]
        lps = [-1.5 - 0.1 * i for i in range(len(completion))]
        out.append(rl_datum(prompt, completion, lps, adv))
    return out


@dataclass
class RunPlan:
    """One run of the fusion scenario: its LoRA rank, seed, loss and data."""

    rank: int
    seed: int
    loss_fn: str
    data: list[types.Datum]
    loss_fn_config: dict[str, float] | None = None


@dataclass
class StepRecord:
    losses: list[float]
    logprobs: list[list[np.ndarray]]


def plans(sequences: list[list[int]]) -> list[RunPlan]:
    return [
        RunPlan(4, 21, "cross_entropy", sft_data(sequences, 0)),
        RunPlan(8, 22, "importance_sampling", rl_data(sequences, [1.0, -0.5, 2.0])),
        RunPlan(16, 23, "ppo", rl_data(sequences, [-1.0, 1.5])),
    ]


def train_step(client: tinker.TrainingClient, plan: RunPlan) -> tuple[float, list[np.ndarray]]:
    fb = client.forward_backward(plan.data, plan.loss_fn, plan.loss_fn_config)
    opt = client.optim_step(types.AdamParams(learning_rate=LEARNING_RATE))
    result = fb.result()
    opt.result()
    return result.metrics["loss:sum"], output_logprobs(result)


def run_ids(clients: list[tinker.TrainingClient]) -> list[str]:
    return [c.model_id for c in clients]


# ----------------------------------------------------------------- servers
@pytest.fixture(scope="module")
def fused_server(tiny_model_dir, tmp_path_factory):
    server = start_server(tiny_model_dir, tmp_path_factory.mktemp("fused"), fuse=True)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def solo_server(tiny_model_dir, tmp_path_factory):
    server = start_server(tiny_model_dir, tmp_path_factory.mktemp("solo"), fuse=False)
    yield server
    server.stop()


def _service(server) -> tinker.ServiceClient:
    return tinker.ServiceClient(base_url=server.url, api_key=API_KEY)


# ------------------------------------------------------------------ fusion
def _fused_scenario(server, base_model, run_plans, steps):
    """Each step: hold the engine, let every run submit from its own thread, release."""
    with _service(server) as svc, ThreadPoolExecutor(len(run_plans)) as pool:
        clients = [new_run(svc, base_model, seed=p.seed, rank=p.rank) for p in run_plans]
        records = [StepRecord([], []) for _ in run_plans]
        for _ in range(steps):
            with hold_engine(server):
                futures = [pool.submit(train_step, c, p) for c, p in zip(clients, run_plans,
                                                                          strict=True)]
                # forward_backward and optim_step of every run are queued behind the hold.
                wait_queued(server.service.scheduler, dict.fromkeys(run_ids(clients), 2))
            for record, future in zip(records, futures, strict=True):
                loss, lps = future.result(timeout=60)
                record.losses.append(loss)
                record.logprobs.append(lps)
        samplers = [c.save_weights_and_get_sampling_client().result() for c in clients]
        prompt = types.ModelInput.from_ints(run_plans[0].data[0].model_input.to_ints()[:6])
        with hold_engine(server):
            sample_futures = [
                pool.submit(lambda s, k: s.sample(prompt, 3, sample_params(k)).result(), s, k)
                for k, s in enumerate(samplers)
            ]
            wait_until(lambda: server.service.scheduler.queue_depths()["_sampling"] == 3,
                       what="three sample requests queued")
        samples = [f.result(timeout=60).sequences for f in sample_futures]
    return records, samples


def _solo_scenario(server, base_model, run_plans, steps):
    """Each run alone, one after another, on a server that never fuses."""
    records, samples = [], []
    with _service(server) as svc:
        for k, plan in enumerate(run_plans):
            client = new_run(svc, base_model, seed=plan.seed, rank=plan.rank)
            record = StepRecord([], [])
            for _ in range(steps):
                loss, lps = train_step(client, plan)
                record.losses.append(loss)
                record.logprobs.append(lps)
            records.append(record)
            sampler = client.save_weights_and_get_sampling_client().result()
            prompt = types.ModelInput.from_ints(run_plans[0].data[0].model_input.to_ints()[:6])
            samples.append(sampler.sample(prompt, 3, sample_params(k)).result().sequences)
    return records, samples


def test_fused_runs_of_different_ranks_and_losses_match_each_run_trained_alone(
    fused_server, solo_server, base_model, sequences
):
    run_plans = plans(sequences)
    fused_before = batches_with_several_runs(fused_server, "train")
    sampled_before = batches_with_several_runs(fused_server, "sample")

    fused, fused_samples = _fused_scenario(fused_server, base_model, run_plans, steps=3)
    solo, solo_samples = _solo_scenario(solo_server, base_model, run_plans, steps=3)

    # Every step's forward_backward was one batch of all three runs.
    assert batches_with_several_runs(fused_server, "train") - fused_before >= 3
    assert batches_with_several_runs(fused_server, "sample") - sampled_before >= 1
    assert batches_with_several_runs(solo_server, "train") == 0
    for plan, f, s in zip(run_plans, fused, solo, strict=True):
        np.testing.assert_allclose(f.losses, s.losses, rtol=RTOL, atol=ATOL,
                                   err_msg=f"{plan.loss_fn} rank {plan.rank}")
        for f_step, s_step in zip(f.logprobs, s.logprobs, strict=True):
            for f_row, s_row in zip(f_step, s_step, strict=True):
                np.testing.assert_allclose(f_row, s_row, rtol=RTOL, atol=ATOL)
        # Training moved the run: a wrong adapter routing could not hide behind a no-op.
        assert not np.allclose(f.logprobs[0][0], f.logprobs[-1][0], atol=1e-3)
    for length, f_seqs, s_seqs in zip(SAMPLE_LENGTHS, fused_samples, solo_samples, strict=True):
        assert [len(q.tokens) for q in f_seqs] == [length] * 3
        assert [list(q.tokens) for q in f_seqs] == [list(q.tokens) for q in s_seqs]
        for fq, sq in zip(f_seqs, s_seqs, strict=True):
            np.testing.assert_allclose(fq.logprobs, sq.logprobs, rtol=RTOL, atol=ATOL)
    # The three runs ended with different adapters, so they sample differently.
    assert len({tuple(tuple(q.tokens) for q in seqs) for seqs in fused_samples}) > 1


# ---------------------------------------------------------------- eviction
class GaugeSampler:
    """Polls the resident-adapters gauge on a thread and keeps the maximum seen."""

    def __init__(self, server):
        self.server = server
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, metric(self.server, "autoresearch_resident_adapters"))
            time.sleep(0.002)

    def __enter__(self) -> GaugeSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _eviction_scenario(server, base_model, sequences, between: Callable[[], None]):
    """Run A: a full step, then gradients accumulated; `between`; then its optimizer step."""
    data_a, data_b = sft_data(sequences, 0), sft_data(sequences, 1)
    with _service(server) as svc:
        run_a = new_run(svc, base_model, seed=31, rank=8)
        sft_step(run_a, data_a, lr=LEARNING_RATE)
        run_a.forward_backward(data_a[:2], "cross_entropy").result()
        run_b = between(svc)
        run_a.optim_step(types.AdamParams(learning_rate=LEARNING_RATE)).result()
        sft_step(run_a, data_a, lr=LEARNING_RATE)  # AdamW moments from before the eviction
        after_a = forward_logprobs(run_a, data_a)
        after_b = forward_logprobs(run_b, data_b) if run_b is not None else None
    return after_a, after_b


def _use_run_b(base_model, sequences):
    def between(svc):
        run_b = new_run(svc, base_model, seed=32, rank=4)
        sft_step(run_b, sft_data(sequences, 1), lr=LEARNING_RATE)
        return run_b

    return between


def assert_bitwise_equal(got: list[np.ndarray], want: list[np.ndarray]) -> None:
    for g, w in zip(got, want, strict=True):
        assert np.array_equal(g, w), np.max(np.abs(g - w))


def test_capped_residency_evicts_and_reloads_weights_gradients_and_adam_state_exactly(
    solo_server, tiny_model_dir, base_model, sequences, tmp_path
):
    capped = start_server(tiny_model_dir, tmp_path, fuse=False,
                          limits=Limits(max_resident_runs=1))
    try:
        with GaugeSampler(capped) as gauge:
            got_a, got_b = _eviction_scenario(capped, base_model, sequences,
                                              _use_run_b(base_model, sequences))
        evictions = metric(capped, "autoresearch_evictions_total")
    finally:
        capped.stop()
    want_a, want_b = _eviction_scenario(solo_server, base_model, sequences,
                                        _use_run_b(base_model, sequences))

    # A left for B, came back for its optim_step (B left), and B came back at the end.
    assert evictions >= 3
    assert gauge.peak == 1
    assert_bitwise_equal(got_a, want_a)
    assert_bitwise_equal(got_b, want_b)


def test_old_sampler_snapshots_wait_on_disk_and_sample_exactly_as_before(
    tiny_model_dir, base_model, sequences, tmp_path
):
    """An RL loop takes a snapshot per step; only the newest few keep their weights in memory."""
    server = start_server(tiny_model_dir, tmp_path, fuse=False,
                          limits=Limits(max_resident_samplers=2))
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=5, stop=[])
    prompt = types.ModelInput.from_ints(sequences[0][:5])

    def draw(sampler) -> list[tuple[list[int], list[float]]]:
        result = sampler.sample(prompt, 2, params).result()
        return [(list(q.tokens), list(q.logprobs)) for q in result.sequences]

    try:
        with _service(server) as svc:
            run = new_run(svc, base_model, seed=41, rank=4)
            samplers, first_draws = [], []
            for step in range(4):
                sft_step(run, sft_data(sequences, step % 2), lr=LEARNING_RATE)
                samplers.append(run.save_weights_and_get_sampling_client())
                first_draws.append(draw(samplers[-1]))
            cache = server.service.sampler_cache
            assert cache.resident_count() == 2 and cache.evictions == 2
            assert len(list((tmp_path / ".spill" / "samplers").glob("*.pt"))) == 2
            assert metric(server, "autoresearch_resident_sampler_snapshots") == 2
            # The oldest snapshot comes back from disk and samples exactly as it did.
            assert draw(samplers[0]) == first_draws[0]
            assert cache.resident_count() == 2
            assert draw(samplers[3]) == first_draws[3]
            assert first_draws[0] != first_draws[3]  # the snapshots really differ
    finally:
        server.stop()


def test_idle_runs_are_spilled_after_the_ttl_and_resume_bit_for_bit(
    solo_server, tiny_model_dir, base_model, sequences, tmp_path
):
    server = start_server(tiny_model_dir, tmp_path, fuse=False,
                          limits=Limits(idle_evict_seconds=0.2))
    server.service.scheduler.maintenance_seconds = 0.1

    def wait_for_eviction(svc):
        # Wait for the run to be out of memory, not for the first eviction: on a loaded machine
        # a pause of more than the TTL between the scenario's own requests already evicts (and
        # the next request reloads) the run, so the counter alone can be ahead of this point.
        wait_until(lambda: metric(server, "autoresearch_evictions_total") >= 1
                   and metric(server, "autoresearch_resident_adapters") == 0, timeout=10,
                   what="the idle run to be evicted")
        assert list((tmp_path / ".spill").glob("*.pt"))
        return None

    try:
        got_a, _ = _eviction_scenario(server, base_model, sequences, wait_for_eviction)
    finally:
        server.stop()
    want_a, _ = _eviction_scenario(solo_server, base_model, sequences, lambda svc: None)
    assert_bitwise_equal(got_a, want_a)


# ------------------------------------------------------- quotas and back-pressure
def test_run_quota_refuses_the_next_run_at_once_and_leaves_other_keys_alone(
    tiny_model_dir, base_model, tmp_path
):
    server = start_server(tiny_model_dir, tmp_path, api_keys="tml-alpha,tml-beta",
                          limits=Limits(max_runs_per_key=1))
    try:
        with tinker.ServiceClient(base_url=server.url, api_key="tml-alpha") as alpha, \
                tinker.ServiceClient(base_url=server.url, api_key="tml-beta") as beta:
            new_run(alpha, base_model, seed=1)
            with pytest.raises(tinker.APIStatusError) as refused:
                new_run(alpha, base_model, seed=2)
            assert refused.value.status_code == 429
            assert isinstance(refused.value, tinker.RateLimitError)
            assert "limit" in str(refused.value)
            other = new_run(beta, base_model, seed=3)
            assert other.get_info().model_data.model_name == base_model
        # Refused once: the SDK did not retry the refusal (each retry would count again).
        assert metric(server, "autoresearch_backpressure_rejections_total",
                      {"reason": "max_runs"}) == 1
    finally:
        server.stop()


def test_queued_token_limit_pushes_back_and_the_sdk_resubmits_until_all_succeed(
    tiny_model_dir, base_model, sequences, tmp_path
):
    data = [sft_datum(sequences[0])]
    tokens = data[0].model_input.length
    # Room for two requests of this key in the queue at once.
    server = start_server(tiny_model_dir, tmp_path,
                          limits=Limits(max_queued_tokens_per_key=2 * tokens + 1))
    per_run = 3
    try:
        with _service(server) as svc, ThreadPoolExecutor(2) as pool:
            clients = [new_run(svc, base_model, seed=s) for s in (41, 42)]

            def burst(client):
                futures = [client.forward_backward(data, "cross_entropy")
                           for _ in range(per_run)]
                return [f.result().metrics["loss:sum"] for f in futures]

            with hold_engine(server):
                bursts = [pool.submit(burst, c) for c in clients]
                wait_until(lambda: metric(server, "autoresearch_backpressure_rejections_total",
                                          {"reason": "queued_tokens"}) >= 1,
                           what="a back-pressure refusal")
            losses = [b.result(timeout=90) for b in bursts]
    finally:
        server.stop()
    # Every request ran exactly once, in order: without an optim_step each sees the same loss.
    for run_losses in losses:
        assert len(run_losses) == per_run
        np.testing.assert_allclose(run_losses, run_losses[0], rtol=1e-6)


# ---------------------------------------------------------------- deletion
def test_deleting_a_run_fails_its_queued_requests_and_spares_the_run_in_the_engine(
    fused_server, base_model, sequences
):
    data = sft_data(sequences, 0)
    probe = EngineProbe(fused_server.service.engine)
    try:
        with _service(fused_server) as svc:
            slow, doomed = new_run(svc, base_model, seed=51), new_run(svc, base_model, seed=52)
            probe.arm()
            slow_future = slow.forward_backward(data, "cross_entropy")
            probe.wait_held()
            doomed_futures = [doomed.forward_backward(data, "cross_entropy") for _ in range(3)]
            wait_queued(fused_server.service.scheduler, {doomed.model_id: 3})

            response = httpx.delete(f"{fused_server.url}/api/v1/training_runs/{doomed.model_id}",
                                    headers={"X-API-Key": API_KEY}, timeout=10)
            assert response.status_code == 204
            assert doomed.model_id not in fused_server.service.scheduler.queue_depths()
            probe.release()

            for future in doomed_futures:
                with pytest.raises(tinker.RequestFailedError) as failed:
                    future.result(timeout=30)
                assert failed.value.category == types.RequestErrorCategory.User
                assert "deleted" in failed.value.message
            slow_result = slow_future.result(timeout=30)
            # The surviving run computed what it computes alone, and keeps training.
            again = forward_logprobs(slow, data)
            for got, want in zip(output_logprobs(slow_result), again, strict=True):
                np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
            slow.optim_step(types.AdamParams(learning_rate=LEARNING_RATE)).result(timeout=30)
    finally:
        probe.restore()


# ----------------------------------------------------------------- metrics
DOCUMENTED_METRICS = {
    "autoresearch_queue_depth", "autoresearch_sampling_queue_depth", "autoresearch_batch_rows",
    "autoresearch_batch_runs", "autoresearch_tokens_total", "autoresearch_tokens_per_second",
    "autoresearch_engine_duty_cycle", "autoresearch_resident_adapters",
    "autoresearch_evictions_total", "autoresearch_requests_total",
    "autoresearch_backpressure_rejections_total",
}


def test_metrics_endpoint_exposes_the_documented_series_and_a_duty_cycle_fraction(
    fused_server, base_model, sequences
):
    with _service(fused_server) as svc:
        client = new_run(svc, base_model, seed=61)
        sft_step(client, sft_data(sequences, 0))
        sampler = client.save_weights_and_get_sampling_client().result()
        sampler.sample(types.ModelInput.from_ints(sequences[0][:4]), 2, sample_params(1)).result()

        text = httpx.get(f"{fused_server.url}/metrics", timeout=10).text
        names, values = set(), {}
        for family in text_string_to_metric_families(text):
            names.add(family.name)
            for sample in family.samples:
                names.add(sample.name)
                values[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value

    assert names >= DOCUMENTED_METRICS, DOCUMENTED_METRICS - names
    duty = values[("autoresearch_engine_duty_cycle", ())]
    assert 0.0 < duty <= 1.0
    assert values[("autoresearch_queue_depth", (("run_id", client.model_id),))] == 0
    assert values[("autoresearch_tokens_total", (("kind", "train"),))] > 0
    assert values[("autoresearch_tokens_total", (("kind", "sample"),))] > 0
    assert values[("autoresearch_requests_total",
                   (("kind", "forward_backward"), ("outcome", "ok")))] >= 1
