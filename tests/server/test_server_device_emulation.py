"""The CUDA and MPS code paths, run on the CPU: `--emulate-device cuda` and `--emulate-device mps`.

Each emulation loads the tiny random Gemma 3 as the device would (wholly in bf16: weights,
activations, attention and KV cache) and runs the device's default path (invariance off, SDPA
attention, the engine's KV cache in bf16), so the crash a wholly-bf16 model met at its first
sample, and any like it, shows here. Checked under each: the capability flags the device would
report (no bitwise claim without a mechanism); every loss trains; sampling with every parameter;
sampler and trainer within bf16's precision; a request alone and fused within it too; no host
synchronisation inside the layer loop; the SDK's whole surface (the compatibility report)
against a server; and `python -m server --emulate-device ...` from outside.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from server.engine import devices, kv_budget
from server.engine.engine import AdamParams, Engine, ForwardBackwardJob, SampleJob
from server.engine.invariant_attention import PositionCache
from server.engine.jobs import SamplingParams
from server.engine.losses import LOSSES, RECORDED_LOGPROBS, RECORDED_MASK
from server.engine.model_loading import load_base_model
from server.protocol.codec import Datum
from tests.server.server_helpers import API_KEY, start_server
from tests.server.test_server_compat_report import ROW, SUPPORTED_FLOOR
from tests.server.test_server_prefix_sharing import new_state, rl_group, sft_data
from tools import compat_report
from tools.compat_report import Status
from tools.host_syncs import syncs_inside_layers
from tools.processes import ServiceProcess, server_command

DEVICES = ["cuda", "mps"]
LOGPROB_ATOL = 0.1
"""bf16 keeps 8 bits of mantissa and a wholly-bf16 model rounds every activation: the sampler
(a KV cache, one token at a time) and the trainer (whole rows) sum in other orders. On the tiny
model (logits |x| < 4) a logprob moves by a few hundredths; 0.1 nats is the bound."""


@pytest.fixture(scope="module", params=DEVICES)
def emulated(tiny_model_dir, request) -> Engine:
    return Engine(load_base_model(str(tiny_model_dir), emulate=request.param))


def _layers(engine: Engine) -> list[torch.nn.Module]:
    return list(engine.model.model.layers)


def test_an_emulated_device_holds_the_model_wholly_in_bf16_on_the_cpu(emulated):
    assert emulated.layout.emulated and emulated.layout.kind in DEVICES
    assert emulated.device.type == "cpu"
    assert {p.dtype for p in emulated.model.parameters()} == {torch.bfloat16}
    assert emulated.activation_dtype == torch.bfloat16
    seen: list[torch.dtype] = []
    hook = emulated.model.model.layers[0].register_forward_hook(
        lambda _m, _i, out: seen.append((out[0] if isinstance(out, tuple) else out).dtype))
    try:
        emulated.prompt_logprobs(None, [5, 6, 7, 8])
    finally:
        hook.remove()
    assert seen == [torch.bfloat16]


def test_an_emulated_device_claims_no_invariance_it_has_no_mechanism_for(emulated):
    assert not emulated.batch_invariant  # the device's default: no mechanism, so off
    assert not emulated.invariance_guaranteed
    emulated.batch_invariant = True  # forced on, the path runs, but nothing guarantees it
    try:
        assert not emulated.invariance_guaranteed
    finally:
        emulated.batch_invariant = False


def test_the_cpu_claims_invariance_and_the_layout_rules_are_checked(tiny_model_dir):
    cpu = Engine(load_base_model(str(tiny_model_dir), device="cpu", dtype="float32"))
    assert cpu.batch_invariant and cpu.invariance_guaranteed and not cpu.layout.emulated
    with pytest.raises(ValueError, match="cuda, mps"):
        devices.layout_for(torch.device("cpu"), "tpu")
    with pytest.raises(ValueError, match="runs on the cpu"):
        load_base_model(str(tiny_model_dir), device="cuda", emulate="cuda")
    real = devices.layout_for(torch.device("cuda"))
    assert real.wholly_half and real.invariance_mechanism is None and not real.emulated


def test_deterministic_kernels_are_opt_in_on_cuda_and_leave_allocations_unfilled(monkeypatch):
    real = devices.layout_for(torch.device("cuda"))
    monkeypatch.delenv(devices.DETERMINISTIC_ENV, raising=False)
    assert not devices.deterministic_kernels(real)  # the default: throughput first
    assert not devices.deterministic_kernels(devices.layout_for(torch.device("cpu"), "cuda"))
    monkeypatch.setenv(devices.DETERMINISTIC_ENV, "1")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    try:
        assert devices.deterministic_kernels(real)
        assert torch.are_deterministic_algorithms_enabled()
        assert not torch.utils.deterministic.fill_uninitialized_memory
    finally:
        torch.use_deterministic_algorithms(False)
        torch.utils.deterministic.fill_uninitialized_memory = True


def _with_records(data: list[Datum]) -> list[Datum]:
    """`stable_reinforce`'s inputs, as the server fills them from the sampling record."""
    for datum in data:
        lp = datum.inputs["logprobs"]
        datum.inputs[RECORDED_LOGPROBS] = lp.copy()
        datum.inputs[RECORDED_MASK] = (lp != 0).astype(np.float32)
    return data


