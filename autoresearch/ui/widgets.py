"""Notebook widgets (ipywidgets): a live study dashboard, a trial monitor, a trial inspector.

    dash = live.dashboard(); dash          # leaderboard, curves, hypotheses, server, controls
    monitor = TrialMonitor(config); monitor
    run_trial(config, out, url, key, progress=monitor)
    TrialInspector(out)                    # sampled completions, reward parts, SQL vs gold

The dashboard redraws from the study journal on a background thread, so the kernel stays free
while trials run; `refresh()` redraws once from the calling thread (what a notebook does at the
end, so the saved widget state holds the final rows). All HTML uses JupyterLab's theme
variables and the curves are inline SVG drawn in `currentColor`: light and dark themes both
read well.
"""

from __future__ import annotations

import html
import threading
import time
from pathlib import Path
from typing import Any

import ipywidgets as w

from autoresearch.study.control import StudyControl
from autoresearch.ui.plots import color_for, curves_figure, figure_svg, trial_panels
from autoresearch.ui.report import CSS
from autoresearch.ui.snapshot import (
    StudySnapshot,
    fmt_value,
    hypotheses,
    leaderboard,
    read_snapshot,
    server_health,
)

e = html.escape



def _badge(status: str, label: str | None = None) -> str:
    return f'<span class="ar-badge {e(status)}">{e(label or status)}</span>'


def _interval(value: float | None, low: float | None, high: float | None) -> str:
    if value is None:
        return '<span class="ar-muted">-</span>'
    return f"{value:.3f} <span class='ar-muted'>[{low:.3f}, {high:.3f}]</span>"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.0f}s" if value < 120 else f"{value / 60:.1f}m"


