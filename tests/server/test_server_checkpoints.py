"""Checkpoints: they survive a server restart (weights and optimizer) and are PEFT adapters."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import tinker
import torch
from tinker import types

from tests.server.server_helpers import (
    API_KEY,
    SubprocessServer,
    forward_logprobs,
    new_run,
    sft_datum,
    sft_step,
)


def test_state_saved_before_a_restart_loads_identically_with_its_optimizer(
    tiny_model_dir, base_model, sequences, tmp_path
):
    """Save, stop the process, start a fresh one on the same data dir, load with optimizer:
    logprobs are identical, and one more step matches the step taken without the restart."""
    data = [sft_datum(ids) for ids in sequences[:2]]
    data_dir = tmp_path / "data"
    first = SubprocessServer(tiny_model_dir, data_dir, tmp_path / "first.log").wait_healthy()
    try:
        with tinker.ServiceClient(base_url=first.url, api_key=API_KEY) as service:
            client = new_run(service, base_model, seed=7)
            for _ in range(2):
                sft_step(client, data)
            saved = forward_logprobs(client, data)
            path = client.save_state("before-restart").result().path
            sft_step(client, data)
            stepped = forward_logprobs(client, data)
    finally:
        first.stop()

    second = SubprocessServer(tiny_model_dir, data_dir, tmp_path / "second.log").wait_healthy()
    try:
        with tinker.ServiceClient(base_url=second.url, api_key=API_KEY) as service:
            restored = service.create_training_client_from_state_with_optimizer(path).result()
            reloaded = forward_logprobs(restored, data)
            sft_step(restored, data)
            restored_stepped = forward_logprobs(restored, data)

            weights_only = service.create_training_client_from_state(path).result()
            sft_step(weights_only, data)
            fresh_optimizer_stepped = forward_logprobs(weights_only, data)
    finally:
        second.stop()

    for got, want in zip(reloaded, saved, strict=True):
        assert np.array_equal(got, want)
    for got, want in zip(restored_stepped, stepped, strict=True):
        assert np.array_equal(got, want)
    # The comparison can tell optimizer states apart: a fresh AdamW takes another step.
    differs = max(np.max(np.abs(a - b)) for a, b in zip(fresh_optimizer_stepped, stepped,
                                                        strict=True))
    assert differs > 1e-4


def test_saved_checkpoint_is_a_peft_adapter_giving_the_servers_logprobs(
    tiny_server, service_client, tiny_model_dir, base_model, sequences
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    client = new_run(service_client, base_model, seed=8)
    data = [sft_datum(ids) for ids in sequences]
    for _ in range(3):
        sft_step(client, data)
    path = client.save_state("export").result().path
    server_logprobs = forward_logprobs(client, data)

    from server.storage.checkpoints import run_dir_name

    parsed = types.ParsedCheckpointTinkerPath.from_tinker_path(path)
    run_dir = Path(tiny_server.config.data_dir) / "runs" / run_dir_name(parsed.training_run_id)
    ckpt_dir = run_dir / "weights" / "export"
    assert ":" not in str(ckpt_dir.relative_to(tiny_server.config.data_dir))
    assert (ckpt_dir / "adapter_config.json").exists()

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(ckpt_dir))
    model.eval()
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    for ids, expected in zip(sequences, server_logprobs, strict=True):
        tokens = torch.tensor([ids[:-1]])
        targets = torch.tensor(ids[1:])[:, None]
        with torch.no_grad():
            logits = model(input_ids=tokens).logits[0].float()
            base_logits = plain(input_ids=tokens).logits[0].float()
        peft_logprobs = torch.log_softmax(logits, -1).gather(-1, targets)[:, 0].numpy()
        base_logprobs = torch.log_softmax(base_logits, -1).gather(-1, targets)[:, 0].numpy()
        np.testing.assert_allclose(peft_logprobs, expected, atol=1e-4)
        assert np.max(np.abs(base_logprobs - expected)) > 1e-2  # the adapter matters


def test_named_sampler_checkpoint_serves_the_same_logprobs_as_its_snapshot(
    service_client, base_model, sequences
):
    client = new_run(service_client, base_model, seed=9)
    sft_step(client, [sft_datum(sequences[0])])
    path = client.save_weights_for_sampler("named").result().path
    assert "/sampler_weights/" in path
    probe = types.ModelInput.from_ints(sequences[1])
    from_path = service_client.create_sampling_client(model_path=path).result()
    snapshot = client.save_weights_and_get_sampling_client().result()
    assert from_path.compute_logprobs(probe).result() == snapshot.compute_logprobs(probe).result()


# ------------------------------------------------------------ names on disk
def _adapter():
    from server.engine.lora import AdapterWeights, LoraSpec

    spec = LoraSpec(rank=2)
    name = "model.layers.0.self_attn.q_proj"
    return AdapterWeights(spec, {name: torch.ones(2, 8)}, {name: torch.zeros(8, 2)})


def test_run_directories_hold_no_character_an_os_cannot_name_and_map_back_to_the_run():
    from server.storage.checkpoints import run_dir_name, run_id_of

    for run_id in ("sess-3f2a:train:0", "a<b>c|d?e*f\"g\\h", "50%:done", "plain-run"):
        name = run_dir_name(run_id)
        assert not set(name) & set('<>:"\\|?*/')
        assert run_id_of(name) == run_id


def test_checkpoints_are_written_under_portable_names_and_legacy_ones_still_load(tmp_path):
    from server.storage.checkpoints import CheckpointStore, TinkerPath

    store = CheckpointStore(tmp_path)
    path = TinkerPath.parse("tinker://sess-1:train:0/weights/step-1")
    store.write_run("sess-1:train:0", {"owner": "k"})
    store.save(path, _adapter(), "base", {"state": {}}, {})
    assert [p.name for p in (tmp_path / "runs").iterdir()] == ["sess-1%3Atrain%3A0"]
    assert not [p for p in tmp_path.rglob("*") if ":" in p.name]
    assert store.list_runs() == ["sess-1:train:0"]

    # A data directory written by an earlier version: the raw run id as the directory name.
    legacy = tmp_path / "runs" / "sess-2:train:0"
    (tmp_path / "runs" / "sess-1%3Atrain%3A0").rename(legacy)
    old = TinkerPath.parse("tinker://sess-2:train:0/weights/step-1")
    (legacy / "weights" / "step-1" / "checkpoint.json").write_text(
        (legacy / "weights" / "step-1" / "checkpoint.json").read_text().replace(
            "sess-1:train:0", "sess-2:train:0"))
    adapter, optimizer, meta = store.load(old, torch.device("cpu"), with_optimizer=True)
    assert torch.equal(adapter.a["model.layers.0.self_attn.q_proj"], torch.ones(2, 8))
    assert optimizer == {"state": {}} and meta["tinker_path"] == str(old)
    assert store.read_run("sess-2:train:0") == {"owner": "k"}
    assert store.list_runs() == ["sess-2:train:0"]
    assert [r["tinker_path"] for r in store.list("sess-2:train:0")] == [str(old)]
