"""Every config shipped in `autoresearch/configs` parses as what its name says it is, and the
demo is what its guide describes: trained and reported on the multi-table corpus, with the
transfer split read beside test."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoresearch.rl.config import TrialConfig
from autoresearch.study.spec import Study

CONFIGS = Path(__file__).resolve().parents[2] / "autoresearch" / "configs"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_parses(path: Path):
    if path.stem.endswith("_study"):
        assert Study.from_file(path).name
    else:
        assert TrialConfig.from_file(path).base_model


def test_the_demo_trains_on_the_multi_table_corpus_and_reads_transfer_beside_test():
    demo = Study.from_file(CONFIGS / "demo_study.yaml")
    assert demo.base_trial.corpus == "multitable" and demo.warmup is not None
    assert demo.base_trial.eval.test_tasks and demo.base_trial.eval.transfer_tasks
    # the bank fits the baseline's round: the baseline, the proposals the steps allow, the bank
    explorations = demo.budget.max_steps // demo.base_trial.rl.steps
    assert demo.executor.max_parallel_trials >= explorations + demo.budget.seed_bank - 1


def test_the_overnight_study_searches_the_choices_that_decide_whether_rl_teaches():
    night = Study.from_file(CONFIGS / "overnight_study.yaml")
    assert night.budget.max_wall_seconds == 8 * 3600 and night.warmup is not None
    space = set(night.search_space)
    assert {"rl.adam.learning_rate", "rl.dynamic_sampling", "rl.prompt_selection",
            "rl.advantage", "rl.loss_aggregation", "rl.kl_coef",
            "reward.weights.overlap"} <= space
    base = night.base_trial
    assert base.rl.dynamic_sampling and base.rl.prompt_selection == "signal"


def test_the_demo_trains_on_groups_with_a_signal_rewarded_for_the_result_alone():
    """Partial credit made half the demo's runs collapse to one-column queries
    (bench/rl_results.md): the demo's reward is the result's."""
    demo = Study.from_file(CONFIGS / "demo_study.yaml").base_trial
    assert demo.rl.dynamic_sampling and demo.rl.groups_cap() == 3 * demo.rl.prompts_per_step
    assert demo.rl.prompt_selection == "signal"
    weights = demo.reward.weights
    assert weights.result == 1.0 and weights.overlap == weights.executes == 0.0
    assert weights.schema_linking == 0.0
