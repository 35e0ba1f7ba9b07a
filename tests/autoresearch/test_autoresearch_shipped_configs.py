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
