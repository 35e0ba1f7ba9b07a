"""Optional tracing of proposals and trials with Weave (W&B).

Tracing is on only when a project is named (the study's `tracing.project` or `$WEAVE_PROJECT`)
and `$WANDB_API_KEY` is set. Otherwise nothing is imported, nothing is attempted and nothing is
printed. When it is configured but cannot start (weave not installed, no network), the study
runs untraced and says so once per process, not once per call.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)
F = TypeVar("F", bound=Callable[..., Any])
_warned: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _warned:
        _warned.add(message)
        log.warning(message)


def configured_project(project: str | None = None) -> str | None:
    """The Weave project to trace to, or None when tracing is not configured."""
    project = project or os.environ.get("WEAVE_PROJECT")
    if not project or not os.environ.get("WANDB_API_KEY"):
        return None
    return project


class Tracer:
    def __init__(self, project: str | None = None):
        self.project = configured_project(project)
        self._weave: Any = None
        if self.project is None:
            return
        try:
            import weave

            weave.init(self.project)
            self._weave = weave
        except Exception as exc:  # noqa: BLE001 - tracing must never stop a study
            _warn_once(f"Weave tracing to {self.project!r} is configured but could not start "
                       f"({type(exc).__name__}: {exc}); continuing without tracing")

    @property
    def enabled(self) -> bool:
        return self._weave is not None

    def op(self, name: str, fn: F) -> F:
        """`fn`, traced as a Weave op named `name` when tracing is on."""
        if self._weave is None:
            return fn
        try:
            return self._weave.op(name=name)(fn)
        except Exception as exc:  # noqa: BLE001
            _warn_once(f"Weave could not trace {name!r} ({exc}); continuing without tracing")
            return fn
