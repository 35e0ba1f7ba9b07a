"""`gspo`, `stable_reinforce` and `dro` as Tinker defines them, and the provenance plumbing that
`stable_reinforce` trains on (`record_stability_info=True` at sampling, `loss_fn_input_spans`)."""

from __future__ import annotations

import math

import httpx
import numpy as np
import pytest
import tinker
import torch
from tinker import types

from server.engine import losses
from server.protocol.codec import Span
from server.service.sampling_records import SamplingRecords
from tests.server.server_helpers import API_KEY, new_run, rl_datum


# ------------------------------------------------------------- pure math
def _grad(loss_fn, target_lp: torch.Tensor, inputs, config=None):
    lp = target_lp.clone().requires_grad_(True)
    loss = loss_fn(lp, inputs, config or {}).sum()
    loss.backward()
    return float(loss.detach()), lp.grad


def test_gspo_matches_tinkers_published_formula():
    target = torch.tensor([[-1.0, -2.0, -0.5, -3.0]])
    inputs = {
        "logprobs": torch.tensor([[0.0, -1.8, -0.9, -2.0]]),
        "advantages": torch.tensor([[0.0, 1.0, 1.0, -0.5]]),
        "sequence_ratio_mask": torch.tensor([[0.0, 1.0, 1.0, 1.0]]),
    }
    loss, grad = _grad(losses.gspo, target, inputs)
    in_ratio = inputs["sequence_ratio_mask"][0] != 0
    log_ratio = (target[0] - inputs["logprobs"][0])[in_ratio].mean()
    s = math.exp(float(log_ratio))
    adv = inputs["advantages"][0]
    clipped = min(max(s, 0.8), 1.2)
    expected = -sum(min(s * float(a), clipped * float(a)) for a in adv)
    assert loss == pytest.approx(expected, rel=1e-6)
    # Each token gets the sequence ratio's value times its own gradient, unless clipped away.
    for t, a in enumerate(adv.tolist()):
        active = (a > 0 and s < 1.2) or (a < 0 and s > 0.8) or a == 0
        assert float(grad[0, t]) == pytest.approx(-s * a if active else 0.0, abs=1e-6)


def test_gspo_with_an_empty_mask_uses_a_ratio_of_one():
    target = torch.tensor([[-1.0, -2.0]])
    inputs = {"logprobs": torch.tensor([[-3.0, -3.0]]), "advantages": torch.tensor([[1.0, 1.0]]),
              "sequence_ratio_mask": torch.zeros(1, 2)}
    loss, grad = _grad(losses.gspo, target, inputs)
    assert loss == pytest.approx(-2.0)
    assert torch.allclose(grad, torch.tensor([[-1.0, -1.0]]))


def test_stable_reinforce_is_truncated_reinforce_on_recorded_tokens_only():
    target = torch.tensor([[-1.0, -1.0, -2.0, -0.1]])
    inputs = {
        "advantages": torch.tensor([[5.0, 1.0, -1.0, 2.0]]),
        losses.RECORDED_LOGPROBS: torch.tensor([[0.0, -1.0, -1.0, -3.0]]),
        losses.RECORDED_MASK: torch.tensor([[0.0, 1.0, 1.0, 1.0]]),
    }
    loss, grad = _grad(losses.stable_reinforce, target, inputs)
    ratios = [1.0, math.exp(-1.0), min(math.exp(2.9), 2.0)]
    advs = [1.0, -1.0, 2.0]
    lps = [-1.0, -2.0, -0.1]
    assert loss == pytest.approx(-sum(r * a * lp for r, a, lp in zip(ratios, advs, lps)), rel=1e-5)
    assert float(grad[0, 0]) == 0.0  # no record: no signal, whatever its advantage
    for t, (r, a) in enumerate(zip(ratios, advs), start=1):
        assert float(grad[0, t]) == pytest.approx(-r * a, rel=1e-5)


def test_stable_reinforce_kl_term_pulls_towards_the_sampler():
    target = torch.tensor([[-0.5]])
    inputs = {"advantages": torch.zeros(1, 1), losses.RECORDED_LOGPROBS: torch.tensor([[-1.0]]),
              losses.RECORDED_MASK: torch.ones(1, 1)}
    loss, grad = _grad(losses.stable_reinforce, target, inputs, {"kl_coeff": 0.1})
    r = math.exp(0.5)
    assert loss == pytest.approx(0.1 * (r - 1 - 0.5), rel=1e-5)
    assert float(grad[0, 0]) == pytest.approx(0.1 * (r - 1), rel=1e-5)  # > 0: lowers logp


def test_dro_without_beta_says_tinker_has_no_default():
    with pytest.raises(losses.LossError, match="documents no default"):
        losses.dro(torch.zeros(1, 2), {"logprobs": torch.zeros(1, 2),
                                       "advantages": torch.zeros(1, 2)}, {})


