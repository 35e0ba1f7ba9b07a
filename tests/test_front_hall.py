"""The front hall stays a guide: a short README, links that lead somewhere, and every benchmark
listed with the log where its numbers live."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")),
            *sorted((REPO / "bench").rglob("*.md"))]


def test_the_readme_is_a_guide_of_at_most_150_lines():
    assert len((REPO / "README.md").read_text().splitlines()) <= 150


def test_every_relative_link_of_the_readme_docs_and_logs_leads_to_a_file():
    broken = []
    for page in _pages():
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            if not path.exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, broken


def test_every_benchmark_is_listed_in_the_bench_readme_with_its_results():
    listed = (REPO / "bench" / "README.md").read_text()
    modules = [p.stem for p in (REPO / "bench").glob("*.py") if p.stem != "__init__"]
    assert modules
    missing = [m for m in modules if f"`{m}`" not in listed]
    assert not missing, missing
    for log in (REPO / "bench").rglob("*results*.md"):
        assert log.relative_to(REPO / "bench").as_posix() in listed, log
