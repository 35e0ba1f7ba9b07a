"""RewardConfig is the typed, bounded, serialisable surface an agent tunes."""

import pydantic
import pytest
import yaml

from rewards import MatchConfig, RewardConfig, RewardWeights, SandboxLimits


def test_defaults_make_execution_match_dominate():
    weights = RewardConfig().weights
    assert weights.result == 1.0
    assert weights.executes < weights.result
    assert weights.columns == weights.rows == 0.0


def test_round_trips_through_json_and_yaml():
    config = RewardConfig(
        weights=RewardWeights(result=2.0, executes=0.25, rows=0.2),
        match=MatchConfig(column_mode="strict", rel_tol=1e-3),
        length_budget=3.0,
    )
    assert RewardConfig.from_json(config.to_json()) == config
    dumped = yaml.safe_dump(config.model_dump())
    assert RewardConfig.model_validate(yaml.safe_load(dumped)) == config


@pytest.mark.parametrize(
    "bad",
    [
        {"weights": {"result": -1.0}},
        {"weights": {"result": 11.0}},
        {"weights": {"bonus": 1.0}},
        {"match": {"column_mode": "loose"}},
        {"length_budget": 0.5},
        {"surprise": True},
    ],
)
def test_out_of_bounds_or_unknown_values_are_rejected(bad):
    with pytest.raises(pydantic.ValidationError):
        RewardConfig.model_validate(bad)


def test_configs_are_immutable():
    config = RewardConfig()
    with pytest.raises(pydantic.ValidationError):
        config.extract = False


def test_sandbox_limits_are_bounded():
    with pytest.raises(pydantic.ValidationError):
        SandboxLimits(timeout_s=0)
    with pytest.raises(pydantic.ValidationError):
        SandboxLimits(address_space_mb=1)
