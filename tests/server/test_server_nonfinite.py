"""Non-finite values stay with the run that made them, and never break an answer.

An optimizer step is all or nothing: a step whose result is not finite is undone with the
weights and AdamW state as they were. A forward-only job fused with a training job leaves its
run without gradients (AdamW would otherwise move it by momentum and weight decay). A run whose
weights are loaded non-finite says so and refuses to train. JSON results carrying NaN or
infinity encode as strict JSON that the SDK reads back as the same floats.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from tinker import types

from server.engine.engine import AdamParams, Engine, ForwardBackwardJob, NonFiniteRun, UserError
from server.engine.lora import LoraSpec
from server.engine.model_loading import load_base_model
from server.protocol.codec import Datum
from server.protocol.json_values import json_safe


@pytest.fixture(scope="module")
def engine(tiny_model_dir) -> Engine:
    return Engine(load_base_model(str(tiny_model_dir), device="cpu", dtype="float32"))


def _sft(tokens: list[int]) -> Datum:
    ids = np.asarray(tokens, dtype=np.int64)
    return Datum(ids[:-1], {"target_tokens": ids[1:],
                            "weights": np.ones(len(ids) - 1, np.float32)})


def _train(engine: Engine, state, data) -> None:
    engine.forward_backward([ForwardBackwardJob(state, data, "cross_entropy", {}, False)])


def _copies(state) -> tuple[list[torch.Tensor], dict]:
    weights = [t.detach().clone() for t in state.adapter.parameters()]
    optim = {id(p): {k: v.clone() for k, v in s.items() if torch.is_tensor(v)}
             for p, s in state.optimizer.state.items()}
    return weights, optim


def test_a_step_that_ends_non_finite_is_undone(engine, sequences, monkeypatch):
    state = engine.create_run(LoraSpec(rank=4), seed=1)
    data = [_sft(sequences[0])]
    _train(engine, state, data)
    engine.optim_step(state, AdamParams(learning_rate=1e-2))
    weights, optim = _copies(state)
    _train(engine, state, data)

    real_step = state.optimizer.step

    def overflowing_step():
        real_step()
        with torch.no_grad():
            state.adapter.parameters()[0].view(-1)[0] = float("inf")

    monkeypatch.setattr(state.optimizer, "step", overflowing_step)
    with pytest.raises(UserError, match="non-finite"):
        engine.optim_step(state, AdamParams(learning_rate=1e-2))
    for got, want in zip(state.adapter.parameters(), weights, strict=True):
        assert torch.equal(got, want)
    for param, moments in state.optimizer.state.items():
        for key, value in moments.items():
            if torch.is_tensor(value):
                assert torch.equal(value, optim[id(param)][key]), key
    assert all(t.grad is None for t in state.adapter.parameters())
    assert state.steps == 1


def test_a_forward_only_job_fused_with_training_leaves_no_gradient(engine, sequences):
    trained = engine.create_run(LoraSpec(rank=4), seed=2)
    scored = engine.create_run(LoraSpec(rank=4), seed=3)
    jobs = [ForwardBackwardJob(trained, [_sft(sequences[0])], "cross_entropy", {}, False),
            ForwardBackwardJob(scored, [_sft(sequences[1])], "cross_entropy", {}, True)]
    for share in (True, False):
        engine.share_prefixes = share
        try:
            engine.forward_backward(jobs)
        finally:
            engine.share_prefixes = True
        assert all(t.grad is None for t in scored.adapter.parameters()), share
        assert any(t.grad is not None for t in trained.adapter.parameters()), share
        trained.optimizer.zero_grad(set_to_none=True)


def test_a_run_loaded_with_non_finite_weights_says_so_and_refuses_to_train(engine, sequences):
    state = engine.create_run(LoraSpec(rank=4), seed=4)
    adapter = state.adapter.frozen_copy()
    with torch.no_grad():
        next(iter(adapter.b.values())).fill_(float("nan"))
    restored = engine.restore_run(adapter, None)
    assert restored.nonfinite is not None
    _train(engine, restored, [_sft(sequences[0])])
    with pytest.raises(NonFiniteRun, match="not finite"):
        engine.optim_step(restored, AdamParams(learning_rate=1e-3))
    assert engine.restore_run(state.adapter.frozen_copy(), None).nonfinite is None


def test_non_finite_results_encode_as_strict_json_the_sdk_reads_back():
    result = {"metrics": {"grad_norm:mean": math.nan, "loss:sum": -math.inf, "ok": 1.5},
              "rows": [math.inf, 2.0]}
    safe = json_safe(result)
    text = json.dumps(safe, allow_nan=False)
    parsed = types.OptimStepResponse.model_validate(json.loads(text))
    assert math.isnan(parsed.metrics["grad_norm:mean"])
    assert parsed.metrics["loss:sum"] == -math.inf and parsed.metrics["ok"] == 1.5
    assert safe["rows"] == ["Infinity", 2.0]
