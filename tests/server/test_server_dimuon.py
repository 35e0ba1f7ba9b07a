"""Dimuon, Tinker's second optimizer: chosen when the training client is created, stepped with
`DimuonParams`, checked against an independent implementation of the documented update (the
gradient clipped by its global norm, a running average by `beta1`, each matrix moved by the
learning rate along its matrix sign at Frobenius norm sqrt(rank)), saved and restored with the
run, fused beside AdamW runs without touching them, and refused by name where the families
are mixed."""

from __future__ import annotations

import numpy as np
import pytest
import tinker
import torch
from tinker import types

from server.engine.dimuon import Dimuon, matrix_sign, optimizer_type
from server.engine.engine import AdamParams, DimuonParams, Engine, ForwardBackwardJob, UserError
from server.engine.lora import LoraSpec
from tests.server.server_helpers import forward_logprobs, sft_datum
from tests.server.test_server_prefix_sharing import sft_data


def reference_update(weight: np.ndarray, grad: np.ndarray, average: np.ndarray, lr: float,
                     beta1: float, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """The documented update by SVD in float64: what the server's Gram-matrix path must give."""
    average = beta1 * average + (1 - beta1) * grad
    u, s, vh = np.linalg.svd(average, full_matrices=False)
    keep = s > 1e-6 * s.max() if s.size and s.max() > 0 else np.zeros_like(s, bool)
    sign = u[:, keep] @ vh[keep]
    norm = np.linalg.norm(sign)
    step = sign * (np.sqrt(rank) / norm) if norm > 0 else sign
    return weight - lr * step, average


def test_the_matrix_sign_is_the_polar_factor_on_wide_tall_and_rank_deficient_matrices():
    rng = np.random.default_rng(0)
    low = rng.normal(size=(8, 2)) @ rng.normal(size=(2, 5))  # rank 2 of 5
    for m in (rng.normal(size=(4, 32)), rng.normal(size=(32, 4)), low, np.zeros((4, 6))):
        got = matrix_sign(torch.tensor(m, dtype=torch.float32)).double().numpy()
        u, s, vh = np.linalg.svd(m, full_matrices=False)
        keep = s > 1e-6 * s.max() if s.max() > 0 else np.zeros_like(s, bool)
        np.testing.assert_allclose(got, u[:, keep] @ vh[keep], atol=2e-6)


def _step(engine: Engine, state, data, params) -> dict[str, np.ndarray]:
    """forward_backward then optim_step; returns the gradients the step used (clipped as the
    step clips them: the reference sees the same ones)."""
    engine.forward_backward([ForwardBackwardJob(state, data, "cross_entropy", {}, False)])
    grads = {}
    for name in sorted(state.adapter.a):
        for kind, table in (("a", state.adapter.a), ("b", state.adapter.b)):
            grads[f"{name}.{kind}"] = table[name].grad.double().numpy().copy()
    total = np.sqrt(sum(float((g ** 2).sum()) for g in grads.values()))
    if params.grad_clip_norm > 0 and total > params.grad_clip_norm:
        grads = {k: g * (params.grad_clip_norm / (total + 1e-6)) for k, g in grads.items()}
    engine.optim_step(state, params)
    return grads


def test_three_steps_match_the_documented_update(engine):
    rank = 4
    state = engine.create_run(LoraSpec(rank=rank), seed=5, optimizer="dimuon")
    assert isinstance(state.optimizer, Dimuon) and state.optimizer_type == "dimuon"
    rng = np.random.default_rng(1)
    tables = (("a", state.adapter.a), ("b", state.adapter.b))
    weights = {f"{n}.{k}": t[n].detach().double().numpy().copy()
               for n in state.adapter.a for k, t in tables}
    averages = {k: np.zeros_like(w) for k, w in weights.items()}
    schedule = [DimuonParams(1e-2, 0.0, 0.9), DimuonParams(5e-3, 0.5, 0.8),
                DimuonParams(1e-2, 0.0, 0.0)]
    for params in schedule:
        grads = _step(engine, state, sft_data(rng, engine.vocab_size, 10, [6, 9]), params)
        for key, grad in grads.items():
            weights[key], averages[key] = reference_update(
                weights[key], grad, averages[key], params.learning_rate, params.beta1, rank)
    moved = 0
    for name in state.adapter.a:
        for kind, table in (("a", state.adapter.a), ("b", state.adapter.b)):
            got = table[name].detach().double().numpy()
            np.testing.assert_allclose(got, weights[f"{name}.{kind}"], atol=1e-5)
            moved += kind == "a" and not np.allclose(got, 0)
    assert moved  # A moved once B was non-zero (its first gradient is zero)


def test_dimuon_and_adamw_runs_fused_in_one_batch_leave_each_other_alone(engine):
    rng = np.random.default_rng(2)
    data = sft_data(rng, engine.vocab_size, 8, [5, 7])
    other = sft_data(rng, engine.vocab_size, 8, [9, 4])

    def adam_after(beside: bool) -> dict[str, torch.Tensor]:
        adam = engine.create_run(LoraSpec(rank=4), seed=9)
        jobs = [ForwardBackwardJob(adam, data, "cross_entropy", {}, False)]
        if beside:
            dimuon = engine.create_run(LoraSpec(rank=4), seed=9, optimizer="dimuon")
            jobs.append(ForwardBackwardJob(dimuon, other, "cross_entropy", {}, False))
        engine.forward_backward(jobs)
        engine.optim_step(adam, AdamParams(learning_rate=1e-2))
        if beside:
            engine.optim_step(dimuon, DimuonParams(learning_rate=1e-2))
        return {n: t.detach().clone() for n, t in adam.adapter.b.items()}

    alone, fused = adam_after(False), adam_after(True)
    assert all(torch.equal(alone[n], fused[n]) for n in alone)


def test_the_engine_refuses_the_other_familys_parameters(engine):
    adam = engine.create_run(LoraSpec(rank=2), seed=1)
    dimuon = engine.create_run(LoraSpec(rank=2), seed=1, optimizer="dimuon")
    with pytest.raises(UserError, match="created with the AdamW optimizer"):
        engine.optim_step(adam, DimuonParams(learning_rate=1e-3))
    with pytest.raises(UserError, match="created with the Dimuon optimizer"):
        engine.optim_step(dimuon, AdamParams(learning_rate=1e-3))
    assert optimizer_type(dimuon.optimizer.state_dict()) == "dimuon"
    assert optimizer_type(adam.optimizer.state_dict()) == "adamw"


def test_through_the_sdk_dimuon_trains_saves_restores_and_refuses_adam_by_name(
    service_client, base_model, sequences
):
    client = service_client.create_lora_training_client(
        base_model=base_model, rank=4, seed=3, optimizer=types.DimuonOptimizerConfig(version=1))
    info = client.get_info()
    assert info.optimizer_config.type == "dimuon"
    data = [sft_datum(ids) for ids in sequences[:3]]
    params = types.DimuonParams(learning_rate=2e-2, grad_clip_norm=1.0, beta1=0.9)
    losses = []
    for _ in range(3):
        losses.append(client.forward_backward(data, "cross_entropy").result().metrics["loss:sum"])
        client.optim_step(params).result()
    assert losses[-1] < losses[0]
    with pytest.raises(tinker.TinkerError, match="created with the dimuon optimizer"):
        client.optim_step(types.AdamParams(learning_rate=1e-3)).result()

    path = client.save_state("dimuon").result().path
    client.forward_backward(data, "cross_entropy").result()
    client.optim_step(params).result()
    stepped = forward_logprobs(client, data)
    restored = service_client.create_training_client_from_state_with_optimizer(path).result()
    assert restored.get_info().optimizer_config.type == "dimuon"
    restored.forward_backward(data, "cross_entropy").result()
    restored.optim_step(params).result()
    for got, want in zip(forward_logprobs(restored, data), stepped, strict=True):
        assert np.array_equal(got, want)  # the running average came back with the weights

    adam = service_client.create_lora_training_client(base_model=base_model, rank=4, seed=3)
    assert adam.get_info().optimizer_config.type == "adamw"
    adam.forward_backward(data, "cross_entropy").result()
    with pytest.raises(tinker.TinkerError, match="created with the adamw optimizer"):
        adam.optim_step(params).result()
    adam.optim_step(types.AdamParams(learning_rate=1e-3)).result()  # the run goes on

