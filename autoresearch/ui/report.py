"""The study report as HTML, the one renderer for both places it is shown: in a running notebook
(`show_report`, themed by JupyterLab's variables, curves drawn by matplotlib) and as a
self-contained page (`autoresearch report --format html`, inline SVG sparklines).

The blocks themselves come from `autoresearch.study.report.build`; this module only draws them.
"""

from __future__ import annotations

import html
import pprint
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from autoresearch.rl.config import TrialConfig
from autoresearch.study.journal import Journal
from autoresearch.study.report import Block, build, to_markdown

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


# ------------------------------------------------------------ blocks
def html_list(items: list[str] | None) -> str:
    return "<ul>" + "".join(f"<li>{e(i)}</li>" for i in items or []) + "</ul>"


def html_table(headers: list[str] | None, rows: list[list[str]] | None) -> str:
    head = "".join(f"<th>{e(h)}</th>" for h in headers or [])
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in row) + "</tr>"
                   for row in rows or [])
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def sparkline_svg(values: list[float], width: int = 240, height: int = 48) -> str:
    lo, hi = min(values), max(values)
    span = hi - lo or 1.0
    step = width / max(1, len(values) - 1)
    points = " ".join(f"{i * step:.1f},{height - 4 - (v - lo) / span * (height - 8):.1f}"
                      for i, v in enumerate(values))
    return (f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
            f'<polyline fill="none" stroke="#2563eb" stroke-width="2" points="{points}"/></svg>')


def sparkline_table(block: Block) -> str:
    """A curves block as one row per series: label, sparkline, first and last value."""
    return "<table>" + "".join(
        f"<tr><td>{e(label)}</td><td>{sparkline_svg(vals)}</td>"
        f"<td>{vals[0]:.3f} &rarr; {vals[-1]:.3f}</td></tr>"
        for label, vals in block.series or []) + "</table>"


def blocks_html(blocks: Sequence[Block], curves: Callable[[Block], str],
                heading_level: int = 1, code: str | None = None) -> str:
    """The report's blocks as HTML; `curves` draws a curves block, `code` follows the YAML."""
    body = []
    for b in blocks:
        if b.kind in ("h1", "h2"):
            level = heading_level + (b.kind == "h2")
            body.append(f"<h{level}>{e(b.text)}</h{level}>")
        elif b.kind == "p":
            body.append(f"<p>{e(b.text)}</p>")
        elif b.kind == "list":
            body.append(html_list(b.items))
        elif b.kind == "table":
            body.append(html_table(b.headers, b.rows))
        elif b.kind == "code":
            body.append(f"<pre class='ar-yaml'>{e(b.text)}</pre>")
            if code:
                body.append(f"<p>As Python:</p><pre class='ar-best-config'>{e(code)}</pre>")
        elif b.kind == "curves":
            body.append(curves(b))
    return "".join(body)


def report_page(blocks: Sequence[Block]) -> str:
    """A self-contained HTML page of the report (no scripts, curves as inline SVG)."""
    title = e(blocks[0].text if blocks else "Study")
    style = ("body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;"
             "padding:0 1em}table{border-collapse:collapse;margin:1em 0}"
             "td,th{border:1px solid #ddd;padding:4px 8px;font-size:14px;text-align:left}"
             "pre{background:#f6f8fa;padding:1em;overflow:auto}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
            f"<style>{style}</style></head><body>{blocks_html(blocks, sparkline_table)}"
            "</body></html>\n")


def write_report_page(directory: str | Path, out: str | Path | None = None) -> Path:
    """Write the report page (`report.html` beside the journal, unless `out`)."""
    journal = Journal(directory, read_only=True)
    target = Path(out) if out else journal.path.parent / "report.html"
    target.write_text(report_page(build(journal)), encoding="utf-8")
    return target


# ------------------------------------------------------------ in a notebook
def best_config_code(config: TrialConfig) -> str:
    """Python that rebuilds `config` exactly (to paste into a notebook or a script)."""
    data = pprint.pformat(config.model_dump(mode="json"), sort_dicts=False, width=90)
    return ("from autoresearch.rl.config import TrialConfig\n\n"
            f"best_config = TrialConfig.model_validate(\n{data}\n)\n")


class StudyReport:
    """A study's report for notebooks: rich HTML in place, Markdown elsewhere."""

    def __init__(self, directory: str | Path, curves: bool = True):
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
        body = blocks_html(self.blocks, self._curves_svg, heading_level=2, code=self.code)
        return f'{CSS}<div class="ar-box ar-study-report">{body}</div>'

    def _curves_svg(self, block: Block | None = None) -> str:
        if not self.curves:
            return ""
        from autoresearch.ui.plots import curves_figure, figure_svg, trial_panels
        from autoresearch.ui.snapshot import read_snapshot

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
