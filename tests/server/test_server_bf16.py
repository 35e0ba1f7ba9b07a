"""The dtype per device: bf16 where the CPU multiplies it natively, fp32 numerics on request.

On the tiny random Gemma 3, a bf16 engine is compared with an fp32 one on the same weights and
adapter: per-token logprobs within bf16's precision, LoRA state kept in fp32, and the sampler's
logprob of each token it drew bitwise what the trainer computes for it (the on-policy importance
ratio exactly 1).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from server.engine import hardware
from server.engine.engine import AdamParams, Engine, ForwardBackwardJob, SampleJob, SamplingParams
from server.engine.lora import LoraSpec
from server.engine.model_loading import load_base_model, parse_dtype
from server.protocol.codec import Datum

ZEN4_FLAGS = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 avx512_vnni\n"
OLD_XEON_FLAGS = "processor\t: 0\nflags\t\t: fpu sse avx2 avx512f avx512_vnni\n"
GRAVITON3 = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"
LOGPROB_ATOL = 0.05
"""bf16 keeps 8 bits of mantissa: the tiny model's logits (|x| < 4) move by up to ~0.016 per
rounding, and a logprob collects a few such roundings."""


def test_the_dtype_follows_the_cpu_bf16_instructions():
    assert hardware.cpu_bf16_features(ZEN4_FLAGS, "x86_64") == ["avx512_bf16"]
    assert hardware.cpu_bf16_features(OLD_XEON_FLAGS, "x86_64") == []
    assert hardware.cpu_bf16_features(GRAVITON3, "aarch64") == ["bf16"]
    cpu = torch.device("cpu")
    assert hardware.choose_dtype(cpu, ["avx512_bf16"]).dtype == torch.bfloat16
    fallback = hardware.choose_dtype(cpu, [])
    assert fallback.dtype == torch.float32 and "no bf16" in fallback.reason
    assert hardware.choose_dtype(torch.device("cuda"), []).dtype == torch.bfloat16
    requested = parse_dtype("float32", cpu)
    assert requested.dtype == torch.float32 and "--dtype" in requested.reason
    with pytest.raises(ValueError, match="unknown dtype"):
        parse_dtype("float8", cpu)


def test_a_mac_before_macos_14_serves_float32_and_refuses_bf16_by_name(monkeypatch):
    mps = torch.device("mps")
    old = hardware.choose_dtype(mps, macos_release="13.6.1")
    assert old.dtype == torch.float32 and "macOS 14" in old.reason and "13.6.1" in old.reason
    assert hardware.choose_dtype(mps, macos_release="14.2").dtype == torch.bfloat16
    assert hardware.choose_dtype(mps, macos_release="").dtype == torch.bfloat16  # emulated
    monkeypatch.setattr(hardware.platform, "mac_ver", lambda: ("13.6.1", ("", "", ""), "arm64"))
    assert parse_dtype(None, mps).dtype == torch.float32
    with pytest.raises(ValueError, match="macOS 14 or later"):
        parse_dtype("bf16", mps)
    assert parse_dtype("float32", mps).dtype == torch.float32


def test_the_mac_decode_budget_is_metals_headroom_within_what_the_host_has():
    from server.engine import kv_budget

    gib = 1 << 30
    assert kv_budget.mps_free_bytes(21 * gib, 5 * gib, 30 * gib) == 16 * gib
    # JupyterLab and a browser hold most of the unified memory: the host's figure rules.
    assert kv_budget.mps_free_bytes(21 * gib, 5 * gib, 3 * gib) == 3 * gib
    assert kv_budget.mps_free_bytes(21 * gib, 22 * gib, 3 * gib) == 0


@pytest.fixture(scope="module")
def engines(tiny_model_dir) -> dict[str, Engine]:
    return {
        name: Engine(load_base_model(str(tiny_model_dir), device="cpu", dtype=name))
        for name in ("float32", "bfloat16")
    }


def _adapters(engines: dict[str, Engine]):
    """The same non-trivial adapter on both engines."""
    states = {name: engine.create_run(LoraSpec(rank=4), seed=3) for name, engine in engines.items()}
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name in sorted(states["float32"].adapter.b):
            noise = torch.randn(states["float32"].adapter.b[name].shape, generator=generator)
            for state in states.values():
                state.adapter.b[name].copy_(noise * 0.05)
    return states


def _datum(rng, vocab: int, length: int) -> Datum:
    tokens = rng.integers(5, vocab, size=length + 1)
    advantages = rng.normal(size=length).astype(np.float32)
    return Datum(
        tokens[:-1],
        {"target_tokens": tokens[1:], "logprobs": np.full(length, -3.0, np.float32),
         "advantages": advantages},
    )


def test_bf16_weights_multiply_under_fp32_activations(engines):
    engine = engines["bfloat16"]
    layer = engine.model.model.layers[0]
    assert engine.model.get_input_embeddings().weight.dtype == torch.bfloat16
    assert layer.mlp.up_proj.base.weight.dtype == torch.bfloat16
    assert layer.input_layernorm.weight.dtype == torch.float32
    seen: dict[str, torch.dtype] = {}

    def record(name: str):
        def hook(_module, _inputs, output) -> None:
            seen.setdefault(name, output.dtype)
        return hook

    hooks = [
        module.register_forward_hook(record(name))
        for name, module in (("attention", layer.self_attn.o_proj),
                             ("norm", engine.model.model.norm))
    ]
    try:
        engine.model(input_ids=torch.tensor([[5, 17, 42]]))
    finally:
        for hook in hooks:
            hook.remove()
    assert seen["attention"] == seen["norm"] == torch.float32
    assert "float32" in engine.model_origin and "bfloat16" in engine.model_origin


def test_bf16_training_keeps_fp32_lora_state_and_matches_fp32_logprobs(engines):
    states = _adapters(engines)
    rng = np.random.default_rng(0)
    data = [_datum(rng, engines["float32"].vocab_size, n) for n in (20, 33, 7)]
    out = {}
    for name, engine in engines.items():
        result = engine.forward_backward(
            [ForwardBackwardJob(states[name], data, "importance_sampling", {}, False)]
        )[0]
        tensors = states[name].adapter.parameters()
        assert all(t.dtype == torch.float32 and t.grad.dtype == torch.float32 for t in tensors)
        engine.optim_step(states[name], AdamParams(learning_rate=1e-3))
        moments = states[name].optimizer.state[tensors[0]]
        assert moments["exp_avg"].dtype == moments["exp_avg_sq"].dtype == torch.float32
        out[name] = [o["logprobs"] for o in result.outputs]
    for bf16, fp32 in zip(out["bfloat16"], out["float32"], strict=True):
        assert np.isfinite(bf16).all()
        np.testing.assert_allclose(bf16, fp32, atol=LOGPROB_ATOL)
        assert not np.array_equal(bf16, fp32)  # it really computed in bf16


def test_bf16_sampler_logprobs_equal_the_trainers_for_the_drawn_tokens(engines):
    """Bitwise, also for a sequence that decodes on alone after its batch-mates stopped (one-
    and two-row bf16 products take another kernel) and past the sliding window."""
    engine = engines["bfloat16"]
    assert engine.batch_invariant
    state = _adapters(engines)["bfloat16"]
    adapter = state.adapter.frozen_copy()
    prompt = [5, 17, 42, 9, 30, 11]
    for seed in range(6):
        result = engine.sample(
            [SampleJob(adapter, prompt, 2, SamplingParams(max_tokens=40, temperature=1.0,
                                                          seed=seed, stop=[])),
             SampleJob(adapter, [7, 8, 9], 3, SamplingParams(max_tokens=2, temperature=1.0,
                                                             seed=1, stop=[]))]
        )[0]
        for seq in result.sequences:
            full = np.asarray(prompt + list(seq.tokens), dtype=np.int64)
            n = len(full) - 1
            datum = Datum(full[:-1], {"target_tokens": full[1:],
                                      "weights": np.zeros(n, np.float32)})
            scored = engine.forward_backward(
                [ForwardBackwardJob(state, [datum], "cross_entropy", {}, True)]
            )[0].outputs[0]["logprobs"][len(prompt) - 1 :]
            assert np.array_equal(scored, np.asarray(seq.logprobs, np.float32)), seed
