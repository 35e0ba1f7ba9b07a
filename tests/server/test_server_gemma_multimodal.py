"""Gemma 3 from 4B up is published as `Gemma3ForConditionalGeneration` (the language model's
config nested under `text_config`, beside a vision tower). A tiny random one of that class,
served by the server on the CPU and under `--emulate-device cuda`, goes through the SDK: it
trains, samples, saves, loads, and its checkpoint is a PEFT adapter for the published class."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tinker
import torch
from tinker import types

from server.engine.model_loading import load_base_model
from server.storage.checkpoints import run_dir_name, spec_from_peft
from tests.server.server_helpers import (
    API_KEY,
    forward_logprobs,
    new_run,
    sft_datum,
    sft_step,
    start_server,
)
from tools.gemma_shapes import build_model


@pytest.fixture(scope="module")
def multimodal_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model(tmp_path_factory.mktemp("tiny-gemma3-mm"), "tiny-multimodal")


@pytest.fixture(scope="module")
def mm_sequences(multimodal_dir: Path) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(multimodal_dir)
    texts = ["select name from users where id = 1;", "hello world, hello server",
             "SELECT a, b FROM t JOIN u ON t.id = u.id;"]
    return [tokenizer.encode(t) for t in texts]


def test_the_language_model_is_loaded_alone_with_the_checkpoints_module_names(multimodal_dir):
    loaded = load_base_model(str(multimodal_dir), dtype="float32")
    names = [n for n, _ in loaded.model.named_modules()]
    assert not any("vision" in n or "multi_modal" in n for n in names)
    assert loaded.model.config.num_attention_heads == 2  # the flat text config
    assert loaded.naming.outside("model.layers.0.self_attn.q_proj") == (
        "model.language_model.layers.0.self_attn.q_proj")
    assert loaded.naming.outside("lm_head") == "lm_head"

    from transformers import Gemma3ForConditionalGeneration

    full = Gemma3ForConditionalGeneration.from_pretrained(multimodal_dir, dtype=torch.float32)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    with torch.no_grad():
        assert torch.equal(loaded.model(ids).logits, full(input_ids=ids).logits)


@pytest.mark.parametrize("emulate", [None, "cuda"])
def test_a_multimodal_checkpoint_trains_samples_saves_loads_and_exports(
    multimodal_dir, mm_sequences, tmp_path, emulate
):
    overrides = {"emulate_device": emulate, "dtype": "bfloat16"} if emulate else {}
    server = start_server(multimodal_dir, tmp_path / "data", **overrides)
    try:
        with tinker.ServiceClient(base_url=server.url, api_key=API_KEY) as service:
            client = new_run(service, str(multimodal_dir), seed=3, rank=4)
            data = [sft_datum(ids) for ids in mm_sequences]
            losses = [sft_step(client, data) for _ in range(3)]
            assert losses[-1] < losses[0]
            sampler = client.save_weights_and_get_sampling_client()
            result = sampler.sample(types.ModelInput.from_ints(mm_sequences[0][:4]), 2,
                                    types.SamplingParams(max_tokens=6, seed=1)).result()
            assert len(result.sequences) == 2
            assert all(1 <= len(s.tokens) <= 6 for s in result.sequences)
            served = forward_logprobs(client, data)
            path = client.save_state("mm").result().path
            restored = service.create_training_client_from_state_with_optimizer(path).result()
            for got, want in zip(forward_logprobs(restored, data), served, strict=True):
                assert np.array_equal(got, want)
    finally:
        server.stop()

    parsed = types.ParsedCheckpointTinkerPath.from_tinker_path(path)
    ckpt = tmp_path / "data" / "runs" / run_dir_name(parsed.training_run_id) / "weights" / "mm"
    config = json.loads((ckpt / "adapter_config.json").read_text())
    assert isinstance(config["target_modules"], str)  # a pattern that keeps off the vision tower
    assert spec_from_peft(config).train_attn and spec_from_peft(config).train_unembed
    if emulate is None:
        _peft_gives_the_servers_logprobs(multimodal_dir, ckpt, mm_sequences, served)


def _peft_gives_the_servers_logprobs(model_dir: Path, ckpt: Path, sequences: list[list[int]],
                                     served: list[np.ndarray]) -> None:
    from peft import PeftModel
    from transformers import Gemma3ForConditionalGeneration

    base = Gemma3ForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(ckpt)).eval()
    wrapped = [n for n, m in model.named_modules() if hasattr(m, "lora_A")]
    assert wrapped and not any("vision" in n for n in wrapped)
    assert any(n.endswith("lm_head") for n in wrapped)
    for ids, expected in zip(sequences, served, strict=True):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids[:-1]])).logits[0].float()
        got = torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]
        np.testing.assert_allclose(got.numpy(), expected, atol=1e-4)
