"""Training curves as matplotlib figures that read well on a light or a dark notebook theme.

No pyplot: figures are built with the object API, so they can be drawn from a dashboard's
background thread and never pop up a window. Two ways out:

- `figure_svg(fig)`: inline SVG whose text, axes and grid use `currentColor`, so they take the
  colour of the surrounding text in any theme (what the live dashboard shows);
- `Chart(fig)`: a PNG with a transparent background and mid-grey ink, readable on white and
  on black (what static cells and report notebooks show; it survives any notebook viewer).

Line colours are mid-luminance, distinct on both backgrounds.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

PALETTE = ("#3b82f6", "#f59e0b", "#10b981", "#ef4444", "#a855f7", "#06b6d4", "#ec4899",
           "#84cc16", "#f97316", "#6366f1")
NEUTRAL_INK = "#8c8c8c"
"""Readable on white (#fff) and on JupyterLab's dark background alike."""
_SVG_INK = "#010203"
"""Placeholder ink swapped for `currentColor` in SVG output."""

Series = Mapping[str, Sequence[tuple[float, float]]]
"""Label -> (x, y) points."""


def color_for(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def _style(ax: Any, ink: str) -> None:
    ax.set_facecolor("none")
    for spine in ("top", "right"):
        ax.spines[spine].set_visible(False)
    for spine in ("left", "bottom"):
        ax.spines[spine].set_color(ink)
    ax.tick_params(colors=ink, labelsize=8)
    ax.xaxis.label.set_color(ink)
    ax.yaxis.label.set_color(ink)
    ax.title.set_color(ink)
    ax.grid(True, color=ink, alpha=0.2, linewidth=0.6)


def curves_figure(panels: Sequence[tuple[str, Series]], xlabel: str = "step",
                  width: float = 7.0, height: float = 2.6, ink: str = NEUTRAL_INK,
                  colors: Mapping[str, str] | None = None) -> Figure:
    """One axis per (title, series) panel, side by side, one legend below for all of them.

    Panels whose values are never negative start at zero (just below it, so a flat line at
    zero shows), unless their title says `loss`."""
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    fig.patch.set_alpha(0.0)
    axes = fig.subplots(1, max(1, len(panels)), squeeze=False)[0]
    labels: list[str] = []
    for (title, series), ax in zip(panels, axes):
        _style(ax, ink)
        ax.set_title(title, fontsize=9, loc="left", color=ink)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True, nbins=5))
        top = 0.0
        negative = False
        for label, points in series.items():
            if label not in labels:
                labels.append(label)
            color = (colors or {}).get(label) or color_for(labels.index(label))
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            top = max([top, *ys])
            negative = negative or any(y < 0 for y in ys)
            ax.plot(xs, ys, color=color, linewidth=1.6, marker="o" if len(xs) < 12 else None,
                    markersize=3, label=label)
        if series and not negative and "loss" not in title:
            upper = max(0.05, top * 1.15)
            ax.set_ylim(-0.03 * upper, upper)  # a line at zero stays visible above the axis
        if series:
            right = max(p[0] for points in series.values() for p in points)
            ax.set_xlim(0, max(1.0, right) * 1.05)
        if not series:
            ax.text(0.5, 0.5, "no data yet", transform=ax.transAxes, ha="center", va="center",
                    color=ink, fontsize=9)
    if len(labels) > 1:
        handles = {}
        for ax in axes:
            for handle, label in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(label, handle)
        legend = fig.legend(list(handles.values()), list(handles), loc="outside lower center",
                            ncols=min(6, len(handles)), fontsize=8, frameon=False)
        for text in legend.get_texts():
            text.set_color(ink)
    return fig


def figure_svg(build: Any, *args: Any, **kwargs: Any) -> str:
    """Build a figure with placeholder ink and return it as theme-following inline SVG."""
    fig = build(*args, ink=_SVG_INK, **kwargs)
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", transparent=True)
    svg = buffer.getvalue()
    svg = svg[svg.find("<svg"):]  # drop the XML prolog and doctype: it is inlined in HTML
    return svg.replace(_SVG_INK, "currentColor")


