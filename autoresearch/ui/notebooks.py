"""Notebook files: report notebooks rendered from a template, headless execution with
parameters, and the rule that stored notebooks carry no output.

    render_report_notebook("runs/studies/demo")        # -> runs/studies/demo/report.ipynb
    execute_notebook("notebooks/01_quickstart.ipynb", "out.ipynb", {"small": True})

Parameters follow papermill's convention: the cell tagged `parameters` holds the defaults, and a
cell tagged `injected-parameters` inserted after it overrides them, so papermill itself runs
these notebooks too. A notebook counts as a report (and may keep its outputs in git) when its
metadata says `{"autoresearch": {"report": true}}`; every other stored notebook must be clean:

    python -m autoresearch.ui.notebooks check notebooks/     # exit 1 and list the offenders
    python -m autoresearch.ui.notebooks strip notebooks/     # clear outputs in place
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

TEMPLATE = Path(__file__).resolve().parents[1] / "templates" / "study_report.ipynb"


def inject_parameters(nb: Any, parameters: dict[str, Any]) -> Any:
    """Insert papermill's `injected-parameters` cell after the `parameters` cell."""
    import nbformat

    nb.cells = [c for c in nb.cells if "injected-parameters" not in c.metadata.get("tags", [])]
    if not parameters:
        return nb
    source = "# Parameters\n" + "".join(f"{k} = {v!r}\n" for k, v in parameters.items())
    cell = nbformat.v4.new_code_cell(source, metadata={"tags": ["injected-parameters"]})
    index = next((i + 1 for i, c in enumerate(nb.cells)
                  if "parameters" in c.metadata.get("tags", [])), 0)
    nb.cells.insert(index, cell)
    return nb


def execute_notebook(source: str | Path, output: str | Path | None = None,
                     parameters: dict[str, Any] | None = None, cwd: str | Path | None = None,
                     timeout: int = 600, kernel_name: str = "python3") -> Any:
    """Run a notebook top to bottom in a fresh kernel, keeping widget state; returns it (and
    writes it to `output`, even when a cell failed, so the failure can be read)."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(str(source), as_version=4)
    inject_parameters(nb, parameters or {})
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_name,
                            store_widget_state=True,
                            resources={"metadata": {"path": str(cwd or Path(source).parent)}})
    try:
        client.execute()
    finally:
        if output is not None:
            nbformat.write(nb, str(output))
    return nb


def render_report_notebook(directory: str | Path, output: str | Path | None = None,
                           template: str | Path | None = None, timeout: int = 600) -> Path:
    """Execute the report template for a study; the result is a standalone report notebook."""
    directory = Path(directory).resolve()
    output = Path(output) if output else directory / "report.ipynb"
    nb = execute_notebook(template or TEMPLATE, None, {"study_dir": str(directory)},
                          cwd=directory, timeout=timeout)
    nb.metadata.setdefault("autoresearch", {})["report"] = True
    import nbformat

    nbformat.write(nb, str(output))
    return output


# ------------------------------------------------------------ clean storage
def is_report(nb: Any) -> bool:
    return bool(nb.metadata.get("autoresearch", {}).get("report"))


def has_outputs(nb: Any) -> bool:
    return any(c.get("outputs") or c.get("execution_count") for c in nb.cells
               if c.cell_type == "code") or "widgets" in nb.metadata


def strip_outputs(nb: Any) -> Any:
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        cell.metadata.pop("execution", None)
    nb.metadata.pop("widgets", None)
    nb.metadata.pop("papermill", None)
    return nb


def notebook_paths(paths: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            out += sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        else:
            out.append(path)
    return out


def unclean(paths: Iterable[str | Path]) -> list[Path]:
    """Notebooks that carry outputs without being reports."""
    import nbformat

    return [p for p in notebook_paths(paths)
            if (nb := nbformat.read(str(p), as_version=4)) and has_outputs(nb)
            and not is_report(nb)]


def main(argv: list[str] | None = None) -> int:
    import nbformat

    parser = argparse.ArgumentParser(prog="python -m autoresearch.ui.notebooks")
    parser.add_argument("command", choices=["check", "strip"])
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args(argv)
    offenders = unclean(args.paths)
    if args.command == "check":
        for path in offenders:
            print(f"{path}: has outputs (clear them: python -m autoresearch.ui.notebooks strip "
                  f"{path})")
        return 1 if offenders else 0
    for path in offenders:
        nb = nbformat.read(str(path), as_version=4)
        nbformat.write(strip_outputs(nb), str(path))
        print(f"stripped {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