# --------------------------------------------------------------- renderers
def leaderboard_html(rows: list[dict[str, Any]], colors: dict[str, str] | None = None) -> str:
    head = ("<tr><th>#</th><th>trial</th><th>status</th><th>config vs best</th>"
            "<th>dev accuracy [95% CI]</th><th>progress</th><th>tokens</th><th>wall</th>"
            "<th>proposer</th></tr>")
    body = []
    for r in rows:
        dot = (f'<span class="ar-dot" style="background:{colors[r["id"]]}"></span>'
               if colors and r["id"] in colors else "")
        best = " ★" if r["best"] else ""
        status = _badge(r["status"])
        if r["error"] and r["status"] == "crashed":
            status += f'<div class="ar-muted">{e(r["error"][0][:80])}</div>'
        diff = e(r["diff_text"]) if r["diff"] is not None else "<b>best</b>"
        body.append(
            f'<tr class="ar-row{" ar-best" if r["best"] else ""}" data-trial="{e(r["id"])}">'
            f"<td>{r['rank']}</td><td style='white-space:nowrap'>{dot}<code>{e(r['id'])}</code>"
            f"{best}<div class='ar-muted'>{e(r['role'])}, seed {r['seed']}</div></td>"
            f"<td>{status}</td><td>{diff}</td>"
            f"<td>{_interval(r['dev'], r['dev_low'], r['dev_high'])}</td>"
            f"<td>{r['steps_done']}/{r['steps_total']}</td>"
            f"<td>{r['tokens'] if r['tokens'] is not None else '-'}</td>"
            f"<td>{_seconds(r['wall_seconds'])}</td>"
            f"<td style='white-space:nowrap'>{e(r['proposer'] or '-')}</td></tr>")
    if not body:
        body.append('<tr><td colspan="9" class="ar-muted">no trials yet</td></tr>')
    return (f'{CSS}<div class="ar-box"><table class="ar-leaderboard"><thead>{head}</thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def header_html(snapshot: StudySnapshot | None, control_state: Any = None) -> str:
    if snapshot is None:
        return f'{CSS}<div class="ar-box ar-muted">waiting for the study journal…</div>'
    s = snapshot.study
    spec = s.get("spec") or {}
    counts: dict[str, int] = {}
    for t in snapshot.trials:
        counts[t["status"]] = counts.get(t["status"], 0) + 1
    state = s["state"]
    if control_state is not None and state != "finished":
        if control_state.stopped:
            state = "stopping"
        elif control_state.paused:
            state = "paused"
    parts = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no trials yet"
    proposer = (spec.get("proposer") or {}).get("kind", "?")
    return (f'{CSS}<div class="ar-box"><b>Study {e(s["name"])}</b> {_badge(state)} '
            f'<span class="ar-muted">proposer {e(proposer)} · best '
            f'{e(s.get("best_trial") or "-")} · {e(parts)}</span></div>')


def hypotheses_html(items: list[dict[str, Any]]) -> str:
    if not items:
        return (f'{CSS}<div class="ar-box"><div class="ar-h">Latest hypotheses</div>'
                '<div class="ar-muted">none yet: the baseline runs first</div></div>')
    out = []
    for h in items:
        changes = (", ".join(f"{k}={fmt_value(v)}" for k, v in h["changes"].items())
                   or "(base config)")
        out.append(f'<div class="ar-hypothesis" style="margin-bottom:6px"><code>{e(h["id"])}'
                   f'</code> {_badge(h["status"])} <span class="ar-muted">{e(h["proposer"])}'
                   f'</span><div><code>{e(changes)}</code></div>'
                   f'<div>{e(h["rationale"][:400])}</div></div>')
    return (f'{CSS}<div class="ar-box ar-hypotheses"><div class="ar-h">Latest hypotheses</div>'
            f'{"".join(out)}</div>')


def health_html(health: dict[str, Any] | None, url: str | None) -> str:
    if health is None:
        text = ("no server to watch" if not url
                else f"server {e(url)} unreachable (or it has no /metrics)")
        return (f'{CSS}<div class="ar-box"><div class="ar-h">Server</div>'
                f'<div class="ar-muted">{text}</div></div>')
    queues = f"{health['queue_depth']} training, {health['sampling_queue']} sampling"
    rows = [("queue depth", queues),
            ("engine duty cycle", f"{health['duty_cycle'] * 100:.0f}%"),
            ("resident runs", str(health["resident_runs"])),
            ("throughput", f"{health['tokens_per_second']:.0f} tokens/s"),
            ("evictions", str(health["evictions"]))]
    cells = "".join(f"<tr><td>{k}</td><td>{v}</td></tr>" for k, v in rows)
    return (f'{CSS}<div class="ar-box ar-health"><div class="ar-h">Server '
            f'<span class="ar-muted">{e(health["url"])}</span></div><table>{cells}</table></div>')


def events_html(events: list[dict[str, Any]], limit: int = 5) -> str:
    lines = "".join(
        f"<div><span class='ar-muted'>{time.strftime('%H:%M:%S', time.localtime(ev['time']))}"
        f"</span> {e(ev['trial_id'] or '')} {e(ev['message'][:200])}</div>"
        for ev in events[:limit])
    return f'{CSS}<div class="ar-box ar-events"><div class="ar-h">Events</div>{lines}</div>'


# --------------------------------------------------------------- dashboard
class StudyDashboard:
    """A live view of one study's journal, with controls when it runs from this notebook.

    `control`: the study's `StudyControl` (given by `LiveStudy.dashboard()`); without one the
    buttons are disabled, since nobody would obey them.
    """

    def __init__(self, directory: str | Path, server_url: str | None = None,
                 control: StudyControl | None = None, live: Any = None,
                 interval: float = 1.0, max_curves: int = 8, show_report: bool = True):
        self.directory = Path(directory)
        self.server_url = server_url
        self.control = control
        self.live = live
        self.interval = interval
        self.max_curves = max_curves
        self.show_report = show_report
        self.snapshot: StudySnapshot | None = None
        self.rows: list[dict[str, Any]] = []
        self.health: dict[str, Any] | None = None
        self._curve_key: Any = None
        self._report_done = False
        self._thread: threading.Thread | None = None
        self._halt = threading.Event()
        self._lock = threading.Lock()

        self.header = w.HTML(header_html(None))
        self.budget = w.IntProgress(value=0, min=0, max=1, description="trials",
                                    bar_style="info", layout=w.Layout(width="420px"))
        self.trial_bars = w.VBox([])
        self.leaderboard = w.HTML(leaderboard_html([]))
        self.leaderboard.add_class("ar-leaderboard-widget")
        self.curves = w.HTML("")
        self.curves.add_class("ar-curves")
        self.hypotheses = w.HTML(hypotheses_html([]))
        self.server = w.HTML(health_html(None, server_url))
        self.events = w.HTML("")
        self.report = w.HTML("")
        self.report.add_class("ar-report")
        self.pause_button = w.Button(description="Pause", icon="pause")
        self.resume_button = w.Button(description="Resume", icon="play")
        self.stop_button = w.Button(description="Stop study", icon="stop", button_style="danger")
        self.trial_choice = w.Dropdown(options=[], description="trial",
                                       layout=w.Layout(width="180px"))
        self.stop_trial_button = w.Button(description="Stop trial", icon="times",
                                          button_style="warning")
        self.message = w.HTML("")
        self.pause_button.on_click(lambda _: self._steer("pause"))
        self.resume_button.on_click(lambda _: self._steer("resume"))
        self.stop_button.on_click(lambda _: self._steer("stop"))
        self.stop_trial_button.on_click(lambda _: self._steer("stop_trial"))
        controls = w.HBox([self.pause_button, self.resume_button, self.stop_button,
                           self.trial_choice, self.stop_trial_button, self.message])
        controls.add_class("ar-controls")
        if control is None:
            for button in (self.pause_button, self.resume_button, self.stop_button,
                           self.stop_trial_button):
                button.disabled = True
                button.tooltip = "controls act on studies started from this notebook"
        side = w.VBox([self.hypotheses, self.server], layout=w.Layout(width="34%"))
        self.widget = w.VBox([
            self.header, controls, w.HBox([self.budget]), self.trial_bars, self.leaderboard,
            w.HBox([w.Box([self.curves], layout=w.Layout(width="66%")), side]),
            self.events, self.report,
        ])
        self.widget.add_class("ar-dashboard")

    # ------------------------------------------------------------ steering
    def _steer(self, action: str) -> None:
        if self.control is None:
            return
        if action == "stop_trial":
            if not self.trial_choice.value:
                self.message.value = "no running trial selected"
                return
            self.control.stop_trial(self.trial_choice.value)
            self.message.value = f"stopping {e(self.trial_choice.value)} at its next step"
        else:
            getattr(self.control, action)()
            self.message.value = {"pause": "pausing at the next step boundary",
                                  "resume": "resumed", "stop": "stopping the study"}[action]
        self.refresh()

    # ------------------------------------------------------------ drawing
    def refresh(self) -> StudySnapshot | None:
        """Read the journal and the server once and redraw (safe from any thread)."""
        with self._lock:
            snapshot = read_snapshot(self.directory)
            if snapshot is None:  # not created yet, or held by the study longer than we waited
                if self.snapshot is None:
                    self.header.value = header_html(None)
                return self.snapshot
            self.snapshot = snapshot
            self.rows = leaderboard(snapshot)
            state = self.control.state() if self.control is not None else None
            self.header.value = header_html(snapshot, state)
            budget = (snapshot.study.get("spec") or {}).get("budget") or {}
            explored = [t for t in snapshot.trials if t["role"] in ("baseline", "explore")]
            ended = [t for t in explored if t["status"] not in ("queued", "running")]
            self.budget.max = max(1, budget.get("max_trials", len(explored)), len(explored))
            self.budget.value = len(ended)
            self.budget.bar_style = "success" if snapshot.finished else "info"
            self._trial_progress()
            order = [r["id"] for r in sorted(self.rows, key=lambda r: r["number"])]
            colors = {tid: color_for(i) for i, tid in enumerate(order)}
            self.leaderboard.value = leaderboard_html(self.rows, colors)
            self._draw_curves(snapshot, colors)
            self.hypotheses.value = hypotheses_html(hypotheses(snapshot))
            if self.server_url:
                self.health = server_health(self.server_url, timeout=1.0)
            self.server.value = health_html(self.health, self.server_url)
            self.events.value = events_html(snapshot.events)
            running = [r["id"] for r in self.rows if r["status"] == "running"]
            if list(self.trial_choice.options) != running:
                chosen = self.trial_choice.value
                self.trial_choice.options = running
                if running:
                    self.trial_choice.value = chosen if chosen in running else running[0]
            if snapshot.finished and self.show_report and not self._report_done:
                from autoresearch.ui.report import report_html

                self.report.value = report_html(self.directory)
                self._report_done = True
            return snapshot

    def _trial_progress(self) -> None:
        running = [r for r in self.rows if r["status"] == "running"]
        bars = {b.description: b for b in self.trial_bars.children}
        children = []
        for r in sorted(running, key=lambda r: r["number"]):
            bar = bars.get(r["id"]) or w.IntProgress(description=r["id"], min=0,
                                                       layout=w.Layout(width="420px"))
            bar.max = max(1, r["steps_total"])
            bar.value = r["steps_done"]
            children.append(bar)
        if [b.description for b in children] != list(bars):
            self.trial_bars.children = children

    def _draw_curves(self, snapshot: StudySnapshot, colors: dict[str, str]) -> None:
        shown = sorted(snapshot.steps)
        if len(shown) > self.max_curves:  # the best and the most recent
            keep = {snapshot.best_id} | set(sorted(snapshot.steps)[-(self.max_curves - 1):])
            shown = [t for t in shown if t in keep]
        steps = {t: snapshot.steps[t] for t in shown}
        key = tuple((t, len(s)) for t, s in steps.items())
        if key == self._curve_key:
            return
        self._curve_key = key
        svg = figure_svg(curves_figure, trial_panels(steps), width=7.2, height=2.5,
                         colors=colors)
        self.curves.value = f'<div class="ar-box">{svg}</div>'

    # --------------------------------------------------------- background
    def start(self) -> StudyDashboard:
        """Redraw every `interval` seconds until the study finishes or `stop()`."""
        if self._thread is None or not self._thread.is_alive():
            self._halt.clear()
            self._thread = threading.Thread(target=self._loop, name="dashboard", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._halt.is_set():
            try:
                snapshot = self.refresh()
            except Exception as exc:  # noqa: BLE001 - keep watching; say what went wrong
                self.message.value = f"refresh failed: {e(str(exc)[:200])}"
                snapshot = None
            live_done = self.live is not None and not self.live.running
            if snapshot is not None and snapshot.finished and (self.live is None or live_done):
                return
            self._halt.wait(self.interval)

    def stop(self) -> StudySnapshot | None:
        """Stop redrawing in the background, then redraw once more from this thread."""
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        return self.refresh()

    def _ipython_display_(self) -> None:
        from IPython.display import display

        self.refresh()
        display(self.widget)
        self.start()


# ---------------------------------------------------------------- one trial
class TrialMonitor:
    """A progress callback for `run_trial` that shows a bar, the latest numbers and curves."""

    def __init__(self, total_steps: int | Any, title: str = "trial", redraw_seconds: float = 2.0):
        if hasattr(total_steps, "rl"):  # a TrialConfig
            title = total_steps.name if title == "trial" else title
            total_steps = total_steps.sft.steps + total_steps.rl.steps
        self.steps: list[dict[str, Any]] = []
        self.evals: list[dict[str, Any]] = []
        self.redraw_seconds = redraw_seconds
        self._drawn = 0.0
        self.bar = w.IntProgress(value=0, min=0, max=max(1, int(total_steps)), description=title,
                                 bar_style="info", layout=w.Layout(width="480px"))
        self.status = w.HTML(f'{CSS}<div class="ar-box ar-muted">starting…</div>')
        self.curves = w.HTML("")
        self.widget = w.VBox([self.bar, self.status, self.curves])
        self.widget.add_class("ar-trial-monitor")

    def __call__(self, event: dict[str, Any]) -> None:
        if event.get("type") == "step":
            self.steps.append(event)
            self.bar.value = min(self.bar.max, len(self.steps))
            if time.monotonic() - self._drawn >= self.redraw_seconds:
                self.draw()
            self.status.value = self._status()
        elif event.get("phase") == "eval" and event.get("accuracy") is not None:
            # an evaluation's start announces itself with no score yet: only results are shown
            self.evals.append(event)
            self.status.value = self._status()
        elif event.get("phase") == "done":
            self.bar.bar_style = "success"
            self.draw()
            self.status.value = self._status(done=event.get("dev_accuracy"))

    def _status(self, done: float | None = None) -> str:
        parts = []
        if self.steps:
            last = self.steps[-1]
            parts.append(f"{last['phase'].upper()} step {last['step'] + 1}")
            if last.get("reward_mean") is not None:
                parts.append(f"reward {last['reward_mean']:.3f}")
                parts.append(f"sample accuracy {last['accuracy']:.2f}")
            if last.get("loss_per_token") is not None:
                parts.append(f"loss {last['loss_per_token']:.3f}")
        for ev in self.evals[-2:]:
            parts.append(f"eval {ev['stage']} on {ev['split']}: {ev['accuracy']:.3f}")
        if done is not None:
            parts.append(f"<b>finished: dev accuracy {done:.3f}</b>")
        return f'{CSS}<div class="ar-box">{" · ".join(parts)}</div>'

    def draw(self) -> None:
        self._drawn = time.monotonic()
        self.curves.value = '<div class="ar-box">' + figure_svg(
            curves_figure, trial_panels({self.bar.description: self.steps}), width=7.0,
            height=2.3) + "</div>"

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


# ------------------------------------------------------------ trial inspector
def _result_table(columns: Any, rows: list[Any], limit: int = 8) -> str:
    if not columns:
        return ""
    head = "".join(f"<th>{e(str(c))}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{e(str(v))}</td>" for v in row) + "</tr>"
                   for row in rows[:limit])
    more = (f'<div class="ar-muted">… {len(rows) - limit} more rows</div>'
            if len(rows) > limit else "")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{more}"


def sample_html(sample: Any) -> str:
    """One sampled completion: question, completion, reward parts, its result and the gold's."""
    comps = "".join(f"<tr><td>{e(k)}</td><td>{v:.3f}</td><td>{sample.weights.get(k, 0):g}</td>"
                    f"</tr>" for k, v in sample.components.items())
    pred, gold = sample.prediction_result, sample.gold_result
    pred_block = (_result_table(pred["columns"], pred["rows"]) if pred["outcome"] == "ok"
                  else f'<div class="ar-muted">{e(pred["outcome"])}: {e(pred["error"])}</div>')
    verdict = "correct" if sample.correct else f"wrong ({sample.outcome})"
    return (f'{CSS}<div class="ar-box ar-sample"><div class="ar-h">{e(sample.task_id)} '
            f'{_badge("kept", "correct") if sample.correct else _badge("crashed", "wrong")}'
            f'</div><div>{e(sample.question)}</div>'
            f'<div class="ar-h">completion</div><pre>{e(sample.completion)}</pre>'
            f'<div class="ar-h">reward {sample.total:.3f} · {e(verdict)}</div>'
            f"<table><thead><tr><th>component</th><th>value</th><th>weight</th></tr></thead>"
            f"<tbody>{comps}</tbody></table>"
            f'<div style="display:flex;gap:16px"><div style="flex:1"><div class="ar-h">'
            f'prediction</div><pre>{e(sample.sql or "(no SQL found)")}</pre>{pred_block}</div>'
            f'<div style="flex:1"><div class="ar-h">gold</div><pre>{e(sample.gold_sql)}</pre>'
            f'{_result_table(gold["columns"], gold["rows"])}</div></div></div>')


class TrialInspector:
    """Browse a trial's sampled completions (from its evaluations) with reward breakdowns."""

    def __init__(self, directory: str | Path, split: str = "dev", stage: str = "final",
                 limit: int = 8):
        from autoresearch.rl.samples import inspect_samples

        self.samples = inspect_samples(directory, split, stage, limit)
        options = [(f"{i + 1}. {'✓' if s.correct else '✗'} {s.task_id}", i)
                   for i, s in enumerate(self.samples)]
        self.choice = w.Dropdown(options=options, description="sample",
                                 layout=w.Layout(width="420px"))
        self.detail = w.HTML("")
        summary = "".join(
            f"<tr><td>{i + 1}</td><td><code>{e(s.task_id)}</code></td>"
            f"<td>{'✓' if s.correct else '✗'}</td><td>{s.total:.3f}</td><td>{e(s.outcome)}</td>"
            f"</tr>" for i, s in enumerate(self.samples))
        self.summary = w.HTML(
            f'{CSS}<div class="ar-box"><div class="ar-h">{e(Path(directory).name)}: {split} '
            f'samples ({stage})</div><table class="ar-samples"><thead><tr><th>#</th><th>task'
            f'</th><th>correct</th><th>reward</th><th>outcome</th></tr></thead><tbody>{summary}'
            f"</tbody></table></div>")
        self.choice.observe(self._show, names="value")
        self.widget = w.VBox([self.summary, self.choice, self.detail])
        self.widget.add_class("ar-inspector")
        self._show()

    def _show(self, _: Any = None) -> None:
        if self.samples:
            self.detail.value = sample_html(self.samples[self.choice.value or 0])
        else:
            self.detail.value = f'{CSS}<div class="ar-box ar-muted">no samples recorded</div>'

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)

