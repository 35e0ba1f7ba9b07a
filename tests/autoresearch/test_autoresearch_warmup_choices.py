"""A study with several declared warm-ups: the `warmup` dimension picks the one a trial forks
from. Each is trained once at the start (or reused from the cache), journaled under its own id,
resolved to its checkpoint for the trial, and every trial is judged against the warm-up it
actually started from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autoresearch.rl.config import TrialConfig
from autoresearch.study.journal import Journal
from autoresearch.study.proposers import Context, Proposal, ProposalBatch
from autoresearch.study.runner import run_study
from autoresearch.study.spec import Study
from tests.autoresearch.study_helpers import SyntheticExecutor

DEFAULT = "tinker://warmup/weights/final"
LONG = "tinker://warmup-long/weights/final"


def _study(name: str, cache: Path, **extra: Any) -> Study:
    data: dict[str, Any] = {
        "name": name,
        "search_space": {"warmup": {"choices": ["default", "long"]},
                         "rl.adam.learning_rate": {"low": 1e-5, "high": 1e-3, "log": True}},
        "base_trial": {"sft": {"steps": 0}, "rl": {"steps": 4}, "eval": {"every": 0}},
        "warmup": {"sft": {"steps": 3, "batch_size": 4}, "cache_dir": str(cache)},
        "warmup_choices": {"long": {"sft": {"steps": 9, "batch_size": 4}}},
        "budget": {"max_trials": 3, "confirm_seeds": 0},
    }
    data.update(extra)
    return Study.model_validate(data)


class Listed:
    """Proposes the given changes in order."""

    name = "listed"

    def __init__(self, *changes: dict[str, Any]) -> None:
        self.changes = list(changes)

    def propose(self, context: Context, n: int) -> ProposalBatch:
        done = len(context.explored()) - 1
        return ProposalBatch(self.name, "sampled", [
            Proposal(c, "listed") for c in self.changes[done:done + n]])


def _quality(config: TrialConfig) -> float:
    # The long warm-up's weights answer 60% and RL from them keeps it; the default warm-up
    # answers 20% and so do the trials forked from it.
    if config.sft.steps == 9 or config.init_checkpoint == LONG:
        return 0.6
    return 0.2


def test_every_declared_warmup_runs_once_and_a_trial_forks_from_the_one_it_chose(
        tmp_path: Path):
    executor = SyntheticExecutor(_quality, tasks=96)
    outcome = run_study(_study("choose", tmp_path / "cache"), tmp_path / "a",
                        executor=executor,
                        proposer=Listed({"warmup": "long"}, {"rl.adam.learning_rate": 2e-4}))
    assert executor.calls[:2] == ["warmup", "warmup-long"]
    assert executor.calls.count("warmup-long") == 1
    journal = Journal(tmp_path / "a", read_only=True)
    by_id = {t["id"]: t for t in journal.trials()}
    assert by_id["warmup-long"]["role"] == "warmup"
    assert by_id["warmup-long"]["config"]["sft"]["steps"] == 9
    assert by_id["warmup-long"]["checkpoint"] == LONG
    long_trial = next(t for t in by_id.values() if t["changes"] == {"warmup": "long"})
    other = next(t for t in by_id.values() if t["changes"] == {"rl.adam.learning_rate": 2e-4})
    baseline = next(t for t in by_id.values() if t["role"] == "baseline")
    # The journal keeps the name the proposal chose; the trial ran from that checkpoint.
    assert long_trial["config"]["init_checkpoint"] == LONG
    assert other["config"]["init_checkpoint"] == DEFAULT
    assert baseline["config"]["init_checkpoint"] == DEFAULT
    # Judged against the warm-up it forked from: level with the long one, not 40 points
    # above the default one.
    vs = long_trial["decision"]["vs_warmup"]
    assert vs["low"] < 0 < vs["high"]
    report = outcome.report.read_text()
    assert "Warm-up choice 'long'" in report and "Every trial that chooses it starts from" in report
    assert "Every trial that chooses no other warm-up starts from" in report
    against = report.split("## Against the warm-up")[1]
    assert f"| {long_trial['id']} |" in against and "| warmup-long |" in against


def test_a_second_study_reuses_every_declared_warmup_from_the_cache(tmp_path: Path):
    cache = tmp_path / "cache"
    run_study(_study("first", cache), tmp_path / "a", executor=SyntheticExecutor(_quality),
              proposer=Listed({"warmup": "long"}))
    second = SyntheticExecutor(_quality)
    run_study(_study("second", cache), tmp_path / "b", executor=second,
              proposer=Listed({"warmup": "long"}))
    assert not {"warmup", "warmup-long"} & set(second.calls)
    journal = Journal(tmp_path / "b", read_only=True)
    assert "Reused from the cache" in journal.trial("warmup-long")["rationale"]
    assert len(list(cache.iterdir())) == 2


def test_a_proposal_for_an_undeclared_warmup_is_rejected_not_run(tmp_path: Path):
    executor = SyntheticExecutor(_quality)
    run_study(_study("reject", tmp_path / "cache"), tmp_path / "a", executor=executor,
              proposer=Listed({"warmup": "longer"}))
    journal = Journal(tmp_path / "a", read_only=True)
    assert all(t["role"] in ("warmup", "baseline") for t in journal.trials())
    assert any("outside the search space" in e["message"] and "longer" in e["message"]
               for e in journal.events())


def test_the_space_names_the_default_warmup_as_the_base_value(tmp_path: Path):
    space = _study("base", tmp_path).space(DEFAULT, {"default": DEFAULT, "long": LONG})
    assert space.base_values()["warmup"] == "default"
    changes, config = space.validate({"warmup": "long"})
    assert changes == {"warmup": "long"} and config.init_checkpoint == LONG
    assert space.apply({"warmup": "default"}).init_checkpoint == DEFAULT
    # before the warm-ups exist a name is never silently read as the default warm-up
    with pytest.raises(RuntimeError, match="no checkpoint yet"):
        _study("base", tmp_path).space().apply({"warmup": "long"})


@pytest.mark.parametrize("extra, message", [
    ({"search_space": {"warmup": {"choices": ["default", "longer"]}}}, "not declared warm-ups"),
    ({"search_space": {"warmup": {"low": 0, "high": 1}}}, "declare it with choices"),
    ({"warmup": None}, "needs a warm-up"),
    ({"warmup_choices": {"Long": {"sft": {"steps": 9}}}}, "lowercase"),
    ({"warmup_choices": {"default": {"sft": {"steps": 9}}}}, "not 'default'"),
    ({"warmup_choices": {"a-name-too-long": {"sft": {"steps": 9}}}}, "12 lowercase"),
])
def test_a_declaration_with_bad_warmup_choices_is_refused(tmp_path: Path, extra: dict[str, Any],
                                                          message: str):
    with pytest.raises(ValueError, match=message):
        _study("bad", tmp_path, **extra)