class Chart:
    """A figure that displays itself in notebooks (as PNG) without pyplot."""

    def __init__(self, figure: Figure, dpi: int = 110):
        self.figure = figure
        self.dpi = dpi

    def png(self) -> bytes:
        buffer = io.BytesIO()
        self.figure.savefig(buffer, format="png", dpi=self.dpi, transparent=True)
        return buffer.getvalue()

    def _repr_png_(self) -> bytes:
        return self.png()

    def save(self, path: str | Path) -> Path:
        self.figure.savefig(path, dpi=self.dpi, transparent=True)
        return Path(path)


# ------------------------------------------------------------- trial curves
def step_series(steps: Sequence[Mapping[str, Any]], metric: str,
                phase: str | None = "rl") -> list[tuple[float, float]]:
    """(steps done, value) points: a step's metrics are plotted once it has run."""
    return [(float(s["step"]) + 1, float(s[metric])) for s in steps
            if (phase is None or s.get("phase") == phase) and s.get(metric) is not None]


def trial_panels(steps_by_trial: Mapping[str, Sequence[Mapping[str, Any]]]
                 ) -> list[tuple[str, Series]]:
    """Reward and accuracy per RL step (SFT loss too, when any trial warmed up)."""
    panels: list[tuple[str, Series]] = [
        ("mean reward (RL)", {t: step_series(s, "reward_mean") for t, s in steps_by_trial.items()
                            if step_series(s, "reward_mean")}),
        ("sample accuracy (RL)", {t: step_series(s, "accuracy") for t, s in steps_by_trial.items()
                                if step_series(s, "accuracy")}),
    ]
    sft = {t: step_series(s, "loss", "sft") or step_series(s, "loss_per_token", "sft")
           for t, s in steps_by_trial.items()}
    sft = {t: points for t, points in sft.items() if points}
    if sft:
        panels.append(("SFT loss per token", sft))
    return panels


def plot_trial(directory: str | Path, width: float = 8.0) -> Chart:
    """Curves of one trial from its record (works while it runs, and after)."""
    from autoresearch.rl.record import TrialRecord

    record = TrialRecord(directory)
    steps = record.of_type("step")
    panels = trial_panels({record.dir.name: steps})
    evals = [e for e in record.of_type("eval") if e.get("split") == "dev"]
    if evals:
        rl_steps = [s["step"] + 1 for s in steps if s.get("phase") == "rl"]
        end = float(max(rl_steps, default=0))
        points = [(float(e["stage"][3:]) if e["stage"].startswith("rl-") else end,
                   e["accuracy"]["value"]) for e in evals]
        panels.append(("dev accuracy", {record.dir.name: points}))
    return Chart(curves_figure(panels, width=width))


def plot_study(directory: str | Path, width: float = 9.0) -> Chart:
    """Curves of every trial of a study, from its journal."""
    from autoresearch.ui.snapshot import read_snapshot

    snapshot = read_snapshot(directory)
    if snapshot is None:
        raise FileNotFoundError(f"no study journal in {directory}")
    return Chart(curves_figure(trial_panels(snapshot.steps), width=width))


def components_figure(results: Mapping[str, Mapping[str, float]], title: str = "",
                      width: float = 8.0, ink: str = NEUTRAL_INK) -> Chart:
    """Reward components of several predictions as grouped horizontal bars."""
    fig = Figure(figsize=(width, 0.45 * max(3, len(results)) + 0.8), dpi=100,
                 layout="constrained")
    fig.patch.set_alpha(0.0)
    ax = fig.subplots()
    _style(ax, ink)
    labels = list(results)
    components = list(next(iter(results.values()), {}))
    height = 0.8 / max(1, len(components))
    for j, name in enumerate(components):
        ys = [i + j * height for i in range(len(labels))]
        ax.barh(ys, [results[label].get(name, 0.0) for label in labels], height=height,
                color=color_for(j), label=name)
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(labels))], labels)
    ax.invert_yaxis()
    if title:
        ax.set_title(title, fontsize=9, loc="left", color=ink)
    legend = ax.legend(fontsize=8, frameon=False, loc="lower right")
    for text in legend.get_texts():
        text.set_color(ink)
    return Chart(fig)
