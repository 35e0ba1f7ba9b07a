"""Every request that carries a `seq_id` takes its place in its run's order, whatever its fate.

For each ordered endpoint a request that is refused (a 400 at submit, or a future that fails)
is followed by a good one, which must complete: a refusal that never consumed its `seq_id`
would leave the run waiting for it forever. Also here: strict parameters (unknown Adam and
loss-config keys are refused by name) and the line between user errors (400, category "user")
and server faults (500, category "server", logged with a traceback).
"""

from __future__ import annotations

import logging

import httpx
import pytest
import tinker
from tinker import types

from tests.server.server_helpers import API_KEY, new_run, rl_datum, sft_datum

TIMEOUT = 60


def refused(call) -> BaseException:
    with pytest.raises((tinker.RequestFailedError, tinker.APIStatusError)) as err:
        call()
    if isinstance(err.value, tinker.RequestFailedError):
        assert err.value.category == "user", err.value
    else:
        assert err.value.status_code == 400, err.value
    return err.value


@pytest.fixture
def run(service_client, base_model):
    return new_run(service_client, base_model, seed=7)


def good_step(client, sequences) -> None:
    """A forward_backward and an optim_step that must both complete in time."""
    fb = client.forward_backward([sft_datum(sequences[0])], "cross_entropy")
    assert fb.result(timeout=TIMEOUT).metrics["loss:sum"] > 0
    client.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=TIMEOUT)


def test_forward_backward_refused_then_next(run, sequences):
    bad = sft_datum([10_000, *sequences[0][1:]])
    refused(lambda: run.forward_backward([bad], "cross_entropy").result(timeout=TIMEOUT))
    good_step(run, sequences)


def test_forward_refused_then_next(run, sequences):
    bad = sft_datum([10_000, *sequences[0][1:]])
    refused(lambda: run.forward([bad], "cross_entropy").result(timeout=TIMEOUT))
    run.forward([sft_datum(sequences[0])], "cross_entropy").result(timeout=TIMEOUT)
    good_step(run, sequences)


def test_unknown_loss_config_key_refused_by_name_then_next(run, sequences):
    datum = rl_datum(sequences[0][:4], sequences[0][4:10], [-1.0] * 6, 1.0)
    err = refused(
        lambda: run.forward_backward(
            [datum], "ppo", loss_fn_config={"clip_hi": 1.3}
        ).result(timeout=TIMEOUT)
    )
    assert "clip_hi" in str(err)
    fb = run.forward_backward([datum], "ppo", loss_fn_config={"clip_high_threshold": 1.3})
    fb.result(timeout=TIMEOUT)
    good_step(run, sequences)


def test_optim_step_refused_then_next(run, sequences):
    run.forward_backward([sft_datum(sequences[0])], "cross_entropy").result(timeout=TIMEOUT)
    err = refused(
        lambda: run.optim_step(types.AdamParams(learning_rate=-1.0)).result(timeout=TIMEOUT)
    )
    assert "learning_rate" in str(err)
    run.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=TIMEOUT)
    good_step(run, sequences)


def test_unknown_adam_key_refused_by_name_then_next(tiny_server, run):
    """The SDK cannot send an unknown key, so these requests are built by hand (and the good
    one after them too: the SDK's own client would wait for its turn at the refused id)."""
    url, headers = f"{tiny_server.url}/api/v1", {"X-API-Key": API_KEY}
    seq_id = 1
    for params, word in (({"learning_rat": 0.1}, "learning_rat"), ({"beta1": "0.9"}, "beta1")):
        response = httpx.post(
            f"{url}/optim_step",
            headers=headers,
            json={"model_id": run.model_id, "seq_id": seq_id, "adam_params": params},
        )
        assert response.status_code == 400, response.text
        assert word in response.json()["error"]
    response = httpx.post(
        f"{url}/optim_step",
        headers=headers,
        json={"model_id": run.model_id, "seq_id": seq_id + 1, "adam_params": {"beta1": 0.8}},
    )
    request_id = response.json()["request_id"]
    answer = httpx.post(
        f"{url}/retrieve_future", headers=headers, json={"request_id": request_id}, timeout=60
    ).json()
    assert "metrics" in answer, answer


def test_save_weights_refused_then_next(run, sequences):
    refused(lambda: run.save_state("../escape").result(timeout=TIMEOUT))
    assert run.save_state("fine").result(timeout=TIMEOUT).path.endswith("/weights/fine")
    good_step(run, sequences)


def test_save_weights_for_sampler_refused_then_next(run, sequences):
    refused(lambda: run.save_weights_for_sampler("a/b").result(timeout=TIMEOUT))
    run.save_weights_for_sampler("snap").result(timeout=TIMEOUT)
    good_step(run, sequences)


def test_load_weights_refused_then_next(run, sequences):
    missing = f"tinker://{run.model_id}/weights/never-saved"
    refused(lambda: run.load_state(missing).result(timeout=TIMEOUT))
    saved = run.save_state("there").result(timeout=TIMEOUT).path
    run.load_state(saved).result(timeout=TIMEOUT)
    good_step(run, sequences)


def test_server_fault_is_a_500_logged_with_traceback(tiny_server, run, caplog, monkeypatch):
    service = tiny_server.service

    def broken(*args, **kwargs):
        raise ValueError("a bug, not the client's fault")

    monkeypatch.setattr(service, "get_info", broken)
    with caplog.at_level(logging.ERROR):
        response = httpx.post(
            f"{tiny_server.url}/api/v1/get_info",
            headers={"X-API-Key": API_KEY},
            json={"model_id": run.model_id},
        )
    assert response.status_code == 500
    assert response.json()["type"] == "server_error"
    faults = [r for r in caplog.records if r.levelno == logging.ERROR and r.exc_info]
    assert faults and "a bug" in str(faults[-1].exc_info[1])


def test_failed_work_from_a_bug_is_category_server(tiny_server, run, sequences, monkeypatch):
    engine = tiny_server.service.engine

    def broken(*args, **kwargs):
        raise KeyError("bug")

    monkeypatch.setattr(engine, "optim_step", broken)
    run.forward_backward([sft_datum(sequences[0])], "cross_entropy").result(timeout=TIMEOUT)
    with pytest.raises(tinker.RequestFailedError) as err:
        run.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=TIMEOUT)
    assert err.value.category == "server"
    monkeypatch.undo()
    good_step(run, sequences)


def test_missing_and_ill_typed_fields_are_400s(tiny_server, run):
    url, headers = f"{tiny_server.url}/api/v1", {"X-API-Key": API_KEY}
    response = httpx.post(f"{url}/get_info", headers=headers, json={})
    assert response.status_code == 400 and "model_id" in response.json()["error"]
    response = httpx.get(f"{url}/training_runs?limit=many", headers=headers)
    assert response.status_code == 400 and "limit" in response.json()["error"]
