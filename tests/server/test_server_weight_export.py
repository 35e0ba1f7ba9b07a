"""Weight export and tokenizer files: what `weights.download` and offline clients rely on.

`save_weights_external` serves the run's PEFT adapter behind signed, expiring URLs that only
the owning key can ask for; `GET /tokenizer` hands the tokenizer to a key, and
`install_tokenizer` puts it into a Hugging Face cache under the model's Hub id.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tinker
from safetensors.numpy import load as load_safetensors

from server.entrypoints.install_tokenizer import install_tokenizer
from server.storage.weight_export import ExportError, UrlSigner
from tests.server.server_helpers import new_run, sft_datum, sft_step, start_server

ALICE, BOB = "tml-export-alice", "tml-export-bob"


@pytest.fixture(scope="module")
def keyed_server(tiny_model_dir, tmp_path_factory) -> Iterator:
    server = start_server(tiny_model_dir, tmp_path_factory.mktemp("export-data"),
                          api_keys=f"{ALICE},{BOB}", model_name="tiny-org/tiny-gemma3")
    yield server
    server.stop()


def test_export_is_the_runs_adapter_behind_owner_scoped_signed_urls(keyed_server, sequences):
    with tinker.ServiceClient(base_url=keyed_server.url, api_key=ALICE) as alice:
        run = new_run(alice, "tiny-org/tiny-gemma3", seed=40)
        sft_step(run, [sft_datum(sequences[0])])
        state = run.save_state("kept").result().path
        export = run.save_weights_external("export", ttl_seconds=3600).result().path
    assert export.endswith("/external_weights/export")
    alice_rest = tinker.RestClient(base_url=keyed_server.url, api_key=ALICE)
    answer = alice_rest.get_external_weights_urls(export).result()
    assert set(answer.urls) == {"adapter_config.json", "adapter_model.safetensors"}
    files = {name: httpx.get(url).content for name, url in answer.urls.items()}
    checkpoint_dir = keyed_server.service.store.checkpoint_dir
    from server.storage.checkpoints import TinkerPath

    saved = (checkpoint_dir(TinkerPath.parse(state)) / "adapter_model.safetensors").read_bytes()
    exported, kept = load_safetensors(files["adapter_model.safetensors"]), load_safetensors(saved)
    assert exported.keys() == kept.keys()
    assert all(np.array_equal(exported[k], kept[k]) for k in kept)

    # Another key can neither ask for URLs nor reuse them on another file; tampering fails.
    bob_rest = tinker.RestClient(base_url=keyed_server.url, api_key=BOB)
    with pytest.raises(tinker.NotFoundError):
        bob_rest.get_external_weights_urls(export).result()
    url = answer.urls["adapter_config.json"]
    assert httpx.get(url.rsplit("/", 1)[0] + "/adapter_model.safetensors").status_code == 400
    assert httpx.get(url.replace("/external_weights/", "/external_weights/A")).status_code == 400
    # Deleting the export ends its URLs.
    alice_rest.delete_checkpoint_from_tinker_path(export).result()
    assert httpx.get(url).status_code == 404


def test_export_encrypts_to_age_recipients(keyed_server, sequences):
    import pyrage

    identity = pyrage.x25519.Identity.generate()
    with tinker.ServiceClient(base_url=keyed_server.url, api_key=ALICE) as alice:
        run = new_run(alice, "tiny-org/tiny-gemma3", seed=41)
        export = run.save_weights_external(
            "sealed", age_encryption_recipients=[str(identity.to_public())]
        ).result().path
        with pytest.raises(tinker.RequestFailedError, match="recipient"):
            run.save_weights_external("bad", age_encryption_recipients=["age1nope"]).result()
    rest = tinker.RestClient(base_url=keyed_server.url, api_key=ALICE)
    urls = rest.get_external_weights_urls(export).result().urls
    assert set(urls) == {"adapter_config.json.age", "adapter_model.safetensors.age"}
    config = pyrage.decrypt(httpx.get(urls["adapter_config.json.age"]).content, [identity])
    assert b'"peft_type": "LORA"' in config


def test_urls_expire():
    signer = UrlSigner(lifetime=10)
    token = signer.sign("tml-k", "tinker://r/external_weights/x", "f", expires=100.0)
    assert signer.verify(token, now=99.0)[1:] == ("tinker://r/external_weights/x", "f")
    with pytest.raises(ExportError, match="expired"):
        signer.verify(token, now=100.0)
    with pytest.raises(ExportError, match="invalid"):
        UrlSigner().verify(token, now=0.0)  # another server's secret


def test_tokenizer_files_install_under_the_hub_id(keyed_server, tmp_path, tiny_tokenizer):
    with pytest.raises(httpx.HTTPStatusError):
        install_tokenizer(keyed_server.url, "tml-unknown", cache_dir=tmp_path)
    hub_id, snapshot = install_tokenizer(keyed_server.url, ALICE, cache_dir=tmp_path)
    assert hub_id == "tiny-org/tiny-gemma3"
    assert snapshot.parent.parent == tmp_path / "models--tiny-org--tiny-gemma3"
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(hub_id, cache_dir=tmp_path, local_files_only=True)
    text = "select name from users"
    assert loaded.encode(text) == tiny_tokenizer.encode(text)
