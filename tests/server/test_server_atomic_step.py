"""forward_backward is all-or-nothing per run, alone or fused with other runs.

Faults are injected inside the engine's loss computation, in the k-th micro-batch that carries
gradients (the engine runs small micro-batches here, so a request spans several and the earlier
ones have already been back-propagated when the fault hits). Afterwards each run's gradients
must be exactly what they were before the call, and a fused batch that failed and was retried
run by run must give every run the gradients, results and next optimizer step of a run that
trained alone. Comparisons are bitwise: the retried run does the same arithmetic as the
reference run.
"""

from __future__ import annotations

import numpy as np
import pytest
import tinker
from tinker import types

from server.engine import losses
from tests.server.server_helpers import (
    API_KEY,
    EngineProbe,
    forward_logprobs,
    new_run,
    output_logprobs,
    sft_datum,
    start_server,
    wait_queued,
)

POISON = 7.25
"""A weight no real datum uses: a row carrying it makes the loss raise (a persistent fault)."""
TIMEOUT = 60


class Faults:
    """Wraps the cross-entropy loss: raises in the k-th gradient-carrying call once armed, and
    in every call that sees a poisoned row."""

    def __init__(self, real):
        self.real = real
        self.calls = 0
        self.fail_at: int | None = None
        self.fired = 0

    def arm(self, k: int) -> None:
        self.fail_at = self.calls + k

    def __call__(self, target_lp, inputs, config):
        if target_lp.requires_grad:
            self.calls += 1
            if self.fail_at == self.calls:
                self.fail_at = None
                self.fired += 1
                raise RuntimeError("injected fault")
        if bool((inputs["weights"] == POISON).any()):
            raise losses.LossError("poisoned row")
        return self.real(target_lp, inputs, config)


@pytest.fixture(scope="module")
def server(tiny_model_dir, tmp_path_factory):
    server = start_server(tiny_model_dir, tmp_path_factory.mktemp("atomic-data"))
    server.service.engine.tokens_per_microbatch = 48
    yield server
    server.stop()


@pytest.fixture
def faults(monkeypatch):
    wrapper = Faults(losses.LOSSES["cross_entropy"])
    monkeypatch.setitem(losses.LOSSES, "cross_entropy", wrapper)
    return wrapper


@pytest.fixture
def svc(server):
    with tinker.ServiceClient(base_url=server.url, api_key=API_KEY) as client:
        yield client


def batch(sequences, shift: int, poison_last: bool = False) -> list[types.Datum]:
    rows = [sequences[(i + shift) % len(sequences)] for i in range(4)]
    data = [sft_datum(ids) for ids in rows]
    if poison_last:
        ids = rows[-1]
        data[-1] = sft_datum(ids, [POISON] * (len(ids) - 1))
    return data


def grads(server, client) -> list[np.ndarray | None]:
    state = server.service.runs[client.model_id].state
    return [None if p.grad is None else p.grad.detach().clone().numpy()
            for p in state.adapter.parameters()]


def assert_same_grads(left, right) -> None:
    assert len(left) == len(right)
    for a, b in zip(left, right, strict=True):
        assert (a is None) == (b is None)
        if a is not None:
            assert np.array_equal(a, b)


def step(client) -> None:
    client.optim_step(types.AdamParams(learning_rate=1e-2)).result(timeout=TIMEOUT)


def test_single_run_fault_in_a_later_microbatch_leaves_gradients_untouched(
    server, svc, base_model, sequences, faults
):
    run, ref = new_run(svc, base_model, seed=3), new_run(svc, base_model, seed=3)
    first, second = batch(sequences, 0), batch(sequences, 1)
    for client in (run, ref):
        client.forward_backward(first, "cross_entropy").result(timeout=TIMEOUT)
    before = grads(server, run)
    assert all(g is not None for g in before)

    faults.arm(2)  # the second micro-batch of the call
    with pytest.raises(tinker.RequestFailedError) as err:
        run.forward_backward(second, "cross_entropy").result(timeout=TIMEOUT)
    assert err.value.category == "server" and faults.fired == 1
    assert_same_grads(grads(server, run), before)

    # The client's retry adds the step once, exactly as a run that never failed.
    got = run.forward_backward(second, "cross_entropy").result(timeout=TIMEOUT)
    want = ref.forward_backward(second, "cross_entropy").result(timeout=TIMEOUT)
    assert got.metrics["loss:sum"] == want.metrics["loss:sum"]
    assert_same_grads(grads(server, run), grads(server, ref))
    step(run)
    step(ref)
    for a, b in zip(forward_logprobs(run, first), forward_logprobs(ref, first), strict=True):
        assert np.array_equal(a, b)


