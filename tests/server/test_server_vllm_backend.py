"""The vLLM sampling backend, against a fake OpenAI-compatible server (no GPU, no vLLM).

`FakeVLLM` answers the routes the backend uses the way `vllm serve` does: `/v1/models`,
`/v1/load_lora_adapter`, `/v1/unload_lora_adapter` and `/v1/completions`. Its completions come
from a toy language model (deterministic logits per context and adapter), sampled under the
request's temperature, top-k, seed and stop rules, so token ids, logprobs and stop reasons can be
checked against what the fake really generated. It reports logprobs as vLLM does with
`--logprobs-mode processed_logprobs` (tempered) or, when asked, `raw_logprobs`, so the start-up
probe is tested against both. Every request is recorded.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import zlib
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from server.engine.engine import DEFAULT_MAX_TOKENS, Engine, SampleJob, SamplingParams
from server.engine.lora import AdapterWeights, LoraSpec, RowGroup, routing
from server.engine.model_loading import load_base_model
from server.protocol.codec import SampleResult
from server.samplers import SampleBatchError, VLLMSampler, make_sampler
from server.samplers.adapters import AdapterPublisher
from server.samplers.completions import completion_body, stop_fields
from server.samplers.openai_http import OpenAICompatClient, VLLMError, VLLMUnavailable
from server.samplers.semantics import REQUIRED_FLAG, SemanticsError
from server.samplers.vllm_process import serve_command
from server.storage.checkpoints import adapter_tensors

BASE = "google/gemma-3-270m"
VOCAB = 32
EOS = 1
SPECIAL = {0: "<pad>", 1: "<eos>", 2: "<bos>", 3: "<unk>"}


# ------------------------------------------------------------------ the fake server
def _log_softmax(x: np.ndarray) -> np.ndarray:
    finite = x[np.isfinite(x)]
    top = finite.max()
    return x - (top + math.log(np.exp(finite - top).sum()))


class FakeVLLM:
    """An in-memory OpenAI-compatible server over a toy model; see the module docstring."""

    def __init__(self, mode: str = "processed_logprobs", temper_prompt: bool = False):
        self.mode, self.temper_prompt = mode, temper_prompt
        self.loaded: dict[str, str] = {}
        self.requests: list[tuple[str, dict]] = []
        self.generated: list[list[int]] = []
        self.fail_prompts: dict[tuple[int, ...], int] = {}
        self.connect_failures = 0
        self.barrier: threading.Barrier | None = None
        self._lock = threading.Lock()

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handle)

    def bodies(self, route: str) -> list[dict]:
        return [body for path, body in self.requests if path == route]

    # ---- the toy model
    def logits(self, model: str, context: list[int]) -> np.ndarray:
        key = zlib.crc32(json.dumps([model, context]).encode())
        return np.random.default_rng(key).normal(size=VOCAB) * 2.0

    @staticmethod
    def text(tokens: list[int], skip_special: bool) -> str:
        return "".join(("" if skip_special else SPECIAL[t]) if t in SPECIAL
                       else chr(ord("a") + t % 26) for t in tokens)

    # ---- routing
    def handle(self, request: httpx.Request) -> httpx.Response:
        with self._lock:
            if self.connect_failures > 0:
                self.connect_failures -= 1
                raise httpx.ConnectError("connection refused", request=request)
            body = json.loads(request.content) if request.content else {}
            self.requests.append((request.url.path, body))
        route = request.url.path
        if route == "/v1/models":
            cards = [{"id": BASE, "object": "model", "parent": None}]
            cards += [{"id": n, "object": "model", "parent": BASE} for n in self.loaded]
            return httpx.Response(200, json={"object": "list", "data": cards})
        if route == "/v1/load_lora_adapter":
            return self.load(body)
        if route == "/v1/unload_lora_adapter":
            if body["lora_name"] not in self.loaded:
                return self.error(404, f"The lora adapter '{body['lora_name']}' cannot be found.")
            del self.loaded[body["lora_name"]]
            return httpx.Response(200, text="Success")
        if route == "/v1/completions":
            return self.complete(body)
        return httpx.Response(404, json={"detail": "Not Found"})

    @staticmethod
    def error(status: int, message: str) -> httpx.Response:
        return httpx.Response(status, json={"object": "error", "message": message,
                                            "type": "Error", "code": status})

    def load(self, body: dict) -> httpx.Response:
        name, path = body["lora_name"], Path(body["lora_path"])
        if name in self.loaded:
            return self.error(400, f"The lora adapter '{name}' has already been loaded.")
        if not (path / "adapter_config.json").is_file() or not (
                path / "adapter_model.safetensors").is_file():
            return self.error(404, f"No adapter found for {path}")
        load_file(str(path / "adapter_model.safetensors"))  # as vLLM would read it
        self.loaded[name] = str(path)
        return httpx.Response(200, text=f"Success: LoRA adapter '{name}' added successfully.")

    def complete(self, body: dict) -> httpx.Response:
        model = body["model"]
        if model != BASE and model not in self.loaded:
            return self.error(404, f"The model `{model}` does not exist.")
        prompt = body["prompt"]
        if isinstance(prompt, str):
            prompt = [4 + b % (VOCAB - 4) for b in prompt.encode()]
        status = self.fail_prompts.get(tuple(prompt))
        if status is not None:
            return self.error(status, "injected failure")
        if self.barrier is not None:
            self.barrier.wait(timeout=5)
        choices = [self.generate(model, prompt, body, i) for i in range(body.get("n", 1))]
        if body.get("prompt_logprobs") is not None:
            rows = self.prompt_logprobs(model, prompt, body)
            for choice in choices:
                choice["prompt_logprobs"] = rows
        return httpx.Response(200, json={"id": "cmpl-1", "object": "text_completion",
                                         "model": model, "choices": choices})

    def distribution(self, logits: np.ndarray, body: dict) -> np.ndarray:
        """Log-probabilities the fake samples from (temperature and top-k), vLLM style."""
        temperature = body.get("temperature", 1.0)
        scaled = logits / temperature if temperature > 0 else logits.copy()
        top_k = body.get("top_k", -1)
        if temperature > 0 and 0 < top_k < VOCAB:
            scaled[scaled < np.sort(scaled)[-top_k]] = -np.inf
        return _log_softmax(scaled)

    def generate(self, model: str, prompt: list[int], body: dict, index: int) -> dict:
        seed = body.get("seed")
        rng = np.random.default_rng(None if seed is None else [seed, index])
        stop_ids = set(body.get("stop_token_ids") or [])
        stops = body.get("stop") or []
        skip_special = body.get("skip_special_tokens", True)
        tokens: list[int] = []
        values: list[float] = []
        tops: list[dict[str, float]] = []
        reason = "length"
        while len(tokens) < body["max_tokens"]:
            logits = self.logits(model, prompt + tokens)
            processed = self.distribution(logits, body)
            if body.get("temperature", 1.0) == 0:
                token = int(np.argmax(logits))
            else:
                token = int(rng.choice(VOCAB, p=np.exp(processed)))
            reported = processed if self.mode == "processed_logprobs" else _log_softmax(logits)
            tokens.append(token)
            values.append(float(reported[token]))
            best = np.argsort(-reported)[: body.get("logprobs") or 0]
            tops.append({f"token_id:{t}": float(reported[t]) for t in [*best, token]})
            if token == EOS and not body.get("ignore_eos", False):
                reason = "stop"
                break
            if token in stop_ids or any(s in self.text(tokens, skip_special) for s in stops):
                reason = "stop"
                break
        self.generated.append(tokens)
        return {
            "index": index,
            "text": self.text(tokens, True),
            "logprobs": {"tokens": [f"token_id:{t}" for t in tokens], "token_logprobs": values,
                         "top_logprobs": tops, "text_offset": list(range(len(tokens)))},
            "finish_reason": reason,
            "stop_reason": None,
        }

    def prompt_logprobs(self, model: str, prompt: list[int], body: dict) -> list:
        rows: list = [None]
        k = body["prompt_logprobs"]
        for i in range(1, len(prompt)):
            logits = self.logits(model, prompt[:i])
            if self.temper_prompt and body.get("temperature", 1.0) > 0:
                logits = logits / body["temperature"]
            lp = _log_softmax(logits)
            order = list(np.argsort(-lp))
            row = {str(prompt[i]): {"logprob": float(lp[prompt[i]]),
                                    "rank": order.index(prompt[i]) + 1, "decoded_token": "x"}}
            for rank, t in enumerate(order[:k], start=1):
                row[str(t)] = {"logprob": float(lp[t]), "rank": rank, "decoded_token": "x"}
            rows.append(row)
        return rows


# ------------------------------------------------------------------ fixtures
@pytest.fixture
def fake() -> FakeVLLM:
    return FakeVLLM()


def make_vllm_sampler(fake: FakeVLLM, root: Path, **options) -> VLLMSampler:
    client = OpenAICompatClient("http://vllm.test/v1", transport=fake.transport(), backoff_s=0.0)
    options.setdefault("eos_token_ids", {EOS})
    return VLLMSampler(client, root, **options).start()


@pytest.fixture
def sampler(fake: FakeVLLM, tmp_path: Path):
    with make_vllm_sampler(fake, tmp_path) as s:
        yield s


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir: Path) -> Engine:
    return Engine(load_base_model(str(tiny_model_dir), device="cpu", dtype="float32"))


def toy_adapter(seed: int, modules: tuple[str, ...] = ("q_proj", "v_proj")) -> AdapterWeights:
    generator = torch.Generator().manual_seed(seed)
    adapter = AdapterWeights(LoraSpec(rank=4, train_unembed=False))
    for layer in range(2):
        for module in modules:
            name = f"model.layers.{layer}.self_attn.{module}"
            adapter.a[name] = torch.randn(4, 16, generator=generator)
            adapter.b[name] = torch.randn(16, 4, generator=generator)
    return adapter


def job(prompt: list[int], n: int = 1, adapter: AdapterWeights | None = None,
        **params) -> SampleJob:
    """A sampling job; unless told otherwise it runs to `max_tokens` (6), ignoring EOS."""
    params.setdefault("max_tokens", 6)
    params.setdefault("stop", [])
    return SampleJob(adapter, prompt, n, SamplingParams(**params))


def fake_reference_logprobs(fake: FakeVLLM, model: str, prompt: list[int], tokens: list[int],
                            temperature: float) -> list[float]:
    return [float(_log_softmax(fake.logits(model, prompt + tokens[:i]) / temperature)[tok])
            for i, tok in enumerate(tokens)]


# ------------------------------------------------------------------ adapter publishing
def test_adapters_are_published_as_peft_directories_named_by_their_content(tmp_path: Path):
    adapter = toy_adapter(0)
    published = AdapterPublisher(tmp_path, BASE).publish(adapter)

    assert published.name.startswith("lora-") and len(published.name) == len("lora-") + 32
    assert published.path == tmp_path / "adapters" / published.name
    assert sorted(p.name for p in published.path.iterdir()) == [
        "adapter_config.json", "adapter_model.safetensors"]
    assert [p.name for p in (tmp_path / "adapters").iterdir()] == [published.name]  # no staging
    config = json.loads((published.path / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], config["lora_alpha"]) == ("LORA", 4, 32.0)
    assert config["target_modules"] == sorted(LoraSpec(4, train_unembed=False).module_suffixes())
    stored = load_file(str(published.path / "adapter_model.safetensors"))
    expected = adapter_tensors(adapter)
    assert set(stored) == set(expected)
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in stored
    assert all(torch.equal(stored[key], value) for key, value in expected.items())


def test_published_adapters_beyond_the_newest_are_pruned_except_protected_ones(tmp_path: Path):
    import os

    publisher = AdapterPublisher(tmp_path, BASE)
    published = [publisher.publish(toy_adapter(seed)) for seed in range(6)]
    for age, adapter in enumerate(reversed(published)):  # the first published is the oldest
        os.utime(adapter.path, (1000.0 - age, 1000.0 - age))
    pruned = publisher.prune(keep=2, protected={published[0].name})
    assert sorted(pruned) == sorted(p.name for p in published[1:4])
    left = sorted(p.name for p in (tmp_path / "adapters").iterdir())
    assert left == sorted([published[0].name, published[4].name, published[5].name])
    # A pruned adapter asked for again is written again, under the same name.
    again = publisher.publish(toy_adapter(1))
    assert again == published[1] and (again.path / "adapter_model.safetensors").is_file()


def test_same_weights_keep_their_name_and_changed_weights_get_a_new_one(tmp_path: Path):
    publisher = AdapterPublisher(tmp_path, BASE)
    adapter = toy_adapter(0)
    first = publisher.publish(adapter)
    written = (first.path / "adapter_model.safetensors").stat().st_mtime_ns

    assert publisher.publish(toy_adapter(0)) == first  # equal content, another object
    assert (first.path / "adapter_model.safetensors").stat().st_mtime_ns == written
    with torch.no_grad():
        adapter.b["model.layers.1.self_attn.v_proj"].add_(0.5)  # trained in place
    second = publisher.publish(adapter)
    assert second.name != first.name
    assert (first.path / "adapter_model.safetensors").stat().st_mtime_ns == written  # immutable
    assert publisher.publish(toy_adapter(1)).name not in (first.name, second.name)


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import server.samplers.adapters as adapters_module

    def broken_save(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(adapters_module, "save_file", broken_save)
    with pytest.raises(OSError, match="disk full"):
        AdapterPublisher(tmp_path, BASE).publish(toy_adapter(0))
    assert list((tmp_path / "adapters").iterdir()) == []


def test_a_published_adapter_loads_in_peft_and_computes_what_the_engine_computes(
    tiny_engine: Engine, tiny_model_dir: Path, tmp_path: Path
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    adapter = tiny_engine.create_run(LoraSpec(rank=4, train_unembed=False), seed=3).adapter
    with torch.no_grad():
        for name, b in adapter.b.items():
            b.copy_(torch.randn(b.shape, generator=torch.Generator().manual_seed(len(name))) * .3)
    published = AdapterPublisher(tmp_path, str(tiny_model_dir)).publish(adapter)
    peft_model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                                           str(published.path))
    tokens = torch.tensor([[2, 10, 20, 30, 40, 50]])
    with torch.no_grad():
        expected = peft_model(input_ids=tokens).logits
        with routing([RowGroup(adapter, 0, 1)]):
            actual = tiny_engine.model(input_ids=tokens).logits
        base = tiny_engine.model(input_ids=tokens).logits
    assert torch.allclose(actual, expected, atol=1e-4, rtol=1e-4)
    assert (actual - base).abs().max() > 1e-2  # the adapter really changes the model


# ------------------------------------------------------------------ hot-loading
def test_each_adapter_version_is_loaded_once_and_named_in_its_requests(sampler, fake):
    adapter = toy_adapter(0)
    for _ in range(2):
        sampler.sample([job([5, 6, 7], adapter=adapter), job([5, 6, 8], adapter=adapter),
                        job([5, 6, 9])])

    loads = fake.bodies("/v1/load_lora_adapter")
    assert len(loads) == 1
    name = loads[0]["lora_name"]
    assert Path(loads[0]["lora_path"]) == sampler.publisher.directory / name
    models = sorted(b["model"] for b in fake.bodies("/v1/completions")[2:])
    assert models == [BASE, BASE, name, name, name, name]


def test_least_recently_used_adapters_are_unloaded_beyond_the_cap(fake, tmp_path: Path):
    with make_vllm_sampler(fake, tmp_path, max_loaded_adapters=2) as sampler:
        names = []
        for seed in range(3):
            sampler.sample([job([5, 6], adapter=toy_adapter(seed))])
            names.append(fake.bodies("/v1/load_lora_adapter")[-1]["lora_name"])
        assert [b["lora_name"] for b in fake.bodies("/v1/unload_lora_adapter")] == [names[0]]
        assert sorted(fake.loaded) == sorted(names[1:])
        assert sampler.loaded.names() == names[1:]


def test_an_adapter_the_server_forgot_is_loaded_again(sampler, fake):
    adapter = toy_adapter(0)
    sampler.sample([job([5, 6], adapter=adapter)])
    fake.loaded.clear()  # vLLM restarted

    result = sampler.sample([job([5, 6], adapter=adapter)])[0]
    assert len(result.sequences[0].tokens) == 6
    assert len(fake.bodies("/v1/load_lora_adapter")) == 2


# ------------------------------------------------------------------ request mapping
@pytest.mark.parametrize(
    ("stop", "expected"),
    [
        (None, {"ignore_eos": False, "stop_token_ids": [1, 106]}),
        ([], {"ignore_eos": True}),
        ([7, 9], {"ignore_eos": True, "stop_token_ids": [7, 9]}),
        (["\n\n", "<end_of_turn>", ""], {
            "ignore_eos": True, "stop": ["\n\n", "<end_of_turn>"],
            "include_stop_str_in_output": True, "skip_special_tokens": False,
            "spaces_between_special_tokens": False}),
    ],
    ids=["absent-stops-at-eos", "empty-never-stops", "token-ids", "strings"],
)
def test_stop_follows_tinker_semantics(stop, expected):
    assert stop_fields(stop, {106, 1}) == expected


def test_sampling_parameters_reach_the_server_as_completion_fields():
    body = completion_body(
        job([2, 5, 6], n=4, max_tokens=9, temperature=0.7, top_p=0.9, top_k=40, seed=11,
            stop=None),
        "lora-x", {1})
    assert body | {"stop_token_ids": None} == {
        "model": "lora-x", "prompt": [2, 5, 6], "n": 4, "max_tokens": 9, "temperature": 0.7,
        "top_p": 0.9, "top_k": 40, "seed": 11, "logprobs": 0, "return_tokens_as_token_ids": True,
        "stream": False, "ignore_eos": False, "stop_token_ids": None}
    defaults = completion_body(job([2, 5], max_tokens=None, top_k=-1, stop=None), BASE)
    assert defaults["max_tokens"] == DEFAULT_MAX_TOKENS and defaults["top_k"] == -1
    assert "seed" not in defaults and "stop_token_ids" not in defaults
    assert completion_body(job([2, 5], top_k=0), BASE)["top_k"] == -1
    asked = SampleJob(None, [2, 5], 1, SamplingParams(), prompt_logprobs=True,
                      topk_prompt_logprobs=3, topk_sample_logprobs=2)
    assert completion_body(asked, BASE)["prompt_logprobs"] == 3
    assert completion_body(asked, BASE)["logprobs"] == 2


# ------------------------------------------------------------------ answers
def test_answers_become_token_ids_tempered_logprobs_and_stop_reasons(sampler, fake):
    prompt = [2, 9, 14, 21]
    result = sampler.sample([job(prompt, n=3, max_tokens=12, temperature=0.6, seed=5,
                                 stop=None)])[0]

    assert [s.tokens for s in result.sequences] == fake.generated[-3:]
    for seq in result.sequences:
        np.testing.assert_allclose(
            seq.logprobs, fake_reference_logprobs(fake, BASE, prompt, seq.tokens, 0.6), atol=1e-6)
        assert seq.stopped == (seq.tokens[-1] == EOS)
        assert seq.stopped or len(seq.tokens) == 12
    assert result.prompt_logprobs is None and result.topk_prompt is None


def test_stop_rules_end_generation_as_the_torch_sampler_does(sampler):
    prompt = [2, 9, 14, 21]
    free = sampler.sample([job(prompt, n=8, max_tokens=20, seed=1, stop=[])])[0]
    assert all(len(s.tokens) == 20 and not s.stopped for s in free.sequences)
    assert any(EOS in s.tokens for s in free.sequences)  # EOS did not stop them

    by_eos = sampler.sample([job(prompt, n=8, max_tokens=20, seed=1, stop=None)])[0]
    for seq, long in zip(by_eos.sequences, free.sequences, strict=True):
        cut = long.tokens.index(EOS) + 1 if EOS in long.tokens else 20
        assert seq.tokens == long.tokens[:cut]  # the EOS token itself is kept
        assert seq.stopped == (EOS in long.tokens)

    stop_token = free.sequences[0].tokens[3]
    by_id = sampler.sample([job(prompt, n=1, max_tokens=20, seed=1, stop=[stop_token])])[0]
    assert by_id.sequences[0].tokens[-1] == stop_token and by_id.sequences[0].stopped

    letter = chr(ord("a") + free.sequences[0].tokens[2] % 26)
    by_text = sampler.sample([job(prompt, n=1, max_tokens=20, seed=1, stop=[letter])])[0]
    tokens = by_text.sequences[0].tokens
    assert by_text.sequences[0].stopped and FakeVLLM.text(tokens, False).endswith(letter)


def test_prompt_logprobs_are_untempered_with_nan_first_and_padded_top_k(sampler, fake):
    prompt = [2, 9, 14, 21, 3]
    asked = SampleJob(None, prompt, 2, SamplingParams(max_tokens=3, temperature=0.5),
                      prompt_logprobs=True, topk_prompt_logprobs=2)
    result = sampler.sample([asked])[0]

    assert np.isnan(result.prompt_logprobs[0])
    expected = [float(_log_softmax(fake.logits(BASE, prompt[:i]))[prompt[i]])
                for i in range(1, len(prompt))]
    np.testing.assert_allclose(result.prompt_logprobs[1:], expected, atol=1e-6)
    ids, lps = result.topk_prompt
    assert ids.shape == lps.shape == (len(prompt), 2)
    assert ids[0].tolist() == [0, 0] and lps[0].tolist() == [-99999.0, -99999.0]
    for i in range(1, len(prompt)):
        best = np.argsort(-fake.logits(BASE, prompt[:i]))[:2]
        assert ids[i].tolist() == best.tolist() and lps[i, 0] >= lps[i, 1]
    assert len(fake.bodies("/v1/completions")) == 3  # two probes, one request


def test_compute_logprobs_style_requests_sample_nothing(sampler, fake):
    asked = SampleJob(None, [2, 9, 14], 1, SamplingParams(max_tokens=0), prompt_logprobs=True)
    result = sampler.sample([asked])[0]
    assert result.sequences[0].tokens == [] and not result.sequences[0].stopped
    assert np.isfinite(result.prompt_logprobs[1:]).all()
    assert fake.bodies("/v1/completions")[-1]["max_tokens"] == 1


def test_prompt_logprobs_come_from_a_temperature_one_request_when_the_server_tempers_them(
    tmp_path: Path,
):
    fake = FakeVLLM(temper_prompt=True)
    with make_vllm_sampler(fake, tmp_path) as sampler:
        assert sampler.semantics.prompt_tempered
        prompt = [2, 9, 14, 21]
        asked = SampleJob(None, prompt, 1, SamplingParams(max_tokens=3, temperature=0.5),
                          prompt_logprobs=True)
        result = sampler.sample([asked])[0]
    bodies = fake.bodies("/v1/completions")[2:]
    assert [b["temperature"] for b in bodies] == [0.5, 1.0]
    assert "prompt_logprobs" not in bodies[0] and bodies[1]["prompt_logprobs"] == 0
    expected = [float(_log_softmax(fake.logits(BASE, prompt[:i]))[prompt[i]]) for i in (1, 2, 3)]
    np.testing.assert_allclose(result.prompt_logprobs[1:], expected, atol=1e-6)


# ------------------------------------------------------------------ logprob semantics
def test_the_probe_accepts_a_server_reporting_tempered_logprobs(sampler):
    assert sampler.semantics.tempered and not sampler.semantics.prompt_tempered
    assert sampler.semantics.gap_ratio == pytest.approx(2.0, abs=1e-6)


def test_a_server_reporting_raw_logprobs_is_refused(tmp_path: Path):
    with pytest.raises(SemanticsError, match=REQUIRED_FLAG):
        make_vllm_sampler(FakeVLLM(mode="raw_logprobs"), tmp_path)


def test_without_strictness_raw_logprobs_are_used_only_where_they_are_right(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    with caplog.at_level(logging.ERROR), make_vllm_sampler(
            FakeVLLM(mode="raw_logprobs"), tmp_path, strict_logprobs=False) as sampler:
        outcomes = sampler.sample_each([job([2, 5], temperature=0.5), job([2, 6]),
                                        job([2, 7], temperature=0.0)])
    assert REQUIRED_FLAG in caplog.text
    assert isinstance(outcomes[0], SemanticsError)
    assert isinstance(outcomes[1], SampleResult) and isinstance(outcomes[2], SampleResult)


# ------------------------------------------------------------------ failures
def test_connection_errors_are_retried(sampler, fake):
    fake.connect_failures = 2
    result = sampler.sample([job([2, 5, 6])])[0]
    assert len(result.sequences[0].tokens) == 6


def test_an_unreachable_server_is_a_server_error(fake, tmp_path: Path):
    client = OpenAICompatClient("http://vllm.test", transport=fake.transport(), retries=1,
                                backoff_s=0.0)
    fake.connect_failures = 10
    with pytest.raises(VLLMUnavailable) as caught:
        VLLMSampler(client, tmp_path).start()
    assert isinstance(caught.value, RuntimeError) and not isinstance(caught.value, ValueError)


def test_a_failed_request_fails_only_its_own_job(sampler, fake):
    fake.fail_prompts[(2, 7)] = 500
    jobs = [job([2, 5]), job([2, 7]), job([2, 9])]
    outcomes = sampler.sample_each(jobs)
    assert isinstance(outcomes[1], VLLMError) and "injected failure" in str(outcomes[1])
    assert all(isinstance(outcomes[i], SampleResult) for i in (0, 2))

    with pytest.raises(SampleBatchError) as caught:
        sampler.sample(jobs)
    sent = len(fake.bodies("/v1/completions"))
    # Retried one by one (as the scheduler does): the jobs that succeeded are not sampled again.
    assert sampler.sample([jobs[0]])[0] is caught.value.outcomes[0]
    assert sampler.sample([jobs[2]])[0] is caught.value.outcomes[2]
    with pytest.raises(VLLMError, match="injected failure"):
        sampler.sample([jobs[1]])
    assert len(fake.bodies("/v1/completions")) == sent + 1


def test_the_jobs_of_a_batch_are_sent_concurrently(sampler, fake):
    fake.barrier = threading.Barrier(3)  # each request waits until all three have arrived
    results = sampler.sample([job([2, 5]), job([2, 6]), job([2, 7])])
    assert all(len(r.sequences[0].tokens) == 6 for r in results)


# ------------------------------------------------------------------ unservable adapters
def test_adapters_training_lm_head_are_sampled_by_the_fallback(
    fake, tmp_path: Path, tiny_engine: Engine
):
    with_head = tiny_engine.create_run(LoraSpec(rank=4), seed=0).adapter
    jobs = [job([2, 10, 20], adapter=with_head), job([2, 5, 6])]
    with make_vllm_sampler(fake, tmp_path, fallback=tiny_engine) as sampler:
        results = sampler.sample(jobs)
    assert len(results[0].sequences[0].tokens) == 6
    assert [b["prompt"] for b in fake.bodies("/v1/completions")[2:]] == [[2, 5, 6]]
    assert fake.bodies("/v1/load_lora_adapter") == []

    with make_vllm_sampler(fake, tmp_path) as alone:
        outcome = alone.sample_each(jobs[:1])[0]
    assert isinstance(outcome, VLLMError) and "train_unembed=False" in str(outcome)


def test_each_fallback_is_logged_once_per_adapter_and_counted_on_metrics(
    fake, tmp_path: Path, tiny_engine: Engine, caplog: pytest.LogCaptureFixture
):
    from server.observability.metrics import SamplerWorkerMetrics
    from server.samplers.fallbacks import REASONS, FallbackLog

    metrics = SamplerWorkerMetrics(REASONS)
    with_head = tiny_engine.create_run(LoraSpec(rank=4), seed=0).adapter
    other = tiny_engine.create_run(LoraSpec(rank=4), seed=1).adapter
    fallbacks = FallbackLog(metrics.count_fallback)
    with caplog.at_level(logging.WARNING), make_vllm_sampler(
        fake, tmp_path, fallback=tiny_engine, fallbacks=fallbacks
    ) as sampler:
        sampler.sample([job([2, 10], adapter=with_head), job([2, 11], adapter=with_head)])
        sampler.sample([job([2, 12], adapter=with_head), job([2, 13], adapter=other)])
    said = [r for r in caplog.records if "on the torch sampler, not vLLM" in r.getMessage()]
    assert len(said) == 2  # once per adapter, with the reason
    assert all("lm_head" in r.getMessage() and "train_unembed=False" in r.getMessage()
               for r in said)
    text = metrics.render().decode()
    assert 'autoresearch_sampler_fallbacks_total{reason="unservable_modules"} 4.0' in text
    assert 'autoresearch_sampler_fallbacks_total{reason="vllm_unavailable"} 0.0' in text
    make_sampler("vllm", engine=tiny_engine, fallbacks=fallbacks)  # no URL: all on torch
    assert 'reason="vllm_unavailable"} 1.0' in metrics.render().decode()


# ------------------------------------------------------------------ the factory
def test_make_sampler_falls_back_to_torch_without_a_usable_vllm(
    tiny_engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    from server.entrypoints.runtime import free_port

    with caplog.at_level(logging.WARNING):
        assert make_sampler("vllm", engine=tiny_engine) is tiny_engine
        assert "no vLLM server URL" in caplog.text
        closed = f"http://127.0.0.1:{free_port()}"
        assert make_sampler("vllm", engine=tiny_engine, base_url=closed, adapter_root=tmp_path,
                            client_options={"retries": 0}) is tiny_engine
        assert "unreachable" in caplog.text
        raw = OpenAICompatClient("http://vllm.test",
                                 transport=FakeVLLM(mode="raw_logprobs").transport())
        assert make_sampler("vllm", engine=tiny_engine, client=raw, model=BASE,
                            adapter_root=tmp_path) is tiny_engine
        assert REQUIRED_FLAG in caplog.text
    with pytest.raises(VLLMError, match="no torch engine"):
        make_sampler("vllm")
    assert make_sampler("torch", engine=tiny_engine) is tiny_engine


def test_make_sampler_returns_the_vllm_sampler_when_vllm_is_usable(
    fake, tiny_engine: Engine, tmp_path: Path
):
    client = OpenAICompatClient("http://vllm.test", transport=fake.transport())
    sampler = make_sampler("vllm", engine=tiny_engine, client=client, model=BASE,
                           adapter_root=tmp_path)
    try:
        assert isinstance(sampler, VLLMSampler) and sampler.fallback is tiny_engine
        assert sampler.eos_token_ids == tiny_engine.eos_ids
        sampler.sample([job([2, 5], stop=None)])
        assert fake.bodies("/v1/completions")[-1]["stop_token_ids"] == sorted(tiny_engine.eos_ids)
    finally:
        sampler.close()


def test_the_serve_command_carries_the_flags_the_backend_needs():
    argv, env = serve_command("/models/gemma", served_model_name=BASE, port=8011, max_loras=4,
                              max_lora_rank=32)
    command = " ".join(argv)
    assert argv[:3] == ["vllm", "serve", "/models/gemma"]
    for flag in ("--enable-lora", "--max-loras 4", "--max-lora-rank 32", REQUIRED_FLAG,
                 f"--served-model-name {BASE}", "--port 8011", "--generation-config vllm"):
        assert flag in command
    assert env == {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True", "VLLM_BATCH_INVARIANT": "1"}
    _, fused = serve_command("/m", served_model_name=BASE, batch_invariant=False)
    assert "VLLM_BATCH_INVARIANT" not in fused
    with pytest.raises(ValueError, match="max-lora-rank"):
        serve_command("/m", served_model_name=BASE, max_lora_rank=12)


def test_a_starting_vllm_is_waited_for_with_backoff(fake, tmp_path: Path, monkeypatch):
    """vLLM loads its model for minutes after its pod starts: the worker waits, then samples."""
    from server.samplers import vllm_sampler

    monkeypatch.setattr(vllm_sampler, "WAIT_FIRST_S", 0.01)
    def client() -> OpenAICompatClient:
        return OpenAICompatClient("http://vllm.test", transport=fake.transport(), retries=0,
                                  backoff_s=0.0)

    fake.connect_failures = 4
    with pytest.raises(VLLMError, match="no torch engine"):
        make_sampler("vllm", client=client(), model=BASE, adapter_root=tmp_path, wait_s=0.0)
    fake.connect_failures = 4
    sampler = make_sampler("vllm", client=client(), model=BASE, adapter_root=tmp_path,
                           wait_s=30)
    try:
        assert isinstance(sampler, VLLMSampler)
        assert len(sampler.sample([job([2, 5, 6])])[0].sequences[0].tokens) == 6
    finally:
        sampler.close()


def test_a_read_only_adapter_root_is_a_clear_error_not_a_crash(fake, tmp_path: Path, monkeypatch):
    """A pod whose --adapter-root is on a read-only mount (as /data is for the sampler)."""
    import errno

    def read_only(self, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "mkdir", read_only)
    client = OpenAICompatClient("http://vllm.test", transport=fake.transport())
    with pytest.raises(VLLMError, match="--adapter-root") as caught:
        VLLMSampler(client, tmp_path, model=BASE).start()
    assert "Read-only file system" in str(caught.value)
