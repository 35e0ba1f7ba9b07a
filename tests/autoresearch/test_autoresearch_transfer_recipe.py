"""The transfer-learning recipe end to end on a tiny model: the benchmark's command line (the
one a GPU run uses with `--model google/gemma-3-1b-pt --device cuda`) reaches the server and the
trial, trains on the multi-table corpus, and scores dev, test and transfer at every stage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from autoresearch.rl.record import TrialRecord

REPO = Path(__file__).resolve().parents[2]


def test_the_recipe_runs_with_an_explicit_model_and_device(sql_model_dir, tmp_path):
    out = tmp_path / "run"
    command = [sys.executable, str(REPO / "bench" / "bench_transfer_learning.py"), "--quick",
               "--model", str(sql_model_dir), "--tokenizer", str(sql_model_dir),
               "--device", "cpu", "--rank", "4",
               "--max-tokens", "12", "--sample-rows", "1", "--max-schema-chars", "600",
               "--out", str(out)]
    env = {**os.environ, "TINKER_TELEMETRY": "0", "AUTORESEARCH_API_KEYS": "",
           "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'datasets'}"}
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    config = summary["config"]
    assert config["base_model"] == str(sql_model_dir) and config["corpus"] == "multitable"
    assert config["prompt"] == {"sample_rows": 1, "max_schema_chars": 600}
    evals = TrialRecord(out / "transfer-learning").of_type("eval")
    stages = {(e["split"], e["stage"]) for e in evals}
    assert stages == {("dev", "start"), ("dev", "sft"), ("dev", "final"),
                      ("test", "base"), ("test", "sft"), ("test", "final"),
                      ("transfer", "base"), ("transfer", "sft"), ("transfer", "final")}
    transfer = [e for e in evals if e["split"] == "transfer"]
    assert all(set(e["verdicts"]) <= {f"transfer-{db}-{n:03d}" for db in
                                      ("helpdesk", "fleet", "mealkit") for n in range(60)}
               for e in transfer)
    for key in ("transfer/base", "transfer/sft", "transfer/final", "dev/final-sft"):
        assert key in summary["numbers"]
    assert "| transfer | after SFT + RL |" in done.stdout
