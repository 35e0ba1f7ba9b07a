"""Tracing is optional: off unless configured, and then it records proposals and trials."""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path

import pytest

from autoresearch.study import tracing
from autoresearch.study.runner import run_study
from autoresearch.study.spec import Study
from tests.autoresearch.study_helpers import SyntheticExecutor


class FakeWeave(types.ModuleType):
    def __init__(self):
        super().__init__("weave")
        self.projects: list[str] = []
        self.calls: list[str] = []

    def init(self, project: str) -> None:
        self.projects.append(project)

    def op(self, func=None, *, name: str | None = None, **settings):
        """`weave.op`'s own signature: used bare (`@weave.op`) or called with keywords."""

        def wrap(fn):
            label = name or fn.__name__

            def traced(*args, **kwargs):
                self.calls.append(label)
                return fn(*args, **kwargs)

            return traced

        return wrap(func) if func is not None else wrap


@pytest.fixture
def fake_weave(monkeypatch: pytest.MonkeyPatch) -> FakeWeave:
    module = FakeWeave()
    monkeypatch.setitem(sys.modules, "weave", module)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WEAVE_PROJECT", raising=False)
    return module


def _study() -> Study:
    return Study(name="traced", budget={"max_trials": 2, "confirm_seeds": 0},
                 search_space={"rl.temperature": {"low": 0.7, "high": 1.2}})


def test_without_configuration_nothing_is_attempted(fake_weave, tmp_path: Path, caplog):
    def fn():
        return 1

    with caplog.at_level(logging.DEBUG, logger="autoresearch"):
        tracer = tracing.Tracer("a-project")  # a project alone is not enough: no W&B key
        assert not tracer.enabled and tracer.op("x", fn) is fn
        run_study(_study(), tmp_path, executor=SyntheticExecutor(lambda c: 0.3))
    assert fake_weave.projects == [] and fake_weave.calls == []
    assert not [r for r in caplog.records if r.name == "autoresearch.study.tracing"]


def test_with_a_project_and_key_proposals_and_trials_are_traced(fake_weave, monkeypatch,
                                                                tmp_path: Path):
    monkeypatch.setenv("WANDB_API_KEY", "wandb-key")
    monkeypatch.setenv("WEAVE_PROJECT", "team/sql-rl")
    run_study(_study(), tmp_path, executor=SyntheticExecutor(lambda c: 0.3))
    assert fake_weave.projects == ["team/sql-rl"]
    assert fake_weave.calls.count("propose") == 1  # the baseline needs no proposer
    assert fake_weave.calls.count("trial") == 2


def test_a_configured_tracer_that_cannot_start_warns_once(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "weave", None)  # import fails
    monkeypatch.setenv("WANDB_API_KEY", "wandb-key")
    monkeypatch.setattr(tracing, "_warned", set())
    with caplog.at_level(logging.WARNING, logger="autoresearch.study.tracing"):
        for _ in range(3):
            assert not tracing.Tracer("team/sql-rl").enabled
    assert len([r for r in caplog.records if "could not start" in r.message]) == 1
