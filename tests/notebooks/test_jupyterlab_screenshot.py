"""A real JupyterLab in headless Chromium runs the autoresearch notebook; the live dashboard
shows the study's trials, and screenshots of it (while it runs, at the end, and in the dark
theme) are kept in artifacts/ for people to look at.

Needs Debian's `chromium` and the `playwright` and `jupyterlab` packages (no browser download:
Playwright drives the system Chromium through `executable_path`).
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import nbformat
import pytest

from autoresearch.ui.notebooks import inject_parameters
from tests.notebooks.conftest import ARTIFACTS, NOTEBOOKS
from tools.processes import ServiceProcess

CHROMIUM = os.environ.get("AUTORESEARCH_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

ROW_STATUSES = ("rows => rows.map(r => "
                "[r.dataset.trial, r.querySelector('.ar-badge').textContent])")

pytestmark = [
    pytest.mark.timeout(600),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"no Chromium at {CHROMIUM}"),
]


def _settings(root: Path) -> dict[str, str]:
    """A private Jupyter configuration: no news toast, every cell kept in the DOM."""
    config, settings = root / "jupyter-config", root / "lab-settings"
    (config / "labconfig").mkdir(parents=True)
    (config / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    tracker = settings / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    return {"JUPYTER_CONFIG_DIR": str(config), "JUPYTERLAB_SETTINGS_DIR": str(settings),
            "JUPYTERLAB_WORKSPACES_DIR": str(root / "workspaces")}


@pytest.fixture
def jupyterlab(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    pytest.importorskip("jupyterlab")
    from server.entrypoints.runtime import free_port

    port, token = free_port(), secrets.token_hex(16)
    notebooks = tmp_path / "lab"
    notebooks.mkdir()
    env = {**os.environ, **_settings(tmp_path), "TINKER_TELEMETRY": "0"}
    env.pop("TINKER_BASE_URL", None)  # the notebook starts its own embedded server
    command = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
               f"--port={port}", f"--IdentityProvider.token={token}",
               f"--ServerApp.root_dir={notebooks}", "--ServerApp.open_browser=False"]
    if os.geteuid() == 0:
        command.append("--allow-root")
    lab = ServiceProcess(command, tmp_path / "jupyterlab.log", url=f"http://127.0.0.1:{port}",
                         env=env).start()
    url = lab.url
    try:
        lab.wait_answers("/api/status", 200, timeout=90, token=token)
        yield url, token, notebooks
    finally:
        headers = {"Authorization": f"token {token}"}
        try:  # end the kernels first: they are not in JupyterLab's process group
            for kernel in httpx.get(f"{url}/api/kernels", headers=headers).json():
                httpx.delete(f"{url}/api/kernels/{kernel['id']}", headers=headers, timeout=30)
        except httpx.HTTPError:
            pass
        lab.stop()
        shutil.copy(tmp_path / "jupyterlab.log", ARTIFACTS / "jupyterlab.log")


def test_jupyterlab_runs_the_autoresearch_notebook_and_the_dashboard_shows_the_study(
        jupyterlab: tuple[str, str, Path], tiny_model: Path):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    url, token, root = jupyterlab
    nb = nbformat.read(str(NOTEBOOKS / "02_autoresearch.ipynb"), as_version=4)
    inject_parameters(nb, {"model": str(tiny_model), "tokenizer": str(tiny_model), "small": True,
                           "workdir": str(root / "runs"), "study_name": "lab-study",
                           "render_report": False})
    nbformat.write(nb, str(root / "autoresearch.ipynb"))
    ARTIFACTS.mkdir(exist_ok=True)

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                             args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 1250})
            page.goto(f"{url}/lab/workspaces/dashboard-test/tree/autoresearch.ipynb"
                      f"?reset&token={token}")
            page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=120_000)
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()

            dashboard = page.locator(".ar-dashboard").first
            rows = page.locator(".ar-dashboard table.ar-leaderboard tr.ar-row")
            rows.first.wait_for(timeout=240_000)
            try:  # mid-study: a trial training (brief on a tiny model, so not required)
                page.locator(".ar-dashboard table.ar-leaderboard .ar-badge.running").first \
                    .wait_for(timeout=60_000)
                dashboard.evaluate("node => node.scrollIntoView({block: 'start'})")
                page.screenshot(path=str(ARTIFACTS / "jupyterlab-dashboard-running.png"))
            except PlaywrightTimeout:
                pass

            page.locator(".ar-dashboard .ar-badge.finished").wait_for(timeout=300_000)
            dashboard.evaluate("node => node.scrollIntoView({block: 'start'})")
            page.wait_for_timeout(500)
            page.screenshot(path=str(ARTIFACTS / "jupyterlab-dashboard.png"))

            statuses = rows.evaluate_all(ROW_STATUSES)
            page.locator(".lm-MenuBar-itemLabel", has_text="Settings").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Theme").first.hover()
            page.locator(".lm-Menu-itemLabel", has_text="JupyterLab Dark").first.click()
            page.wait_for_function("document.body.dataset.jpThemeLight === 'false'")
            dashboard.evaluate("node => node.scrollIntoView({block: 'start'})")
            page.wait_for_timeout(500)
            page.screenshot(path=str(ARTIFACTS / "jupyterlab-dashboard-dark.png"))
            header = page.locator(".ar-dashboard").first.inner_text()
            curves = page.locator(".ar-dashboard .ar-curves svg").count()
            bars = page.locator(".ar-dashboard .widget-hprogress .progress-bar").count()
        finally:
            browser.close()

    assert [trial for trial, _ in statuses] and len(statuses) == 3
    assert {status for _, status in statuses} <= {"kept", "discarded"}
    assert "Study lab-study" in header and "resident runs" in header
    assert "Latest hypotheses" in header and "optuna" in header
    assert curves == 1 and bars >= 1
