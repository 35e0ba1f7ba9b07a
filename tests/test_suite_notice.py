"""The end-of-run notice: every skip reason counted, and missing system packages named."""

from __future__ import annotations

from tests.conftest import missing_packages, skip_reasons


def test_every_skip_reason_is_counted_once_per_test():
    reasons = ["Skipped: no Chromium at /usr/bin/chromium",
               "Skipped: neither kustomize nor kubectl (which embeds kustomize) is installed",
               "Skipped: neither kustomize nor kubectl (which embeds kustomize) is installed"]
    assert skip_reasons(reasons) == {
        "no Chromium at /usr/bin/chromium": 1,
        "neither kustomize nor kubectl (which embeds kustomize) is installed": 2,
    }
    assert missing_packages(reasons) == {"chromium": 1}
