"""A declared warm-up that begins with another's training continues from that one's final state:
it runs only the steps the other did not, and ends with the bits it would have had from scratch
(the study benchmark's two warm-ups cost 48 SFT steps, not 64)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from safetensors.numpy import load_file

from autoresearch.rl.config import TrialConfig
from autoresearch.rl.record import TrialRecord
from autoresearch.study.cache_files import checkpoint_paths
from autoresearch.study.journal import Journal
from autoresearch.study.runner import run_study
from autoresearch.study.spec import Study
from autoresearch.study.warmup import continues
from tests.autoresearch.study_helpers import tiny_trial

pytestmark = pytest.mark.timeout(420)


def _warmup(steps: int, **sft: Any) -> dict[str, Any]:
    return {"sft": {"steps": steps, "batch_size": 2, "adam": {"learning_rate": 1e-3}, **sft},
            "checkpoint_every": 1}


def _study(name: str, model_dir: Path, cache: Path, primary: dict[str, Any],
           choices: dict[str, dict[str, Any]]) -> Study:
    base = tiny_trial(model_dir, sft={"steps": 0},
                      rl={"steps": 1, "prompts_per_step": 2, "group_size": 2, "max_tokens": 8})
    return Study(name=name, seed=3, embedded_model=str(model_dir), reward_workers=1,
                 base_trial=base, warmup={**primary, "cache_dir": str(cache)},
                 warmup_choices=choices,
                 search_space={"rl.adam.learning_rate": {"low": 1e-5, "high": 1e-3, "log": True}},
                 budget={"max_trials": 1, "confirm_seeds": 0, "seed_bank": 0})


def _final_adapter(directory: Path, trial_id: str) -> dict[str, Any]:
    checkpoint = Journal(directory, read_only=True).trial(trial_id)["checkpoint"]
    folder = checkpoint_paths(directory / "server-data", checkpoint)[1]
    return load_file(str(next(folder.rglob("*.safetensors"))))


def test_a_longer_warmup_continues_a_shorter_one_and_ends_with_the_same_bits(
        sql_model_dir: Path, tmp_path: Path):
    # Declared longest first: the study still trains the shorter one first.
    continued = _study("continued", sql_model_dir, tmp_path / "cache-a", _warmup(4),
                       {"short": _warmup(2)})
    run_study(continued, tmp_path / "a")
    scratch = _study("scratch", sql_model_dir, tmp_path / "cache-b", _warmup(4), {})
    run_study(scratch, tmp_path / "b")

    journal = Journal(tmp_path / "a", read_only=True)
    assert journal.trial("warmup")["status"] == "done"
    assert any("continues warmup-short" in e["message"] for e in journal.events())
    record = TrialRecord(tmp_path / "a" / "warmup")
    assert [e["step"] for e in record.of_type("event") if "continues" in e] == [2]
    resumed = [e for e in record.of_type("event") if "resumed from" in e["message"]]
    assert len(resumed) == 1 and resumed[0]["step"] == 2
    # The first dev score (the base model's) is the shorter warm-up's, not measured again.
    assert [e["stage"] for e in record.of_type("eval")] == ["start", "final"]

    reference = TrialRecord(tmp_path / "b" / "warmup")

    def losses(rec: TrialRecord) -> list[tuple[int, float]]:
        return [(s["step"], s["loss_per_token"]) for s in rec.of_type("step")]

    assert losses(record) == losses(reference) and len(losses(record)) == 4
    assert record.final()["dev"]["verdicts"] == reference.final()["dev"]["verdicts"]
    mine, theirs = _final_adapter(tmp_path / "a", "warmup"), _final_adapter(tmp_path / "b",
                                                                             "warmup")
    assert mine.keys() == theirs.keys()
    assert all((mine[k] == theirs[k]).all() for k in mine)


def test_only_a_run_that_passes_through_the_other_s_final_state_continues_it():
    def config(steps: int, lr: float = 1e-3, batch: int = 2, rl: int = 0) -> TrialConfig:
        return TrialConfig.model_validate({
            "sft": {"steps": steps, "batch_size": batch, "adam": {"learning_rate": lr}},
            "rl": {"steps": rl}, "eval": {"every": 0}, "checkpoint_every": 3})

    assert continues(config(6), config(2))
    assert continues(config(6, rl=2), config(2))  # RL after the SFT is its own
    assert not continues(config(2), config(6))  # shorter
    assert not continues(config(2), config(2))  # the same warm-up
    assert not continues(config(6), config(2, lr=1e-4))  # another learning rate
    assert not continues(config(6), config(2, batch=4))  # other batches
    assert not continues(config(6), config(2, rl=1))  # the other ends with RL
    assert not continues(config(6).with_changes({"seed": 9}), config(2))
