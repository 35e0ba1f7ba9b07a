"""Studies and notebooks: the report shown in a running notebook, report notebooks rendered from a
template, headless execution with parameters, and the rule that stored notebooks carry no output.

    show_report("runs/studies/demo")                   # tables, curves, the best config as code
    render_report_notebook("runs/studies/demo")        # -> runs/studies/demo/report.ipynb
    execute_notebook("notebooks/01_quickstart.ipynb", "out.ipynb", {"small": True})

Parameters follow papermill's convention: the cell tagged `parameters` holds the defaults, and a
cell tagged `injected-parameters` inserted after it overrides them, so papermill itself runs
these notebooks too. A notebook counts as a report (and may keep its outputs in git) when its
metadata says `{"autoresearch": {"report": true}}`; every other stored notebook must be clean:

    python -m autoresearch.notebooks check notebooks/     # exit 1 and list the offenders
    python -m autoresearch.notebooks strip notebooks/     # clear outputs in place
"""

from __future__ import annotations

import argparse
import html
import pprint
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from autoresearch.config import TrialConfig

TEMPLATE = Path(__file__).parent / "templates" / "study_report.ipynb"
e = html.escape

CSS = """<style>
.ar-box{font-size:13px;color:var(--jp-ui-font-color1,inherit);}
.ar-box table{border-collapse:collapse;width:100%;}
.ar-box th{text-align:left;font-weight:600;border-bottom:1px solid var(--jp-border-color1,#aaa);
 padding:3px 8px;white-space:nowrap;}
.ar-box td{border-bottom:1px solid var(--jp-border-color2,#ddd);padding:3px 8px;
 vertical-align:top;}
.ar-box tr.ar-best td{background:rgba(16,185,129,.13);}
.ar-box code,.ar-box pre{font-family:var(--jp-code-font-family,monospace);font-size:12px;}
.ar-box pre{background:var(--jp-layout-color2,rgba(127,127,127,.1));padding:6px 8px;
 white-space:pre-wrap;margin:4px 0;}
.ar-badge{display:inline-block;padding:0 6px;border-radius:8px;font-size:11px;
 background:rgba(127,127,127,.18);}
.ar-badge.running{background:rgba(59,130,246,.25);} .ar-badge.kept{background:rgba(16,185,129,.3);}
.ar-badge.done{background:rgba(6,182,212,.25);}
.ar-badge.discarded{background:rgba(127,127,127,.25);}
.ar-badge.crashed{background:rgba(239,68,68,.3);}
.ar-badge.stopped{background:rgba(148,163,184,.3);}
.ar-badge.queued{background:rgba(245,158,11,.25);}
.ar-muted{opacity:.7;} .ar-h{font-weight:600;margin:6px 0 2px;}
.ar-dot{display:inline-block;width:9px;height:9px;border-radius:50%;margin-right:4px;}
</style>"""
"""Styles of the report and the widgets: JupyterLab's theme variables, so light and dark work."""


# ------------------------------------------------------------ the report
def best_config_code(config: TrialConfig) -> str:
    """Python that rebuilds `config` exactly (to paste into a notebook or a script)."""
    data = pprint.pformat(config.model_dump(mode="json"), sort_dicts=False, width=90)
    return ("from autoresearch.config import TrialConfig\n\n"
            f"best_config = TrialConfig.model_validate(\n{data}\n)\n")


class StudyReport:
    """A study's report for notebooks: rich HTML in place, Markdown elsewhere."""

    def __init__(self, directory: str | Path, curves: bool = True):
        from autoresearch.journal import Journal
        from autoresearch.report import build, to_markdown

        self.directory = Path(directory)
        journal = Journal(self.directory, read_only=True, lock_timeout=10.0)
        self.blocks = build(journal)
        self.markdown = to_markdown(self.blocks)
        study = journal.study()
        best = journal.trial(study["best_trial"]) if study["best_trial"] else None
        self.best_trial: dict[str, Any] | None = best
        self.best_config = TrialConfig.model_validate(best["config"]) if best else None
        self.code = best_config_code(self.best_config) if self.best_config else None
        self.curves = curves

    def _repr_html_(self) -> str:
        from autoresearch.report import html_list, html_table

        body = []
        for b in self.blocks:
            if b.kind == "h1":
                body.append(f"<h2>{e(b.text)}</h2>")
            elif b.kind == "h2":
                body.append(f"<h3>{e(b.text)}</h3>")
            elif b.kind == "p":
                body.append(f"<p>{e(b.text)}</p>")
            elif b.kind == "list":
                body.append(html_list(b.items))
            elif b.kind == "table":
                body.append(html_table(b.headers, b.rows))
            elif b.kind == "code":
                body.append(f"<pre class='ar-yaml'>{e(b.text)}</pre>")
                if self.code:
                    body.append("<p>As Python:</p>"
                                f"<pre class='ar-best-config'>{e(self.code)}</pre>")
            elif b.kind == "curves" and self.curves:
                body.append(self._curves_svg())
        return f'{CSS}<div class="ar-box ar-study-report">{"".join(body)}</div>'

    def _curves_svg(self) -> str:
        from autoresearch.live import read_snapshot
        from autoresearch.plots import curves_figure, figure_svg, trial_panels

        snapshot = read_snapshot(self.directory)
        if snapshot is None or not snapshot.steps:
            return ""
        return figure_svg(curves_figure, trial_panels(snapshot.steps), width=8.0, height=2.6)

    def _repr_markdown_(self) -> str:
        return self.markdown

    def __repr__(self) -> str:
        return self.markdown


def report_html(directory: str | Path) -> str:
    return StudyReport(directory)._repr_html_()


def show_report(directory: str | Path, curves: bool = True) -> StudyReport:
    """Display a study's report in the running notebook; returns it (`.code`, `.best_config`)."""
    from IPython.display import display

    report = StudyReport(directory, curves=curves)
    display(report)
    return report


# ------------------------------------------------------------ execution
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

    parser = argparse.ArgumentParser(prog="python -m autoresearch.notebooks")
    parser.add_argument("command", choices=["check", "strip"])
    parser.add_argument("paths", nargs="+")
    args = parser.parse_args(argv)
    offenders = unclean(args.paths)
    if args.command == "check":
        for path in offenders:
            print(f"{path}: has outputs (clear them: python -m autoresearch.notebooks strip "
                  f"{path})")
        return 1 if offenders else 0
    for path in offenders:
        nb = nbformat.read(str(path), as_version=4)
        nbformat.write(strip_outputs(nb), str(path))
        print(f"stripped {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