# ---------------------------------------------------------- the records
def test_records_are_session_scoped_checked_against_targets_and_bounded():
    clock = [0.0]
    records = SamplingRecords(max_tokens=20, ttl_seconds=100.0, clock=lambda: clock[0])
    records.add("k", "s1", "a", 3, [7, 8, 9], [-0.1, -0.2, -0.3])
    spans = [Span("a", 1, 2, False), Span("a", 0, 3, True)]
    out = records.resolve("k", "s1", 0, np.array([0, 0, 7, 8, 9]), spans)
    np.testing.assert_allclose(out[losses.RECORDED_LOGPROBS], [0, 0, -0.1, -0.2, -0.3], atol=1e-7)
    np.testing.assert_array_equal(out[losses.RECORDED_MASK], [0, 0, 1, 1, 1])
    for owner, session in (("other-key", "s1"), ("k", "s2")):
        with pytest.raises(losses.LossError, match="no sampling record"):
            records.resolve(owner, session, 0, np.array([0, 0, 7, 8, 9]), spans)
    with pytest.raises(losses.LossError, match="not the tokens sampled"):
        records.resolve("k", "s1", 0, np.array([0, 0, 7, 8, 1]), spans)
    with pytest.raises(losses.LossError, match="tile"):
        records.resolve("k", "s1", 0, np.array([7, 8, 9]), spans)
    # A day after last use (here: 100 s) the record is gone; use restarts the clock.
    clock[0] = 90.0
    records.resolve("k", "s1", 0, np.array([0, 0, 7, 8, 9]), spans)
    clock[0] = 180.0
    records.resolve("k", "s1", 0, np.array([0, 0, 7, 8, 9]), spans)
    clock[0] = 300.0
    with pytest.raises(losses.LossError, match="no sampling record"):
        records.resolve("k", "s1", 0, np.array([0, 0, 7, 8, 9]), spans)
    # Past the token budget the least recently used records go first.
    for i in range(5):
        records.add("k", "s1", f"b{i}", 2, [1, 2], [0.0, 0.0])
    assert records.recorded_tokens <= 20
    assert len(records) == 5


# ------------------------------------------------- through the tinker SDK
def _recorded_datum(prompt: list[int], seq, advantage: float) -> types.Datum:
    datum = rl_datum(prompt, list(seq.tokens), list(seq.logprobs), advantage)
    n = len(seq.tokens)
    return datum.with_provenance(
        model_input=[types.PromptProvenanceSpan(sequence_id=seq.sequence_id, length=len(prompt)),
                     types.SampledProvenanceSpan(sequence_id=seq.sequence_id, length=n - 1)],
        loss_fn_inputs=[
            types.PromptProvenanceSpan(sequence_id=seq.sequence_id, offset=1,
                                       length=len(prompt) - 1),
            types.SampledProvenanceSpan(sequence_id=seq.sequence_id, length=n),
        ],
    )


def test_stable_reinforce_trains_on_recorded_samples(tiny_server, base_model, sequences):
    prompt = sequences[0][:5]
    params = types.SamplingParams(max_tokens=6, temperature=1.0, seed=1, stop=[])
    with tinker.ServiceClient(base_url=tiny_server.url, api_key=API_KEY) as service:
        client = new_run(service, base_model, seed=7)
        sampler = client.save_weights_and_get_sampling_client(record_stability_info=True).result()
        seqs = sampler.sample(types.ModelInput.from_ints(prompt), 2, params).result().sequences
        data = [_recorded_datum(prompt, s, adv) for s, adv in zip(seqs, (1.0, -1.0))]
        fb = client.forward_backward(data, "stable_reinforce").result()
        # At step zero the policy is the sampler: every weight is 1, the loss is -sum(A * logp).
        expected = -sum(adv * float(np.sum(s.logprobs)) for s, adv in zip(seqs, (1.0, -1.0)))
        assert fb.metrics["loss:sum"] == pytest.approx(expected, abs=1e-3)
        client.optim_step(types.AdamParams(learning_rate=1e-2)).result()

        # Errors are the SDK's user errors, and the run keeps working after them.
        bare = rl_datum(prompt, list(seqs[0].tokens), list(seqs[0].logprobs), 1.0)
        with pytest.raises(tinker.RequestFailedError, match="provenance") as err:
            client.forward_backward([bare], "stable_reinforce").result()
        assert err.value.category == "user"
        other = new_run(service, base_model, seed=8)
        assert other.forward_backward(data, "stable_reinforce").result()  # same session: fine
        assert client.forward_backward(data, "stable_reinforce").result()

    with tinker.ServiceClient(base_url=tiny_server.url, api_key=API_KEY) as elsewhere:
        stranger = new_run(elsewhere, base_model, seed=9)
        with pytest.raises(tinker.RequestFailedError, match="no sampling record"):
            stranger.forward_backward(data, "stable_reinforce").result()


def test_gspo_and_dro_defaults_through_the_sdk(service_client, base_model, sequences):
    client = new_run(service_client, base_model, seed=11)
    datum = rl_datum(sequences[1][:4], sequences[1][4:8], [-1.0] * 4, 1.0)
    mask = [0.0] * 3 + [1.0] * 4
    gspo = types.Datum(model_input=datum.model_input,
                       loss_fn_inputs={**datum.loss_fn_inputs, "sequence_ratio_mask": mask})
    fb = client.forward_backward([gspo], "gspo").result()
    assert math.isfinite(fb.metrics["loss:sum"])
    with pytest.raises(tinker.RequestFailedError, match="documents no default"):
        client.forward_backward([datum], "dro").result()


def test_recorded_sampling_is_refused_up_front_when_it_cannot_be_trained_on(
    tiny_server, base_model, monkeypatch
):
    body = {"num_samples": 1, "prompt": {"chunks": [{"type": "encoded_text", "tokens": [5, 6]}]},
            "sampling_params": {"max_tokens": 2}, "base_model": base_model,
            "record_stability_info": True, "type": "sample"}
    headers = {"X-API-Key": API_KEY}
    answer = httpx.post(f"{tiny_server.url}/api/v1/asample", json=body, headers=headers)
    assert answer.status_code == 400 and "sampling session" in answer.json()["error"]
    monkeypatch.delitem(losses.LOSSES, "stable_reinforce")
    answer = httpx.post(f"{tiny_server.url}/api/v1/asample", json=body, headers=headers)
    assert answer.status_code == 400 and "not support" in answer.json()["error"]
