"""Unmodified tinker-cookbook loops against the server, on the tiny model.

The cookbook runs in its own process, as on a client machine: an empty Hugging Face cache with
HF_HUB_OFFLINE=1 (the tokenizer comes from the server through `autoresearch-install-tokenizer`), the
key and URL from the environment. It covers `supervised.train` with checkpoints and a resume,
sync `rl.train` with importance_sampling and with gspo, `rl.train` with `AsyncConfig` and its
default loss (stable_reinforce), and `weights.download` of the result loaded with `peft`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.server.server_helpers import REPO_ROOT, build_tiny_model, start_server

pytest.importorskip("tinker_cookbook", reason="install with `make cookbook` (see docs/cookbook.md)")

MODEL_NAME = "tiny-org/tiny-gemma3"
KEY = "tml-cookbook-ci"


@pytest.fixture(scope="module")
def entries(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    model_dir = build_tiny_model(tmp_path_factory.mktemp("tiny-gemma3"))
    server = start_server(model_dir, tmp_path_factory.mktemp("data"), api_keys=KEY,
                          model_name=MODEL_NAME)
    work = tmp_path_factory.mktemp("client")
    env = {
        **os.environ,
        "TINKER_BASE_URL": server.url,
        "TINKER_API_KEY": KEY,
        "TINKER_TELEMETRY": "0",
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_CACHE": str(work / "hf-cache"),
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    try:
        done = subprocess.run(
            [sys.executable, str(Path(__file__).with_name("cookbook_driver.py")), MODEL_NAME,
             str(work), str(model_dir)],
            env=env, cwd=work, capture_output=True, text=True, timeout=600,
        )
    finally:
        server.stop()
    results = {}
    for line in done.stdout.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            results[record["entry"]] = record
    assert results, done.stderr[-4000:]
    for name, record in results.items():  # shown with -s / on failure
        print(f"{'ok  ' if record['ok'] else 'FAIL'} {name}: {record.get('error', '')}")
    return results


def _ok(entries: dict[str, dict], name: str) -> dict:
    record = entries.get(name)
    assert record is not None, f"{name} did not run: {sorted(entries)}"
    assert record["ok"], record.get("trace") or record
    return record


def test_tokenizer_is_installed_from_the_server_and_loads_offline(entries):
    assert _ok(entries, "server.entrypoints.install_tokenizer")["hub_id"] == MODEL_NAME
    assert _ok(entries, "tokenizer_utils.get_tokenizer")["vocab"] > 0
    assert _ok(entries, "SamplingClient.get_tokenizer")["sampling_vocab"] > 0


def test_supervised_train_checkpoints_and_resumes(entries):
    first = _ok(entries, "supervised.train.main (save_every, checkpoints.jsonl)")
    assert first["checkpoints"]
    resumed = _ok(entries, "supervised.train.main (resume from checkpoints.jsonl)")
    # The second run starts from the first run's last periodic checkpoint (the first run's final
    # record was dropped, as if it had been killed) and trains on to a final checkpoint.
    assert resumed["checkpoints"][: len(first["checkpoints"])] == first["checkpoints"]
    assert len(resumed["checkpoints"]) > len(first["checkpoints"])
    assert resumed["final"]


def test_rl_train_sync_importance_sampling(entries):
    assert _ok(entries, "rl.train.main (sync, importance_sampling)")["checkpoints"]


def test_rl_train_sync_gspo_with_the_default_sequence_mask(entries):
    assert _ok(entries, "rl.train.main (sync, gspo without sequence_ratio_mask)")["checkpoints"]


def test_rl_train_async_with_default_stable_reinforce(entries):
    assert _ok(entries, "rl.train.main (AsyncConfig, default loss stable_reinforce)")["state_path"]


def test_weights_download_loads_with_peft(entries):
    record = _ok(entries, "weights.download (training checkpoint) + peft.PeftModel.from_pretrained")
    assert "adapter_config.json" in record["files"]
    assert "adapter_model.safetensors" in record["files"]
    assert record["lora_parameters"] > 0
