"""Training through the SDK: SFT, the RL losses, custom losses, and sampler snapshots."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tinker
import torch
from tinker import types

from tests.server.server_helpers import (
    EngineProbe,
    forward_logprobs,
    new_run,
    output_logprobs,
    rl_datum,
    sft_datum,
    sft_step,
    wait_queued,
)


def test_sft_steps_on_fixed_sequences_lower_the_loss(service_client, base_model, sequences):
    client = new_run(service_client, base_model, seed=1)
    data = [sft_datum(ids) for ids in sequences[:2]]
    losses = [sft_step(client, data, lr=1e-2) for _ in range(6)]
    final = client.forward(data, "cross_entropy").result().metrics["loss:sum"]
    assert all(math.isfinite(x) for x in losses)
    assert final < 0.5 * losses[0], (losses, final)


def _rollouts(client: tinker.TrainingClient, prompt: list[int], n: int, max_tokens: int):
    sampler = client.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=3, stop=[])
    return sampler.sample(types.ModelInput.from_ints(prompt), n, params).result().sequences


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo"])
def test_policy_gradient_step_raises_logprobs_of_positively_advantaged_samples(
    service_client, base_model, sequences, loss_fn
):
    client = new_run(service_client, base_model, seed=2)
    prompt = sequences[0][:5]
    rollouts = _rollouts(client, prompt, n=4, max_tokens=8)
    advantages = [1.0, -0.5, 2.0, -1.0]
    data = [rl_datum(prompt, list(s.tokens), list(s.logprobs), a)
            for s, a in zip(rollouts, advantages, strict=True)]

    fb = client.forward_backward(data, loss_fn).result()
    client.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    after = forward_logprobs(client, data)

    before = output_logprobs(fb)
    n_prompt = len(prompt) - 1
    for datum, lps, seq in zip(data, before, rollouts, strict=True):
        assert len(lps) == datum.model_input.length
        # At step 0 the trainer's logprobs are the sampler's, so every ratio is 1.
        np.testing.assert_allclose(lps[n_prompt:], seq.logprobs, atol=1e-4)
    # With all ratios at 1, the loss is -sum(advantage) over every completion token.
    expected = -sum(a * len(s.tokens) for s, a in zip(rollouts, advantages, strict=True))
    assert math.isfinite(fb.metrics["loss:sum"])
    assert fb.metrics["loss:sum"] == pytest.approx(expected, abs=1e-2)

    gains = [float(np.sum(a[n_prompt:] - b[n_prompt:])) for a, b in zip(after, before, strict=True)]
    for gain, adv in zip(gains, advantages, strict=True):
        if adv > 0:
            assert gain > 0, (gains, advantages)
    assert sum(g * a for g, a in zip(gains, advantages, strict=True)) > 0


@pytest.mark.parametrize(("loss_fn", "config"), [("cispo", None), ("dro", {"beta": 0.05})])
def test_cispo_and_dro_train_the_run(service_client, base_model, sequences, loss_fn, config):
    client = new_run(service_client, base_model, seed=3)
    prompt = sequences[1][:4]
    # Two different samples: identical ones with opposite advantages have zero gradient.
    distinct = {tuple(s.tokens): s for s in _rollouts(client, prompt, n=16, max_tokens=6)}
    assert len(distinct) >= 2, "the model gave one sample only"
    rollouts = list(distinct.values())[:2]
    data = [rl_datum(prompt, list(s.tokens), list(s.logprobs), a)
            for s, a in zip(rollouts, [1.0, -1.0], strict=True)]
    before = forward_logprobs(client, data)

    fb = client.forward_backward(data, loss_fn, config).result()
    client.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    after = forward_logprobs(client, data)

    assert math.isfinite(fb.metrics["loss:sum"])
    assert [len(x) for x in output_logprobs(fb)] == [d.model_input.length for d in data]
    moved = max(float(np.max(np.abs(a - b))) for a, b in zip(after, before, strict=True))
    assert moved > 1e-4


def test_dro_without_beta_is_a_user_error(service_client, base_model, sequences):
    client = new_run(service_client, base_model, seed=3)
    datum = rl_datum(sequences[1][:4], sequences[1][4:8], [-1.0] * 4, 1.0)
    with pytest.raises(tinker.RequestFailedError) as err:
        client.forward_backward([datum], "dro").result()
    assert err.value.category == "user"
    assert "beta" in str(err.value)


def test_custom_loss_matches_the_equivalent_weighted_cross_entropy(
    service_client, base_model, sequences
):
    """A custom loss linear in the logprobs (with negative coefficients too) must train exactly
    like cross_entropy with weights equal to minus its coefficients."""
    ids = sequences[0]
    n = len(ids) - 1
    coef = torch.tensor([0.5 if i % 3 else -1.0 for i in range(n)])
    custom = new_run(service_client, base_model, seed=4)
    reference = new_run(service_client, base_model, seed=4)

    def linear_loss(data, logprobs_list):
        loss = sum((coef * lp).sum() for lp in logprobs_list)
        return loss, {"linear_loss": float(loss.detach())}

    start = forward_logprobs(custom, [sft_datum(ids)])[0]
    out = custom.forward_backward_custom([sft_datum(ids)], linear_loss).result()
    custom.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    reference.forward_backward([sft_datum(ids, weights=(-coef).tolist())], "cross_entropy").result()
    reference.optim_step(types.AdamParams(learning_rate=1e-2)).result()

    assert out.metrics["linear_loss"] == pytest.approx(float(np.dot(coef.numpy(), start)), rel=1e-5)
    after_custom = forward_logprobs(custom, [sft_datum(ids)])[0]
    after_reference = forward_logprobs(reference, [sft_datum(ids)])[0]
    assert np.max(np.abs(after_custom - start)) > 1e-3  # the step really moved the weights
    np.testing.assert_allclose(after_custom, after_reference, atol=1e-6)


def test_sampler_and_trainer_logprobs_agree_at_step_zero(
    tiny_server, service_client, base_model, sequences
):
    """Two prompts of different lengths are decoded in one batch (left-padded, past the
    sliding window); every sampled token's logprob matches the trainer's forward pass."""
    client = new_run(service_client, base_model, seed=5)
    sampler = client.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=40, temperature=1.0, seed=0, stop=[])
    prompts = [sequences[2][:6], sequences[0][:3]]
    holder = new_run(service_client, base_model, seed=0)
    probe = EngineProbe(tiny_server.service.engine)
    try:
        probe.arm()
        held = holder.forward([sft_datum([1, 2, 3])], "cross_entropy")
        probe.wait_held()
        futures = [sampler.sample(types.ModelInput.from_ints(p), 2, params) for p in prompts]
        wait_queued(tiny_server.service.scheduler, {"_sampling": 2})
        probe.release()
        held.result()
        results = [f.result().sequences for f in futures]
    finally:
        probe.restore()
    assert probe.sample_calls == [2], probe.sample_calls

    for prompt, sequences_out in zip(prompts, results, strict=True):
        for seq in sequences_out:
            assert len(seq.tokens) == 40  # past the 32-token sliding window
            datum = rl_datum(prompt, list(seq.tokens), list(seq.logprobs), 0.0)
            trainer = forward_logprobs(client, [datum])[0][len(prompt) - 1 :]
            np.testing.assert_allclose(trainer, seq.logprobs, atol=1e-4)


def test_sampler_snapshot_is_unchanged_by_later_training(service_client, base_model, sequences):
    client = new_run(service_client, base_model, seed=6)
    data = [sft_datum(ids) for ids in sequences[:2]]
    probe = types.ModelInput.from_ints(sequences[2])
    prompt = types.ModelInput.from_ints(sequences[1][:4])
    greedy = types.SamplingParams(max_tokens=12, temperature=0.0, stop=[])

    sft_step(client, data)
    snapshot = client.save_weights_and_get_sampling_client().result()
    logprobs_k = snapshot.compute_logprobs(probe).result()
    sample_k = snapshot.sample(prompt, 1, greedy).result().sequences[0]
    for _ in range(5):
        sft_step(client, data)

    assert snapshot.compute_logprobs(probe).result() == logprobs_k
    again = snapshot.sample(prompt, 1, greedy).result().sequences[0]
    assert (list(again.tokens), list(again.logprobs)) == (list(sample_k.tokens),
                                                          list(sample_k.logprobs))
    fresh = client.save_weights_and_get_sampling_client().result()
    logprobs_new = fresh.compute_logprobs(probe).result()
    diff = np.abs(np.array(logprobs_new[1:]) - np.array(logprobs_k[1:]))
    assert diff.max() > 1e-2


def test_a_forward_backward_is_bound_to_its_run_before_the_scheduler_can_start_it(
    tiny_server, service_client, base_model, sequences, monkeypatch
):
    """The scheduler's thread may start work the moment it is queued; a job queued before its
    run binding was set failed as "'NoneType' object has no attribute 'adapter'" (seen under
    load)."""
    scheduler = tiny_server.service.scheduler
    queued = scheduler.submit_ordered
    bound: list[bool] = []

    def spy(work):
        if work.job is not None:
            bound.append(work.job.state is not None)
        return queued(work)

    monkeypatch.setattr(scheduler, "submit_ordered", spy)
    client = new_run(service_client, base_model, seed=5)
    client.forward_backward([sft_datum(sequences[0])], "cross_entropy").result(timeout=60)
    assert bound == [True]
