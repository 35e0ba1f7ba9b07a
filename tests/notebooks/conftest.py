"""Fixtures for the notebook tests: a tiny random Gemma 3 whose tokenizer knows SQL prompts, and
a runner that executes a notebook headless with parameters and keeps the result for CI."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ["TINKER_TELEMETRY"] = "0"

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
ARTIFACTS = REPO / "artifacts"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from sqltasks import load_corpus, render_prompt
    from tests.server.server_helpers import build_tiny_model

    corpus = [render_prompt(t, "base") + t.gold_sql for t in load_corpus("train", 0)[:80]]
    return build_tiny_model(tmp_path_factory.mktemp("tiny-sql-gemma3"), corpus,
                            max_position_embeddings=2048)


def run_notebook(name: str, **parameters: Any) -> Any:
    """Execute notebooks/<name> in a fresh kernel; the executed copy lands in artifacts/."""
    from autoresearch.ui.notebooks import execute_notebook

    out = ARTIFACTS / "notebooks"
    out.mkdir(parents=True, exist_ok=True)
    return execute_notebook(NOTEBOOKS / name, out / name, parameters, timeout=480)


def widget_states(nb: Any) -> list[dict[str, Any]]:
    """The saved ipywidgets models of an executed notebook: [{"model_name", "state"}]."""
    saved = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    return [{"model_name": m["model_name"], "state": m["state"]} for m in saved.values()]


def outputs(nb: Any, mime: str = "text/plain") -> list[str]:
    texts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and mime == "text/plain":
                texts.append(out["text"])
            elif mime in out.get("data", {}):
                texts.append(out["data"][mime])
    return texts
