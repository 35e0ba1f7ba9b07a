"""One key's diverged run cannot reach another key's run, not even with NaN.

Two keys share one server with fusion on. The attacker's run is driven to divergence the ways
a client can (stale logprobs that make its loss infinite, a learning rate or weight decay large
enough to overflow) and every such step must be refused with the weights left as they were.
Then, to cover "by any path", the attacker's adapter is set to NaN inside the server and fused
with the victim's work in one batch: the victim's losses, logprobs, gradients and samples
must stay finite and equal to the victim trained on a quiet server.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
import tinker
import torch
from tinker import types

from tests.server.server_helpers import (
    EngineProbe,
    forward_logprobs,
    new_run,
    sft_datum,
    start_server,
    wait_queued,
)

ALICE, MALLORY = "tml-alice-victim", "tml-mallory-attacker"
# Fused rows share padded batches through the base model, whose kernels may sum in another
# order for another batch shape: the victim's numbers may move by float rounding, no more.
FUSED_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def keyed(tiny_model_dir, tmp_path_factory) -> Iterator:
    server = start_server(tiny_model_dir, tmp_path_factory.mktemp("tenants"),
                          api_keys=f"{ALICE},{MALLORY}")
    yield server
    server.stop()


def _stale_is_datum(ids: list[int]) -> types.Datum:
    """An importance-sampling datum whose recorded logprobs (-200) make the ratio overflow."""
    n = len(ids) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "logprobs": [-200.0] * n,
                        "advantages": [1.0] * n},
    )


def _fused(server, holder, calls, queues: dict[str, int], sampling: bool = False) -> list:
    """Queue `calls` (thunks returning futures) while the engine is held until `queues` hold
    them, so the scheduler takes them in one turn; returns their results."""
    probe = EngineProbe(server.service.engine)
    try:
        probe.arm()
        held = holder.forward([sft_datum([1, 2, 3])], "cross_entropy")
        probe.wait_held()
        futures = [call() for call in calls]
        wait_queued(server.service.scheduler, queues)
        probe.release()
        held.result()
        results = [f.result() for f in futures]
    finally:
        probe.restore()
    calls_seen = probe.sample_calls if sampling else probe.calls
    assert max(calls_seen) >= 2, f"the runs were never fused: {calls_seen}"
    return results


def test_divergent_steps_are_refused_and_leave_the_weights_unchanged(keyed, base_model,
                                                                     sequences):
    with tinker.ServiceClient(base_url=keyed.url, api_key=MALLORY) as service:
        run = new_run(service, base_model, seed=3)
        data = [sft_datum(sequences[0])]
        before = forward_logprobs(run, data)

        run.forward_backward([_stale_is_datum(sequences[0])], "importance_sampling").result()
        with pytest.raises(tinker.RequestFailedError, match="gradient norm is (nan|inf)"):
            run.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        for lr, wd in ((1e30, 0.0), (1e-3, 1e30)):
            run.forward_backward(data, "cross_entropy").result()
            with pytest.raises((tinker.BadRequestError, tinker.RequestFailedError),
                               match="learning_rate"):
                run.optim_step(types.AdamParams(learning_rate=lr, weight_decay=wd)).result()
        after = forward_logprobs(run, data)
        for got, want in zip(after, before, strict=True):
            assert np.array_equal(got, want)

        # The refusals dropped their gradients and kept their order: the run trains on.
        run.forward_backward(data, "cross_entropy").result()
        metrics = run.optim_step(types.AdamParams(learning_rate=1e-2)).result().metrics
        assert math.isfinite(metrics["grad_norm:mean"]) and metrics["grad_norm:mean"] > 0
        assert all(np.isfinite(lp).all() for lp in forward_logprobs(run, data))


def test_a_nan_adapter_fused_with_another_keys_run_changes_nothing_of_it(
    keyed, tiny_model_dir, tmp_path, base_model, sequences
):
    victim_data = [sft_datum(sequences[1]), sft_datum(sequences[2])]
    attacker_data = [sft_datum(sequences[0])]
    params = types.AdamParams(learning_rate=1e-2)

    quiet = start_server(tiny_model_dir, tmp_path / "quiet", api_keys=ALICE)
    try:
        with tinker.ServiceClient(base_url=quiet.url, api_key=ALICE) as service:
            alone = new_run(service, base_model, seed=11)
            want_fb = alone.forward_backward(victim_data, "cross_entropy").result()
            alone.optim_step(params).result()
            want_lp = forward_logprobs(alone, victim_data)
    finally:
        quiet.stop()

    with (tinker.ServiceClient(base_url=keyed.url, api_key=ALICE) as alice,
          tinker.ServiceClient(base_url=keyed.url, api_key=MALLORY) as mallory):
        victim = new_run(alice, base_model, seed=11)
        attacker = new_run(mallory, base_model, seed=12)
        holder = new_run(mallory, base_model, seed=13)
        state = keyed.service.runs[attacker.model_id].state
        with torch.no_grad():
            for tensor in state.adapter.parameters():
                tensor.fill_(float("nan"))

        victim_fb, attacker_fb = _fused(keyed, holder, [
            lambda: victim.forward_backward(victim_data, "cross_entropy"),
            lambda: attacker.forward_backward(attacker_data, "cross_entropy"),
        ], {victim.model_id: 1, attacker.model_id: 1})
        assert math.isnan(attacker_fb.metrics["loss:sum"])
        assert victim_fb.metrics["loss:sum"] == pytest.approx(want_fb.metrics["loss:sum"],
                                                             rel=FUSED_TOLERANCE)
        victim_grads = [t.grad for t in keyed.service.runs[victim.model_id].state.adapter
                        .parameters() if t.grad is not None]
        assert victim_grads and all(torch.isfinite(g).all() for g in victim_grads)
        victim.optim_step(params).result()

        got_lp, _ = _fused(keyed, holder, [
            lambda: victim.forward([sft_datum(s.model_input.to_ints() + [1])
                                    for s in victim_data], "cross_entropy"),
            lambda: attacker.forward(attacker_data, "cross_entropy"),
        ], {victim.model_id: 1, attacker.model_id: 1})
        scored = forward_logprobs(victim, victim_data)
        for got, want in zip(scored, want_lp, strict=True):
            np.testing.assert_allclose(got, want, atol=FUSED_TOLERANCE)
        assert all(np.isfinite(o["logprobs"].to_numpy()).all() for o in got_lp.loss_fn_outputs)

        # Sampling: the victim's samples decoded beside the NaN adapter's stay finite.
        victim_sampler = victim.save_weights_and_get_sampling_client().result()
        attacker_sampler = attacker.save_weights_and_get_sampling_client().result()
        prompt = types.ModelInput.from_ints(sequences[1][:6])
        sp = types.SamplingParams(max_tokens=6, temperature=1.0, seed=5)
        victim_samples, _ = _fused(keyed, holder, [
            lambda: victim_sampler.sample(prompt, 4, sp),
            lambda: attacker_sampler.sample(prompt, 4, sp),
        ], {"_sampling": 2}, sampling=True)
        for seq in victim_samples.sequences:
            assert len(seq.tokens) > 0 and all(math.isfinite(lp) for lp in seq.logprobs)
