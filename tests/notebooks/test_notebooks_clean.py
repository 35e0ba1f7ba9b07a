"""Notebooks are stored without outputs (reports excepted) and are all parameterised."""

from __future__ import annotations

from pathlib import Path

import nbformat

from autoresearch.ui.notebooks import TEMPLATE, inject_parameters, main, strip_outputs, unclean
from tests.notebooks.conftest import NOTEBOOKS


def parameters(path: Path) -> str:
    nb = nbformat.read(str(path), as_version=4)
    cells = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(cells) == 1, f"{path.name}: one cell tagged `parameters`"
    return cells[0].source


def test_stored_notebooks_carry_no_outputs():
    assert unclean([NOTEBOOKS, TEMPLATE]) == []


def test_every_notebook_has_a_small_budget_mode_and_the_template_takes_a_study():
    names = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))
    assert names == ["01_quickstart.ipynb", "02_autoresearch.ipynb", "03_analysis.ipynb",
                     "04_remote.ipynb", "05_rewards.ipynb", "06_your_database.ipynb"]
    for name in names:
        assert "small = False" in parameters(NOTEBOOKS / name)
    for name in ("01_quickstart.ipynb", "02_autoresearch.ipynb", "03_analysis.ipynb",
                 "06_your_database.ipynb"):
        assert "model = None" in parameters(NOTEBOOKS / name)
        assert "tokenizer = None" in parameters(NOTEBOOKS / name)
    assert "study_dir =" in parameters(TEMPLATE)


def test_the_check_flags_executed_notebooks_strips_them_and_exempts_reports(tmp_path: Path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print(1)", execution_count=1, outputs=[
        nbformat.v4.new_output("stream", name="stdout", text="1\n")])]
    executed = tmp_path / "executed.ipynb"
    nbformat.write(nb, str(executed))
    assert main(["check", str(tmp_path)]) == 1
    report = tmp_path / "report.ipynb"
    nb.metadata["autoresearch"] = {"report": True}
    nbformat.write(nb, str(report))
    assert unclean([tmp_path]) == [executed]
    assert main(["strip", str(tmp_path)]) == 0
    assert main(["check", str(tmp_path)]) == 0
    stripped = nbformat.read(str(executed), as_version=4)
    assert stripped.cells[0].outputs == [] and stripped.cells[0].execution_count is None
    assert nbformat.read(str(report), as_version=4).cells[0].outputs  # reports keep theirs
    assert strip_outputs(stripped) == stripped


def test_injected_parameters_follow_the_parameters_cell_and_replace_earlier_injections():
    nb = nbformat.read(str(NOTEBOOKS / "02_autoresearch.ipynb"), as_version=4)
    inject_parameters(nb, {"small": True, "workdir": "/tmp/x"})
    inject_parameters(nb, {"small": True, "model": None})
    tags = [c.metadata.get("tags", []) for c in nb.cells]
    index = tags.index(["parameters"])
    assert tags[index + 1] == ["injected-parameters"]
    assert sum("injected-parameters" in t for t in tags) == 1
    assert nb.cells[index + 1].source == "# Parameters\nsmall = True\nmodel = None\n"
