"""Inputs that once made the server fault (HTTP 500), each now a client error in the protocol's
shape: a run id past any file name's length, a stop token past any integer numpy holds, a
session search whose every field is null, and weights_info on an export whose files expired.
"""

from __future__ import annotations

import shutil

import httpx
import pytest
import tinker
from tinker import types

from server.storage.checkpoints import MAX_NAME_BYTES, TinkerPath
from tests.server.server_helpers import API_KEY, new_run

HEADERS = {"X-API-Key": API_KEY}


@pytest.mark.parametrize("length", [MAX_NAME_BYTES, MAX_NAME_BYTES + 1, 5000])
@pytest.mark.parametrize("suffix", ["", "/checkpoints"])
def test_a_run_id_at_and_past_the_name_limit_is_not_found(tiny_server, length, suffix):
    answer = httpx.get(f"{tiny_server.url}/api/v1/training_runs/{'r' * length}{suffix}",
                       headers=HEADERS)
    assert 400 <= answer.status_code < 500, answer.text
    assert httpx.get(f"{tiny_server.url}/api/v1/healthz").status_code == 200


@pytest.mark.parametrize("stop", [[10**30], [2**63], [-(2**63) - 1]])
def test_a_stop_token_past_any_integer_is_a_client_error(service_client, base_model, stop):
    sampler = service_client.create_sampling_client(base_model=base_model).result()
    with pytest.raises((tinker.RequestFailedError, tinker.APIStatusError, ValueError)) as err:
        sampler.sample(types.ModelInput.from_ints([5, 6, 7]), 1,
                       types.SamplingParams(max_tokens=2, stop=stop)).result()
    if isinstance(err.value, tinker.RequestFailedError):
        assert err.value.category == "user"
        assert "outside the vocabulary" in str(err.value)
    elif isinstance(err.value, tinker.APIStatusError):
        assert 400 <= err.value.status_code < 500


def test_a_stop_token_past_any_integer_is_refused_by_the_engine(tiny_server):
    from server.engine.engine import SampleJob, SamplingParams, UserError

    engine = tiny_server.service.engine
    for stop in ([10**30], [2**63], [-(2**70)]):
        job = SampleJob(None, [5, 6, 7], 1, SamplingParams(max_tokens=2, stop=stop))
        with pytest.raises(UserError, match="outside the vocabulary"):
            engine.validate_sample(job)


def test_a_session_search_with_every_field_null_is_a_client_error(tiny_server):
    fields = types.SessionSearchRequest.model_fields
    answer = httpx.post(f"{tiny_server.url}/api/v1/sessions/search", headers=HEADERS,
                        json=dict.fromkeys(fields))
    assert answer.status_code == 400, answer.text
    assert "must not be null" in answer.text
    nullable = {name: None for name in ("session_id", "project_ids", "display_name",
                                        "statuses", "cursor")}
    assert httpx.post(f"{tiny_server.url}/api/v1/sessions/search", headers=HEADERS,
                      json=nullable).status_code == 200  # null where the SDK admits it


def test_weights_info_on_an_expired_export_is_not_found(tiny_server, service_client,
                                                         base_model):
    run = new_run(service_client, base_model, seed=3)
    export = run.save_weights_external("soon-gone", ttl_seconds=3600).result().path
    rest = service_client.create_rest_client()
    assert rest.get_weights_info_by_tinker_path(export).result().lora_rank
    files = tiny_server.service.store.checkpoint_dir(TinkerPath.parse(export))
    for child in files.iterdir():  # the export's files expire; its record is read a moment later
        if child.name != "checkpoint.json":
            shutil.rmtree(child) if child.is_dir() else child.unlink()
    with pytest.raises((tinker.APIStatusError, tinker.RequestFailedError)) as err:
        rest.get_weights_info_by_tinker_path(export).result()
    if isinstance(err.value, tinker.APIStatusError):
        assert 400 <= err.value.status_code < 500
    assert httpx.get(f"{tiny_server.url}/api/v1/healthz").status_code == 200
