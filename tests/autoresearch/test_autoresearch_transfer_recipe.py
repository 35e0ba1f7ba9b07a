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
               "--vote", "2", "--out", str(out)]
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
    passes = out / "vote-2-t0.8-dev-test-transfer"
    voted = {(weights, e["split"]): e for weights in ("sft", "final")
             for e in TrialRecord(passes / weights).of_type("eval")}
    assert set(voted) == {(w, s) for w in ("sft", "final") for s in ("dev", "test", "transfer")}
    assert len(voted["final", "transfer"]["verdicts"]) == 6  # the run's own transfer tasks
    for e in voted.values():
        assert e["decoding"]["mode"] == "vote" and e["decoding"]["candidates"] == 3
        assert set(e["decoding"]["greedy_verdicts"]) == set(e["verdicts"])
    assert "| transfer | after SFT + RL, vote of 3 |" in done.stdout
    assert "transfer after SFT + RL: vote - greedy" in done.stdout
    narrowed = subprocess.run(
        [*command[:2], "--rescore", "--vote", "1", "--snap", "--vote-stages", "final",
         "--vote-splits", "transfer", *command[3:command.index("--vote")], "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert narrowed.returncode == 0, narrowed.stderr[-3000:]
    one_pass = out / "vote-1-t0.8-transfer-snap"
    assert sorted(p.name for p in one_pass.iterdir()) == ["final"]
    (snapped,) = TrialRecord(one_pass / "final").of_type("eval")
    assert snapped["split"] == "transfer" and snapped["decoding"]["snap_names"] is True
    assert set(snapped["decoding"]["written_verdicts"]) == set(snapped["verdicts"])
    for row in ("greedy as written", "greedy, names snapped", "vote of 2, names snapped"):
        assert f"| transfer | after SFT + RL, {row} |" in narrowed.stdout
    assert "transfer after SFT + RL: vote of 2, names snapped - greedy as written" \
        in narrowed.stdout
    # The base stage of a rescore is a new adapter: its zero delta answers as the base model did.
    base = subprocess.run(
        [*command[:2], "--rescore", "--stages", "base", "--splits", "test,transfer",
         *command[3:command.index("--vote")], "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert base.returncode == 0, base.stderr[-3000:]
    again = {e["split"]: e for e in
             TrialRecord(out / "greedy-test-transfer" / "base").of_type("eval")}
    for e in evals:
        if e["stage"] == "base":
            assert again[e["split"]]["verdicts"] == e["verdicts"]
            assert again[e["split"]]["execute_rate"] == e["execute_rate"]
    assert "| transfer | base model | 6 |" in base.stdout
    # Over runs: the run beside a copy of it whose snapped vote got every answer the other way.
    flipped = tmp_path / "flipped"
    for record in out.glob("**/record.jsonl"):
        lines = []
        for line in record.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("type") == "eval" and entry["decoding"].get("snap_names"):
                entry["verdicts"] = {t: not ok for t, ok in entry["verdicts"].items()}
            lines.append(json.dumps(entry))
        copy = flipped / record.relative_to(out)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text("\n".join(lines) + "\n")
    seeds = subprocess.run([sys.executable, str(REPO / "bench" / "transfer_over_seeds.py"),
                            str(out), str(flipped)],
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert seeds.returncode == 0, seeds.stderr[-3000:]
    rows = {tuple(cell.strip() for cell in line.split("|")[1:4]): line
            for line in seeds.stdout.splitlines() if line.startswith("| ")}
    right = sum(snapped["verdicts"].values())
    voted_row = rows["transfer", "after SFT + RL", "vote of 2, names snapped"]
    assert f"| {right / 6:.3f}, {(6 - right) / 6:.3f} |" in voted_row
    assert "| **0.500** [" in voted_row  # every question right in exactly one of the two runs
    written = rows["transfer", "after SFT + RL", "greedy as written"]  # the same in both
    assert "| 0.000 |" in written.split("]")[1]  # no spread between the runs


def test_a_run_trained_alone_is_scored_afterwards_on_the_tasks_asked_for(sql_model_dir, tmp_path):
    """`--train-only` times the training with no evaluation in it; a decoding pass then scores
    the saved weights on the task counts given, since the run's own config scored none."""
    out = tmp_path / "run"
    common = ["--model", str(sql_model_dir), "--tokenizer", str(sql_model_dir), "--device", "cpu",
              "--rank", "4", "--max-tokens", "12", "--sample-rows", "1",
              "--max-schema-chars", "600", "--out", str(out)]
    script = str(REPO / "bench" / "bench_transfer_learning.py")
    env = {**os.environ, "TINKER_TELEMETRY": "0", "AUTORESEARCH_API_KEYS": "",
           "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'datasets'}"}
    trained = subprocess.run([sys.executable, script, "--quick", "--train-only", *common],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    record = TrialRecord(out / "transfer-learning")
    assert record.of_type("eval") == [] and record.final() is not None
    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["eval"]["baseline"] is False and summary["sft_seconds"] >= 0
    scored = subprocess.run(
        [sys.executable, script, "--rescore", "--snap", "--vote-stages", "final",
         "--vote-splits", "transfer", "--transfer-tasks", "5", *common],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert scored.returncode == 0, scored.stderr[-3000:]
    (snapped,) = TrialRecord(out / "greedy-transfer-snap" / "final").of_type("eval")
    assert snapped["split"] == "transfer" and len(snapped["verdicts"]) == 5
    assert "| transfer | after SFT + RL, greedy, names snapped |" in scored.stdout
    # A plain rescore fills in the table the run did not score: every stage of every split.
    full = subprocess.run(
        [sys.executable, script, "--rescore", "--dev-tasks", "2", "--test-tasks", "2",
         "--transfer-tasks", "3", *common],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert full.returncode == 0, full.stderr[-3000:]
    for stage in ("base", "sft", "final"):
        scored_here = {e["split"]: len(e["verdicts"]) for e in
                       TrialRecord(out / "greedy-dev-test-transfer" / stage).of_type("eval")}
        assert scored_here == {"dev": 2, "test": 2, "transfer": 3}, stage
    for split, n in (("dev", 2), ("test", 2), ("transfer", 3)):
        for label in ("base model", "after SFT", "after SFT + RL"):
            assert f"| {split} | {label} | {n} |" in full.stdout
        assert f"{split}/final-base: " in full.stdout


def test_rl_runs_forked_from_a_finished_sft_are_scored_against_it(sql_model_dir, tmp_path):
    """`bench_rl_over_sft` trains one RL run per seed from a finished run's SFT checkpoint, side
    by side, scores each and the SFT on the same tasks, and reports the runs' differences; the
    source's own seed repeats the source's first RL step bit for bit beside the others."""
    out = tmp_path / "run"
    env = {**os.environ, "TINKER_TELEMETRY": "0", "AUTORESEARCH_API_KEYS": "",
           "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'datasets'}"}
    device = ["--model", str(sql_model_dir), "--device", "cpu"]
    trained = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_transfer_learning.py"), "--quick",
         "--train-only", *device, "--tokenizer", str(sql_model_dir), "--rank", "4",
         "--max-tokens", "12", "--sample-rows", "1", "--max-schema-chars", "600",
         "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert trained.returncode == 0, trained.stderr[-3000:]
    forked = subprocess.run(
        [sys.executable, str(REPO / "bench" / "bench_rl_over_sft.py"), "--from", str(out),
         "--seeds", "2", "--dev-tasks", "3", "--test-tasks", "2", "--transfer-tasks", "2",
         *device],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert forked.returncode == 0, forked.stderr[-3000:]
    summary = json.loads((out / "rl-over-sft" / "summary.json").read_text())
    assert summary["bits"].startswith("first RL step equal to the source's"), summary["bits"]
    numbers = summary["numbers"]
    assert {s: numbers[s]["n"] for s in ("dev", "test", "transfer")} == {
        "dev": 3, "test": 2, "transfer": 2}
    assert set(numbers["dev"]["runs"]) == {"rl-seed0", "rl-seed1"}
    difference = numbers["dev"]["difference"]["value"]
    runs = numbers["dev"]["runs"].values()
    assert abs(difference - (sum(runs) / 2 - numbers["dev"]["sft"])) < 1e-9
    assert numbers["rl"]["rl-seed1"]["steps"] == 1
    sft_record = TrialRecord(out / "rl-over-sft" / "sft")
    assert [e for e in sft_record.of_type("step") if e.get("phase") == "rl"] == []
    assert "| dev | 3 |" in forked.stdout and "| rl-seed1 | 1 |" in forked.stdout