@pytest.mark.parametrize("loss_fn", sorted(LOSSES))
def test_every_loss_trains_under_emulation(emulated, loss_fn):
    rng = np.random.default_rng(3)
    vocab = emulated.vocab_size
    if loss_fn == "cross_entropy":
        data = sft_data(rng, vocab, 12, [6, 9])
    else:
        data = rl_group(rng, vocab, 12, [6, 9, 4])
        if loss_fn == "stable_reinforce":
            data = _with_records(data)
    config = {"beta": 0.05} if loss_fn == "dro" else {}
    state = new_state(emulated, 5)
    before = {n: t.detach().clone() for n, t in state.adapter.b.items()}
    result = emulated.forward_backward([ForwardBackwardJob(state, data, loss_fn, config, False)])[0]
    assert np.isfinite(result.metrics["loss:sum"])
    assert all(np.all(np.isfinite(out["logprobs"])) for out in result.outputs)
    grads = [t.grad for t in state.adapter.parameters() if t.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert all(t.dtype == torch.float32 for t in state.adapter.parameters())  # LoRA stays fp32
    emulated.optim_step(state, AdamParams(learning_rate=1e-2))
    assert any(not torch.equal(before[n], t) for n, t in state.adapter.b.items())


PARAMS = [
    SamplingParams(max_tokens=12, temperature=1.0, seed=1),
    SamplingParams(max_tokens=12, temperature=0.0),
    SamplingParams(max_tokens=12, temperature=0.7, top_k=5, seed=2),
    SamplingParams(max_tokens=12, temperature=1.3, top_p=0.5, seed=3),
    SamplingParams(max_tokens=12, temperature=1.0, seed=4, stop=["a"]),
    SamplingParams(max_tokens=12, temperature=1.0, seed=5, stop=[7, 8, 9]),
    SamplingParams(max_tokens=1, temperature=1.0, seed=6),
    SamplingParams(max_tokens=0),
]


@pytest.mark.parametrize("with_adapter", [False, True])
def test_sampling_with_every_parameter_under_emulation(emulated, with_adapter):
    adapter = new_state(emulated, 9).adapter if with_adapter else None
    prompt = [5, 6, 7, 8, 9, 10, 11, 12]
    jobs = [SampleJob(adapter, prompt, 3, p) for p in PARAMS]
    jobs.append(SampleJob(adapter, prompt, 2, SamplingParams(max_tokens=4, seed=7),
                          prompt_logprobs=True, topk_prompt_logprobs=3))
    jobs.append(SampleJob(adapter, prompt, 1, SamplingParams(max_tokens=3, seed=8),
                          prompt_logprobs=True, prompt_logprobs_last_n=2))
    results = emulated.sample(jobs)
    for job, result in zip(jobs, results, strict=True):
        assert len(result.sequences) == job.num_samples
        for seq in result.sequences:
            assert len(seq.tokens) == len(seq.logprobs) <= (job.params.max_tokens or 0)
            assert all(np.isfinite(seq.logprobs)) and all(lp <= 0 for lp in seq.logprobs)
            stop = job.params.stop
            if stop and seq.stopped and isinstance(stop[0], int):
                assert seq.tokens[-1] in stop
    assert results[-1].prompt_logprobs is not None
    assert np.isnan(results[-1].prompt_logprobs[: len(prompt) - 2]).all()
    assert np.isfinite(results[-1].prompt_logprobs[-2:]).all()
    ids, lps = results[-2].topk_prompt
    assert ids.shape == lps.shape == (len(prompt), 3)
    greedy = results[1].sequences
    assert greedy[0].tokens == greedy[1].tokens == greedy[2].tokens
    again = emulated.sample([SampleJob(adapter, prompt, 3, PARAMS[0])])[0]
    assert [s.tokens for s in again.sequences] == [s.tokens for s in results[0].sequences]


def test_sampler_and_trainer_agree_within_bf16_under_emulation(emulated):
    state = new_state(emulated, 1)
    prompt = list(range(5, 25))
    result = emulated.sample([SampleJob(state.adapter, prompt, 4,
                                        SamplingParams(max_tokens=16, seed=3))])[0]
    data = []
    for seq in result.sequences:
        full = np.asarray(prompt + seq.tokens, dtype=np.int64)
        data.append(Datum(full[:-1], {"target_tokens": full[1:],
                                      "weights": np.ones(len(full) - 1, np.float32)}))
    trained = emulated.forward_backward([ForwardBackwardJob(state, data, "cross_entropy", {},
                                                            True)])[0]
    gaps = np.concatenate([
        np.abs(out["logprobs"][len(prompt) - 1:] - np.asarray(seq.logprobs, np.float32))
        for seq, out in zip(result.sequences, trained.outputs, strict=True)])
    assert gaps.max() < LOGPROB_ATOL


def test_a_request_alone_and_fused_agree_within_bf16_under_emulation(emulated):
    state, other = new_state(emulated, 1), new_state(emulated, 2)
    prompt = list(range(5, 30))
    wanted = SampleJob(state.adapter, prompt, 1, SamplingParams(max_tokens=1),
                       prompt_logprobs=True)
    alone = emulated.sample([wanted])[0].prompt_logprobs
    fused = emulated.sample([wanted, SampleJob(other.adapter, prompt[:9], 3,
                                               SamplingParams(max_tokens=5, seed=1),
                                               prompt_logprobs=True)])[0].prompt_logprobs
    assert np.nanmax(np.abs(alone - fused)) < LOGPROB_ATOL


def test_no_host_synchronisation_inside_the_layers_on_the_device_path(emulated):
    """Training, prefill and every decode step run their layers without waiting on the device;
    forcing the CPU's invariant path on shows the counter sees what it should."""
    rng = np.random.default_rng(0)
    state = new_state(emulated, 1)
    data = rl_group(rng, emulated.vocab_size, 40, [6, 9, 4])
    jobs = [SampleJob(state.adapter, list(range(5, 45)), 4, SamplingParams(max_tokens=6, seed=1))]
    with syncs_inside_layers(_layers(emulated)) as seen:
        emulated.forward_backward([ForwardBackwardJob(state, data, "ppo", {}, False)])
        emulated.sample(jobs)
    assert dict(seen) == {}
    emulated.batch_invariant = True
    try:
        with syncs_inside_layers(_layers(emulated)) as seen:
            emulated.sample(jobs)
    finally:
        emulated.batch_invariant = False
    assert sum(seen.values()) > 0


def test_decode_width_follows_the_kv_cache_bytes(emulated):
    config = emulated.model.config
    per_row = kv_budget.row_bytes(config, 1024, torch.bfloat16, emulated.vocab_size)
    assert per_row < kv_budget.row_bytes(config, 1024, torch.float32, emulated.vocab_size)
    rows = kv_budget.decode_rows(config, 1024, torch.bfloat16, emulated.vocab_size,
                                 emulated.device, free=int(per_row * 100 / kv_budget.KV_SHARE))
    assert rows == 100
    assert kv_budget.decode_rows(config, 1024, torch.bfloat16, emulated.vocab_size,
                                 emulated.device, free=0) == kv_budget.MIN_DECODE_ROWS
    assert kv_budget.decode_rows(config, 8, torch.bfloat16, emulated.vocab_size,
                                 emulated.device, free=1 << 50) == kv_budget.MAX_DECODE_ROWS


def test_dropping_finished_rows_compacts_the_cache_in_place():
    cache = PositionCache(2, 5, 1, 64, 4, torch.bfloat16, "cpu")
    for k in cache.keys + cache.values:
        k.copy_(torch.arange(5, dtype=torch.bfloat16).view(5, 1, 1, 1).expand_as(k))
    pointers = [t.data_ptr() for t in cache.keys + cache.values]
    cache.batch_select_indices(torch.tensor([1, 3, 4]))
    assert [t.data_ptr() for t in cache.keys + cache.values] == pointers  # no second copy
    assert cache.keys[0][:, 0, 0, 0].tolist() == [1.0, 3.0, 4.0]
    cache.batch_select_indices(torch.tensor([0, 0, 2]))  # a repeat gathers anew
    assert cache.values[1][:, 0, 0, 0].tolist() == [1.0, 1.0, 4.0]


# ------------------------------------------------------------------ the SDK, from outside
@pytest.fixture(scope="module", params=DEVICES)
def emulated_server(tiny_model_dir, tmp_path_factory, request):
    server = start_server(tiny_model_dir, tmp_path_factory.mktemp(f"data-{request.param}"),
                          dtype=None, emulate_device=request.param)
    yield request.param, server
    server.stop()


def test_the_sdks_whole_surface_under_emulation(emulated_server, tmp_path):
    kind, server = emulated_server
    out = tmp_path / "compat.md"
    compat_report.main(["--url", server.url, "--api-key", API_KEY, "--out", str(out),
                        "--timeout", "60", "--model-label", f"tiny Gemma 3, {kind} emulated"])
    statuses: dict[str, str] = {}
    client = None
    for line in out.read_text().splitlines():
        if line.startswith("## "):
            client = line[3:].strip()
        elif client and (match := ROW.match(line)):
            statuses[f"{client}.{match['method']}"] = match["status"]
    failed = sorted(m for m, s in statuses.items() if s == Status.FAILED.value)
    assert failed == []
    assert sum(s == Status.SUPPORTED.value for s in statuses.values()) >= SUPPORTED_FLOOR


def test_the_capabilities_say_what_the_emulated_device_guarantees(emulated_server):
    kind, server = emulated_server
    facts = _capabilities(server.url)
    assert facts["device"] == kind and facts["emulated"] is True
    assert facts["dtype"] == "bfloat16"
    assert facts["batch_invariant"] is False and facts["sampler_trainer_bitwise"] is False
    assert facts["fused_optimizer"] is (kind == "cuda")


def _capabilities(url: str) -> dict:
    """The resident model's facts as the server sends them (the SDK's type drops extra keys)."""
    answer = httpx.get(f"{url}/api/v1/get_server_capabilities", headers={"X-API-Key": API_KEY})
    return answer.json()["supported_models"][0]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize("kind", DEVICES)
def test_python_m_server_emulates_a_device_for_an_sdk_round_trip(tiny_model_dir, tmp_path, kind):
    import tinker

    port = _free_port()
    command = server_command("--model", str(tiny_model_dir), "--emulate-device", kind,
                             "--port", str(port), "--data-dir", str(tmp_path / "data"))
    env = {**os.environ, "AUTORESEARCH_API_KEYS": API_KEY, "HF_HUB_OFFLINE": "1"}
    with ServiceProcess(command, tmp_path / "server.log", f"http://127.0.0.1:{port}", env) as srv:
        srv.wait_answers(timeout=120)
        facts = _capabilities(srv.url)
        assert facts["device"] == kind and facts["emulated"] is True
        with tinker.ServiceClient(base_url=srv.url, api_key=API_KEY) as client:
            trainer = client.create_lora_training_client(
                base_model=str(tiny_model_dir), rank=4).result()
            tokens = list(range(5, 25))
            datum = tinker.Datum(
                model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 19},
            )
            fb = trainer.forward_backward([datum], "cross_entropy").result()
            assert np.isfinite(fb.metrics["loss:sum"])
            trainer.optim_step(tinker.AdamParams(learning_rate=1e-3)).result()
            sampler = trainer.save_weights_and_get_sampling_client("emulated")
            sample = sampler.sample(tinker.ModelInput.from_ints(tokens[:8]), 2,
                                    tinker.SamplingParams(max_tokens=6, seed=1)).result()
            assert len(sample.sequences) == 2
            assert all(len(s.tokens) == len(s.logprobs) for s in sample.sequences)
            state = trainer.save_state("emulated-state").result()
            restored = client.create_training_client_from_state_with_optimizer(state.path)
            assert restored.result().get_info().model_data.model_name


