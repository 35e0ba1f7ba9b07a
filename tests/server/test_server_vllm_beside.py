"""vLLM beside the engine in the single process, under the CUDA layout: the server starts the
vLLM it is configured with (here the stand-in, which takes vLLM's command line), sends it every
sample it can serve off the engine thread, and samples the rest on the engine with the reason
logged and counted; a vLLM that stops answering hands its requests back to the engine. All of
it through the SDK, as a client on a GPU box would see it."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path

import httpx
import psutil
import pytest
import tinker
from tinker import types

from server.samplers.colocated import VLLMOptions, wants_vllm
from tests.server.server_helpers import API_KEY, sft_datum, sft_step, start_server
from tools.processes import wait_until

REPO = Path(__file__).resolve().parents[2]


def _metric(url: str, name: str, label: str) -> float:
    text = httpx.get(f"{url}/metrics", headers={"X-API-Key": API_KEY}).text
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and label in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _capabilities(url: str) -> dict:
    answer = httpx.get(f"{url}/api/v1/get_server_capabilities", headers={"X-API-Key": API_KEY})
    return answer.json()["supported_models"][0]


def _standin(port: int) -> psutil.Process:
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "tools.vllm_standin" in cmdline and str(port) in cmdline:
            return process
    raise AssertionError(f"no vLLM stand-in on port {port}")


def _sample(training: tinker.TrainingClient, prompt: list[int]) -> types.SampleResponse:
    sampler = training.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=4, temperature=1.0, seed=3)
    return sampler.sample(types.ModelInput.from_ints(prompt), 2, params).result()


@pytest.fixture(scope="module")
def beside(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    from server.entrypoints.runtime import free_port

    port = free_port()
    options = VLLMOptions(sampler="auto", executable=f"{sys.executable} -m tools.vllm_standin",
                          port=port, max_lora_rank=8, ready_timeout_s=300)
    cwd = Path.cwd()
    os.chdir(REPO)  # the stand-in is a module of this checkout
    try:
        server = start_server(tiny_model_dir, tmp_path_factory.mktemp("beside"), dtype=None,
                              emulate_device="cuda", sampling=options)
    finally:
        os.chdir(cwd)
    yield server, port
    server.stop()


def test_auto_picks_vllm_on_cuda_only_and_says_why_not():
    assert wants_vllm(VLLMOptions(), "cpu") == (False, "vLLM samples on CUDA only; this engine "
                                                       "runs cpu")
    assert wants_vllm(VLLMOptions(executable="python -m x"), "cuda")[0] is True
    assert wants_vllm(VLLMOptions(sampler="torch"), "cuda") == (False, "--sampler torch")
    use, why = wants_vllm(VLLMOptions(), "cuda")
    assert use is False and "vllm package is not installed" in why  # not installed here


def test_a_servable_run_samples_on_vllm_off_the_engine(beside, base_model, tiny_tokenizer):
    server, port = beside
    facts = _capabilities(server.url)
    assert facts["sampling_backend"] == "vllm" and facts["sampler_trainer_bitwise"] is False
    service = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    training = service.create_lora_training_client(base_model=base_model, rank=4, seed=0,
                                                   train_unembed=False).result()
    ids = tiny_tokenizer.encode("select name from users")
    sft_step(training, [sft_datum(ids)])
    before = _metric(server.url, "autoresearch_sample_requests_total", 'backend="vllm"')
    result = _sample(training, ids[:5])
    assert len(result.sequences) == 2 and all(len(s.tokens) == 4 for s in result.sequences)
    assert all(len(s.logprobs) == 4 for s in result.sequences)
    assert _metric(server.url, "autoresearch_sample_requests_total",
                   'backend="vllm"') == before + 1
    served = httpx.get(f"http://127.0.0.1:{port}/v1/models").json()["data"]
    assert any(card.get("parent") for card in served)  # the run's adapter, hot-loaded


def test_runs_vllm_cannot_serve_sample_on_the_engine_counted_by_reason(
        beside, base_model, tiny_tokenizer, caplog):
    server, _ = beside
    service = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    ids = tiny_tokenizer.encode("select count(*) from orders")
    with caplog.at_level(logging.WARNING):
        unembed = service.create_lora_training_client(base_model=base_model, rank=4,
                                                      seed=1).result()  # train_unembed=True
        wide = service.create_lora_training_client(base_model=base_model, rank=16, seed=2,
                                                   train_unembed=False).result()
    said = [r.getMessage() for r in caplog.records if "will sample on the torch engine" in
            r.getMessage()]
    assert any("lm_head" in m for m in said) and any("rank 16 is above the 8" in m for m in said)
    torch_before = _metric(server.url, "autoresearch_sample_requests_total", 'backend="torch"')
    for training, reason in ((unembed, "unservable_modules"), (wide, "rank_over_limit")):
        before = _metric(server.url, "autoresearch_sampler_fallbacks_total", reason)
        assert len(_sample(training, ids[:5]).sequences) == 2
        assert _metric(server.url, "autoresearch_sampler_fallbacks_total", reason) == before + 1
    assert _metric(server.url, "autoresearch_sample_requests_total",
                   'backend="torch"') == torch_before + 2


def test_a_vllm_that_stops_answering_hands_its_requests_to_the_engine(
        beside, base_model, tiny_tokenizer):
    server, port = beside
    service = tinker.ServiceClient(base_url=server.url, api_key=API_KEY)
    training = service.create_lora_training_client(base_model=base_model, rank=4, seed=4,
                                                   train_unembed=False).result()
    ids = tiny_tokenizer.encode("select 1")
    process = _standin(port)
    process.send_signal(signal.SIGKILL)
    wait_until(lambda: not process.is_running() or process.status() == psutil.STATUS_ZOMBIE,
               timeout=30)
    before = _metric(server.url, "autoresearch_sampler_fallbacks_total", "vllm_unavailable")
    assert len(_sample(training, ids).sequences) == 2
    assert _metric(server.url, "autoresearch_sampler_fallbacks_total",
                   "vllm_unavailable") == before + 1


def test_auto_without_vllm_samples_on_the_engine_and_counts_why(tiny_model_dir, tmp_path,
                                                                base_model, caplog):
    with caplog.at_level(logging.INFO):
        server = start_server(tiny_model_dir, tmp_path / "data", dtype=None,
                              emulate_device="cuda", sampling=VLLMOptions(sampler="auto"))
    try:
        assert _capabilities(server.url)["sampling_backend"] == "torch"
        assert _metric(server.url, "autoresearch_sampler_fallbacks_total",
                       "vllm_unavailable") == 1
        assert any("vllm package is not installed" in r.getMessage() for r in caplog.records)
    finally:
        server.stop()
