"""Training micro-batches sized from free memory on an accelerator's layout (here CUDA's,
emulated on the CPU): what a token's activations cost is measured by the engine's own pass, the
size fits a share of the free memory, is chosen once and leaves every run's numbers as a fixed
size gives them; the CPU, a given size and a deterministic start keep a fixed size."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from server.engine import kv_budget, microbatch_budget
from server.engine.engine import AdamParams, Engine, ForwardBackwardJob
from server.engine.lora import LoraSpec
from server.engine.model_loading import load_base_model
from server.protocol.codec import Datum

MIB = 2**20


def test_the_size_fits_a_share_of_free_memory_in_whole_quanta():
    assert microbatch_budget.microbatch_tokens(MIB, 16 * 2**30) == 8192
    assert microbatch_budget.microbatch_tokens(3 * MIB, 16 * 2**30) == 2560  # 2730 rounded down
    assert microbatch_budget.microbatch_tokens(MIB, 100 * MIB) == microbatch_budget.MIN_TOKENS
    assert microbatch_budget.microbatch_tokens(1.0, 2**40) == microbatch_budget.MAX_TOKENS


def test_a_tokens_cost_is_the_slope_so_fixed_costs_drop_out():
    weights = 10**9  # saved at any length: not a cost per token
    assert microbatch_budget.saved_bytes_per_token(lambda n: weights + 5000 * n) == 5000.0


def _datum(length: int, vocab: int, seed: int) -> Datum:
    tokens = np.random.default_rng(seed).integers(5, vocab, size=length + 1)
    return Datum(tokens[:-1], {"target_tokens": tokens[1:],
                               "weights": np.ones(length, np.float32)})


def _step(engine: Engine) -> tuple[float, torch.Tensor]:
    state = engine.create_run(LoraSpec(rank=4), seed=7)
    data = [_datum(40, engine.vocab_size, i) for i in range(3)]
    [result] = engine.forward_backward([ForwardBackwardJob(state, data, "cross_entropy", {},
                                                           False)])
    engine.optim_step(state, AdamParams(learning_rate=1e-2))
    name = sorted(state.adapter.b)[0]
    return result.metrics["loss:sum"], state.adapter.b[name].detach().clone()


def test_cuda_layout_sizes_once_from_free_memory_and_leaves_a_runs_numbers(
        tiny_model_dir, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(kv_budget, "free_bytes", lambda device: 64 * MIB)
    monkeypatch.delenv("AUTORESEARCH_TOKENS_PER_MICROBATCH", raising=False)
    sized = Engine(load_base_model(str(tiny_model_dir), emulate="cuda"))
    assert sized.microbatch_sizing == "fixed"
    before = sized.tokens_per_microbatch  # the default of the device it runs on (the CPU here)
    probes: list[int] = []
    measure = sized._probe_saved_bytes
    monkeypatch.setattr(sized, "_probe_saved_bytes",
                        lambda tokens: probes.append(tokens) or measure(tokens))
    loss, weights = _step(sized)
    per_token = microbatch_budget.saved_bytes_per_token(measure)
    assert sized.microbatch_sizing == "free memory" and sorted(probes) == [128, 256]
    assert sized.tokens_per_microbatch == microbatch_budget.microbatch_tokens(per_token, 64 * MIB)
    assert microbatch_budget.MIN_TOKENS < sized.tokens_per_microbatch != before
    # A bf16 token of this 2-layer model saves a few KiB (activations, not weights).
    assert 2_000 < per_token < 100_000
    _step(sized)
    assert len(probes) == 2  # chosen once
    monkeypatch.setenv("AUTORESEARCH_TOKENS_PER_MICROBATCH", "8192")
    fixed = Engine(load_base_model(str(tiny_model_dir), emulate="cuda"))
    fixed_loss, fixed_weights = _step(fixed)
    assert fixed.microbatch_sizing == "override" and fixed.tokens_per_microbatch == 8192
    assert loss == fixed_loss and torch.equal(weights, fixed_weights)


def test_the_cpu_and_a_deterministic_start_keep_a_fixed_size(tiny_model_dir, monkeypatch):
    monkeypatch.delenv("AUTORESEARCH_TOKENS_PER_MICROBATCH", raising=False)
    cpu = Engine(load_base_model(str(tiny_model_dir), device="cpu", dtype="float32"))
    _step(cpu)
    assert cpu.microbatch_sizing == "fixed" and cpu.tokens_per_microbatch == 2048
    deterministic = Engine(load_base_model(str(tiny_model_dir), emulate="cuda"))
    deterministic.deterministic = True
    _step(deterministic)
    assert deterministic.microbatch_sizing == "fixed"
    assert deterministic.tokens_per_microbatch == 2048  # the default of the CPU it runs on