def _fused(server, svc, clients, data, faults, k: int | None):
    """Queue one forward_backward per client behind a held engine so they fuse into one
    batch; arm the fault at the k-th micro-batch of that fused call."""
    engine = server.service.engine
    probe = EngineProbe(engine)
    inner = engine.forward_backward

    def arming(jobs):
        if len(jobs) > 1 and k is not None and not faults.fired:
            faults.arm(k)
        return inner(jobs)

    engine.forward_backward = arming
    try:
        holder = new_run(svc, server.service.base_model, seed=99)
        probe.arm()
        held = holder.forward_backward(data[0][:1], "cross_entropy")
        probe.wait_held()
        futures = [c.forward_backward(d, "cross_entropy") for c, d in zip(clients, data)]
        wait_queued(server.service.scheduler, {c.model_id: 1 for c in clients})
        probe.release()
        held.result(timeout=TIMEOUT)
        outcomes = []
        for future in futures:
            try:
                outcomes.append(future.result(timeout=TIMEOUT))
            except tinker.RequestFailedError as exc:
                outcomes.append(exc)
        return outcomes, list(probe.calls)
    finally:
        engine.forward_backward = inner
        probe.restore()


def test_failed_fused_batch_retried_alone_equals_unfused_runs(
    server, svc, base_model, sequences, faults
):
    runs = [new_run(svc, base_model, seed=s) for s in (11, 12)]
    refs = [new_run(svc, base_model, seed=s) for s in (11, 12)]
    data = [batch(sequences, i) for i in range(2)]
    # Every run already holds gradients from an earlier step that must survive intact.
    for client in runs + refs:
        client.forward_backward(data[0], "cross_entropy").result(timeout=TIMEOUT)
    before = [grads(server, r) for r in runs]

    outcomes, calls = _fused(server, svc, runs, data, faults, k=3)
    assert faults.fired == 1
    assert 2 in calls, calls  # the two runs were fused into one batch (which failed) ...
    assert calls[calls.index(2) + 1:][:2] == [1, 1], calls  # ... then retried one by one
    wanted = [ref.forward_backward(d, "cross_entropy").result(timeout=TIMEOUT)
              for ref, d in zip(refs, data)]
    for run, ref, got, want, prior in zip(runs, refs, outcomes, wanted, before):
        assert not isinstance(got, Exception), got
        assert got.metrics["loss:sum"] == want.metrics["loss:sum"]
        for a, b in zip(output_logprobs(got), output_logprobs(want), strict=True):
            assert np.array_equal(a, b)
        assert_same_grads(grads(server, run), grads(server, ref))
        assert not all(np.array_equal(a, b) for a, b in zip(grads(server, run), prior))
    for run, ref in zip(runs, refs):
        step(run)
        step(ref)
        for a, b in zip(forward_logprobs(run, data[1]), forward_logprobs(ref, data[1]),
                        strict=True):
            assert np.array_equal(a, b)


def test_a_run_that_fails_in_a_fused_batch_keeps_its_gradients_and_spares_the_others(
    server, svc, base_model, sequences, faults
):
    good, bad = new_run(svc, base_model, seed=21), new_run(svc, base_model, seed=22)
    good_ref, bad_ref = new_run(svc, base_model, seed=21), new_run(svc, base_model, seed=22)
    clean = [batch(sequences, 0), batch(sequences, 1)]
    for client, d in ((good, clean[0]), (bad, clean[1]), (good_ref, clean[0]),
                      (bad_ref, clean[1])):
        client.forward_backward(d, "cross_entropy").result(timeout=TIMEOUT)
    bad_before = grads(server, bad)

    # The poisoned row is the bad run's last, so its earlier micro-batches back-propagate
    # before the loss raises, in the fused batch and again when retried alone.
    data = [batch(sequences, 2), batch(sequences, 2, poison_last=True)]
    outcomes, calls = _fused(server, svc, [good, bad], data, faults, k=None)
    assert 2 in calls, calls
    assert not isinstance(outcomes[0], Exception), outcomes[0]
    assert isinstance(outcomes[1], tinker.RequestFailedError)
    assert outcomes[1].category == "user" and "poisoned" in str(outcomes[1])
    assert_same_grads(grads(server, bad), bad_before)

    want = good_ref.forward_backward(data[0], "cross_entropy").result(timeout=TIMEOUT)
    assert outcomes[0].metrics["loss:sum"] == want.metrics["loss:sum"]
    assert_same_grads(grads(server, good), grads(server, good_ref))
    for client in (good, bad, good_ref, bad_ref):
        step(client)
    for run, ref in ((good, good_ref), (bad, bad_ref)):
        for a, b in zip(forward_logprobs(run, clean[0]), forward_logprobs(ref, clean[0]),
                        strict=True):
            assert np.array_equal(a, b)
