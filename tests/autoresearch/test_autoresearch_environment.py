"""A study journals the environment its numbers depend on, and the report shows it."""

from __future__ import annotations

import platform
from pathlib import Path

from autoresearch.study.environment import cpu_facts, environment_text, fingerprint
from autoresearch.study.journal import Journal
from autoresearch.study.runner import run_study
from autoresearch.study.spec import Study
from tests.autoresearch.study_helpers import SyntheticExecutor

CPUINFO = """processor\t: 0
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16 sha_ni
"""


def test_cpu_facts_name_the_model_and_the_kernel_relevant_flags(tmp_path: Path):
    info = tmp_path / "cpuinfo"
    info.write_text(CPUINFO)
    facts = cpu_facts(info)
    assert facts["model"] == "AMD EPYC 9B14"
    assert facts["flags"] == ["avx2", "avx512_bf16", "avx512f", "fma"]  # sha_ni is not one


def test_the_fingerprint_has_versions_threads_and_the_python():
    facts = fingerprint()
    assert facts["python"] == platform.python_version()
    assert facts["packages"]["duckdb"] not in ("", "not installed")
    assert "server" not in facts
    assert "duckdb" in environment_text(facts)


def test_a_study_journals_its_environment_and_the_report_shows_it(tmp_path: Path):
    study = Study(name="env", search_space={"rl.temperature": {"low": 0.7, "high": 1.2}},
                  budget={"max_trials": 1, "confirm_seeds": 0})
    outcome = run_study(study, tmp_path, executor=SyntheticExecutor(lambda c: 0.5))
    events = [e for e in Journal(tmp_path, read_only=True).events()
              if e["kind"] == "environment"]
    assert len(events) == 1 and events[0]["data"]["packages"]["tinker"]
    report = outcome.report.read_text()
    assert "## Environment" in report and "This study ran in one environment." in report
