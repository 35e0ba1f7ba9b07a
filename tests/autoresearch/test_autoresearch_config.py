"""TrialConfig validation: contradictions are refused with a clear message."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from autoresearch.rl.config import ADDED_LATER, TrialConfig


def test_defaults_validate_and_round_trip_through_yaml(tmp_path):
    config = TrialConfig()
    path = tmp_path / "trial.yaml"
    path.write_text(config.to_yaml())
    assert TrialConfig.from_file(path) == config
    assert config.fingerprint() == TrialConfig.from_file(path).fingerprint()


def test_fields_added_later_keep_the_fingerprint_configs_had_before_them():
    """A fingerprint names a trial's directory and seeds a simulated study's random streams: a
    new field at its default must leave it as it was. The value is the one the default config
    had before `train_unembed` and the snapping switches existed."""
    config = TrialConfig.model_validate({"name": "x", "base_model": "m"})
    assert config.fingerprint() == "5268dd394a81"
    other = {"tasks": {"path": "q.jsonl", "databases": ["shop.duckdb"]},
             "rl.max_groups_drawn": 32, "rl.prompt_selection": "signal", "rl.revisit": 0.5,
             "rl.loss_aggregation": "token_mean"}
    for field, default in ADDED_LATER.items():
        assert config.with_changes({field: default}).fingerprint() == config.fingerprint()
        changed = other.get(field, not default)
        assert config.with_changes({field: changed}).fingerprint() != config.fingerprint()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"rl": {"group_size": 1}}, "group_size"),
        ({"rl": {"loss_fn": "importance_sampling", "clip_low": 0.8}}, "clip_low"),
        ({"rl": {"loss_fn": "ppo", "clip_low": 1.3, "clip_high": 1.2}}, "below"),
        ({"rl": {"temperature": 0.0}}, "temperature 0"),
        ({"sft": {"steps": 0}, "rl": {"steps": 0}}, "needs SFT steps"),
        ({"rl": {"steps": 4}, "eval": {"every": 10}}, "eval.every"),
        ({"rl": {"adam": {"learning_rate": 0.5}}}, "learning_rate"),
        ({"rl": {"learnig_rate": 1e-4}}, "learnig_rate"),
    ],
)
def test_contradictory_or_out_of_bounds_settings_are_rejected(changes, message):
    with pytest.raises(ValidationError, match=message):
        TrialConfig.model_validate(changes)


def test_dotted_changes_apply_and_revalidate():
    config = TrialConfig().with_changes({"rl.adam.learning_rate": 2e-4, "reward.weights.rows": 0.2})
    assert config.rl.adam.learning_rate == 2e-4
    assert config.reward.weights.rows == 0.2
    with pytest.raises(ValueError, match="unknown config field"):
        TrialConfig().with_changes({"rl.nope": 1})
    with pytest.raises(ValidationError):
        TrialConfig().with_changes({"rl.group_size": 1})


def test_ppo_clip_thresholds_reach_the_loss_config():
    config = TrialConfig.model_validate(
        {"rl": {"loss_fn": "ppo", "clip_low": 0.9, "clip_high": 1.1}}
    )
    assert config.rl.loss_fn_config() == {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}
    assert TrialConfig().rl.loss_fn_config() is None