# ------------------------------------------------------------------ models from a directory
def test_a_local_directory_is_served_and_sampled_under_the_hub_name(tiny_model_dir, tmp_path):
    """A gated model (Gemma 3 1B) copied to a local directory is served under the id clients
    use, by the server and by vLLM alike."""
    import tinker

    from server.samplers.vllm_process import serve_command

    name = "google/gemma-3-1b-pt"
    server = start_server(tiny_model_dir, tmp_path / "data", model_name=name,
                          emulate_device="cuda", dtype=None)
    try:
        assert _capabilities(server.url)["model_name"] == name
        with tinker.ServiceClient(base_url=server.url, api_key=API_KEY) as client:
            trainer = client.create_lora_training_client(base_model=name, rank=4)
            sampler = trainer.save_weights_and_get_sampling_client("named")
            sample = sampler.sample(tinker.ModelInput.from_ints([5, 6, 7]), 1,
                                    tinker.SamplingParams(max_tokens=3, seed=1)).result()
            assert len(sample.sequences[0].tokens) == 3
    finally:
        server.stop()
    command, _env = serve_command(tiny_model_dir, served_model_name=name)
    assert command[2] == str(tiny_model_dir)
    assert command[command.index("--served-model-name") + 1] == name


def test_an_unreachable_hub_id_says_how_to_serve_it_from_a_directory(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run(
        server_command("--model", "google/gemma-3-1b-pt", "--device", "cpu", "--port",
                       str(_free_port()), "--data-dir", str(tmp_path / "data")),
        env=env, capture_output=True, text=True, timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode != 0
    assert "--model DIR --model-name google/gemma-3-1b-pt" in done.stderr
    assert "Traceback" not in done.stderr
