"""Which `tinker` SDK methods this server supports, measured against a running server.

The method list is not written by hand: every public callable of every `*Client` class that
`tinker` exports is enumerated by introspection. Each method is then either

- *probed*: called against the server (sync variants with `.result()`, `*_async` variants awaited
  under asyncio, both through the same checker in `tools.compat_probes`) and its answer checked
  for meaning: lengths, finiteness, round trips, state that changes or is restored. It counts as
  supported only if the server saw an API request during the probe (its
  `autoresearch_api_requests_total` counter, background heartbeats left out); a method that
  checks out without one is *client-side*, reported apart and not counted as supported;
- *unsupported by design*: a hosted-service feature with no self-hosted counterpart, listed with
  the reason in `tools.compat_probes.UNSUPPORTED`;
- or *failed*: the probe raised, timed out, or an answer did not check out.

A method that is neither probed nor declared unsupported is reported as failed, so a new SDK
method never slips through. Every probe runs on its own thread with a deadline: one hung call
cannot stop the report.

    python -m tools.compat_report --out docs/tinker-compatibility.md [--url URL --api-key KEY]

Without `--url` the report starts an in-process server (`ServerThread`) on the packaged Gemma 3
270M, or on `--model DIR`, with a throwaway data directory. The Hugging Face Hub is not consulted
(`HF_HUB_OFFLINE=1` unless the environment says otherwise).
"""

from __future__ import annotations

import argparse
import enum
import inspect
import logging
import os
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tinker

from tools.compat_fields import FieldOutcome, FieldStatus, field_outcomes
from tools.compat_probes import PROBES, UNSUPPORTED, Call, Workspace, family
from tools.scrape import scrape

log = logging.getLogger(__name__)

REGENERATE = "python -m tools.compat_report --out docs/tinker-compatibility.md"
BACKGROUND_ROUTES = ("/api/v1/session_heartbeat", "/api/v1/client/dynamic_config")
"""Routes the SDK calls on its own timers: a request there says nothing about the probe."""
DEFAULT_API_KEY = "tml-compat-report"


class Status(enum.StrEnum):
    SUPPORTED = "supported"
    """Called, its answer checked, and the server saw the request."""
    CLIENT_SIDE = "client-side"
    """Called and checked, but it sent the server nothing: the SDK answers it alone."""
    UNSUPPORTED = "unsupported by design"
    """A hosted-service feature with no self-hosted counterpart."""
    FAILED = "failed"
    """Raised, timed out, or answered something that did not check out."""


@dataclass
class Outcome:
    client: str
    method: str
    status: Status
    detail: str
    note: str = ""
    """"deprecated" or "experimental" when the SDK marks the method so."""
    seconds: float = 0.0


@dataclass
class Report:
    sdk_version: str
    server_url: str
    base_model: str
    requests_counted: bool
    """Whether the server exposes its API request counter (this server's `/metrics` does); if
    not, probed methods count as supported without proof that they reached it."""
    outcomes: list[Outcome] = field(default_factory=list)
    fields: list[FieldOutcome] = field(default_factory=list)
    """Every field of every request type and optimizer config (`tools.compat_fields`)."""
    seconds: float = 0.0

    def count(self, status: Status) -> int:
        return sum(o.status is status for o in self.outcomes)


# ----------------------------------------------------------------------------- enumeration
def client_classes() -> dict[str, type]:
    """Every public client class the SDK exports (ServiceClient, TrainingClient, ...)."""
    names = getattr(tinker, "__all__", None) or dir(tinker)
    found = {}
    for name in sorted(names):
        obj = getattr(tinker, name, None)
        if inspect.isclass(obj) and name.endswith("Client") and not name.startswith("_"):
            found[name] = obj
    return found


def public_methods(cls: type) -> list[str]:
    """Public callable attributes, `*_async` variants included; properties are not methods."""
    return sorted(
        name for name in dir(cls) if not name.startswith("_") and callable(getattr(cls, name, None))
    )


def sdk_note(cls: type, method: str) -> str:
    """What the SDK's own `@deprecated` / `@experimental` markers say about `method`."""
    marker = str(getattr(getattr(cls, method), "__deprecated__", "") or "")
    if marker.upper().startswith("DEPRECATED"):
        return "deprecated"
    return "experimental" if "experimental" in marker.lower() else ""


def _run_with_deadline(
    fn: Callable[[], str], timeout: float
) -> tuple[str | None, BaseException | None]:
    """Run `fn` on a daemon thread; a call that never returns is abandoned, not waited for."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - reported, never re-raised
            box["error"] = exc

    thread = threading.Thread(target=target, name="compat-probe", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        return None, TimeoutError(f"no answer within {timeout:.0f} s")
    return box.get("value"), box.get("error")


# ---------------------------------------------------------------------------------- report
def run_report(url: str, api_key: str = DEFAULT_API_KEY, timeout: float = 120.0,
               model_label: str | None = None) -> Report:
    """Probe every public SDK client method against the server at `url`; `model_label` names
    the model in the report instead of the server's own name for it (a temporary path, say)."""
    os.environ.setdefault("TINKER_TELEMETRY", "0")
    started = time.perf_counter()
    ws = Workspace(url, api_key, timeout)
    report = Report(
        sdk_version=getattr(tinker, "__version__", "unknown"),
        server_url=url,
        base_model=model_label or ws.base_model,
        requests_counted=server_requests(url) is not None,
    )
    counter = (lambda: server_requests(url)) if report.requests_counted else None
    try:
        for client, cls in client_classes().items():
            for method in public_methods(cls):
                report.outcomes.append(classify(ws, client, cls, method, timeout, counter))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            report.fields = field_outcomes(ws)
    finally:
        try:
            ws.close()
        except Exception:  # noqa: BLE001 - the report is already complete
            log.warning("closing the report's session failed", exc_info=True)
    report.seconds = time.perf_counter() - started
    return report


def server_requests(url: str) -> int | None:
    """API requests the server has received so far, background routes left out; None when the
    server does not expose `autoresearch_api_requests_total`."""
    counted = [s for s in scrape(url) or [] if s.name == "autoresearch_api_requests_total"]
    if not counted:
        return None
    return int(sum(s.value for s in counted if s.labels.get("route") not in BACKGROUND_ROUTES))


def classify(ws: Workspace, client: str, cls: type, method: str, timeout: float,
             requests: Callable[[], int | None] | None = None) -> Outcome:
    """Declared unsupported, or probed under a deadline; never raises. With `requests` (the
    server's request count), a probe that sent nothing is client-side, not supported."""
    note = sdk_note(cls, method)
    reason = UNSUPPORTED.get((client, family(method)))
    if reason is not None:
        return Outcome(client, method, Status.UNSUPPORTED, reason, note)
    check = PROBES.get((client, family(method)))
    if check is None:
        return Outcome(
            client,
            method,
            Status.FAILED,
            "no probe: a method this report does not know yet (new in the SDK?)",
            note,
        )
    call = Call(method, timeout)
    before = requests() if requests else None
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        detail, error = _run_with_deadline(lambda: check(ws, call), timeout)
    seconds = time.perf_counter() - started
    if error is not None:
        message = " ".join(str(error).split())[:300] or type(error).__name__
        log.info("%s.%s failed: %s", client, method, message)
        return Outcome(
            client, method, Status.FAILED, f"{type(error).__name__}: {message}", note, seconds
        )
    after = requests() if requests else None
    if before is not None and after is not None and after == before:
        return Outcome(client, method, Status.CLIENT_SIDE, detail or "", note, seconds)
    return Outcome(client, method, Status.SUPPORTED, detail or "", note, seconds)


def render(report: Report) -> str:
    """The report as Markdown: a summary, then one table per client."""
    supported, client_side, unsupported, failed = (report.count(s) for s in Status)
    counted = (
        "the server's API request counter was read around every probe"
        if report.requests_counted
        else "this server exposes no API request counter, so supported rows are not proven to "
        "have reached it"
    )
    lines = [
        f"<!-- Generated by `{REGENERATE}`. Do not edit by hand. -->",
        "",
        "# Tinker SDK compatibility",
        "",
        f"Generated file: regenerate with `{REGENERATE}`.",
        "",
        f"- SDK: `tinker` {report.sdk_version}",
        f"- Server model: `{report.base_model}`",
        f"- Methods: {len(report.outcomes)} public methods of "
        f"{len({o.client for o in report.outcomes})} client classes, found by introspection",
        f"- Summary: **{supported} supported**, **{client_side} client-side**, "
        f"**{unsupported} unsupported by design**, **{failed} failed**",
        f"- Request fields: {len(report.fields)} fields of "
        f"{len({f.type_name for f in report.fields})} request types and optimizer configs, "
        "found by introspection: " + ", ".join(
            f"**{sum(f.status is s for f in report.fields)} {s.value}**" for s in FieldStatus),
        "",
        "*Supported* means the method was called against the server, the server received the "
        f"request ({counted}), and its answer was checked as described per row; `*_async` "
        "variants run the same checks under asyncio. *Client-side* methods were called and "
        "checked but send the server nothing (the SDK answers them alone), so they say nothing "
        "about the server and are not counted as supported. *Unsupported by design* means a "
        "hosted-service feature with no self-hosted counterpart. *Failed* rows carry the error.",
        "",
        "| Client | Supported | Client-side | Unsupported by design | Failed |",
        "|---|---|---|---|---|",
    ]
    clients = list(dict.fromkeys(o.client for o in report.outcomes))
    for client in clients:
        rows = [o for o in report.outcomes if o.client == client]
        counts = [sum(o.status is s for o in rows) for s in Status]
        lines.append(f"| {client} | " + " | ".join(str(c) for c in counts) + " |")
    for client in clients:
        lines += ["", f"## {client}", "", "| Method | Status | Checked / reason |", "|---|---|---|"]
        for o in (o for o in report.outcomes if o.client == client):
            method = f"`{o.method}`" + (f" ({o.note})" if o.note else "")
            detail = o.detail.replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {method} | {o.status.value} | {detail} |")
    lines += render_fields(report.fields)
    return "\n".join(lines) + "\n"


def render_fields(fields: list[FieldOutcome]) -> list[str]:
    """The request fields section: one row per field of every request type and config."""
    lines = [
        "", "## Request fields and optimizer configs", "",
        "Every field of every request model, optimizer config and parameter set in "
        "`tinker.types`. *Served* fields name the method probe above that exercises them; "
        "*refused by name* fields were sent through the SDK and answered with a 400 that names "
        "them; *never sent* types were checked against the server's client configuration (or "
        "the SDK's own modules); *protocol* fields are the SDK's plumbing; *no effect* fields "
        "are accepted and recorded nowhere, for the reason given.",
        "", "| Type | Field | Status | What the server does / how it was checked |",
        "|---|---|---|---|",
    ]
    for f in fields:
        detail = f.detail.replace("|", "\\|").replace("\n", " ")
        lines.append(f"| {f.type_name} | `{f.field}` | {f.status.value} | {detail} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.compat_report",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, required=True, help="Markdown file to write")
    parser.add_argument("--url", help="a running server; default: start one in-process")
    parser.add_argument("--api-key", help=f"default: $TINKER_API_KEY or {DEFAULT_API_KEY}")
    parser.add_argument("--model", help="model for the in-process server (default: packaged Gemma)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per method")
    parser.add_argument("--model-label", help="how the report names the server's model")
    args = parser.parse_args(argv)
    api_key = args.api_key or os.environ.get("TINKER_API_KEY") or DEFAULT_API_KEY
    # Tokenizers and models come from local directories; never sit in Hub retries (unless asked).
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with _quiet_sdk_logs():
        if args.url:
            report = run_report(args.url, api_key, args.timeout, args.model_label)
        else:
            report = _report_in_process(args.model, api_key, args.timeout, args.model_label)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(render(report))
    print(
        f"{args.out}: {report.count(Status.SUPPORTED)} supported, "
        f"{report.count(Status.CLIENT_SIDE)} client-side, "
        f"{report.count(Status.UNSUPPORTED)} unsupported by design, "
        f"{report.count(Status.FAILED)} failed ({report.seconds:.0f} s)"
    )
    for o in report.outcomes:
        if o.status is Status.FAILED:
            print(f"  failed: {o.client}.{o.method}: {o.detail}")
    for f in report.fields:
        if f.status is FieldStatus.FAILED:
            print(f"  failed field: {f.type_name}.{f.field}: {f.detail}")
    slowest = sorted(report.outcomes, key=lambda o: -o.seconds)[:5]
    print("  slowest: " + ", ".join(f"{o.client}.{o.method} {o.seconds:.1f} s" for o in slowest))
    return 0


@contextmanager
def _quiet_sdk_logs() -> Iterator[None]:
    """Keep the SDK's deprecation notices, which the probes provoke on purpose, off the console."""
    sdk_log = logging.getLogger("tinker")
    handler, propagate = logging.NullHandler(), sdk_log.propagate
    sdk_log.addHandler(handler)
    sdk_log.propagate = False
    try:
        yield
    finally:
        sdk_log.propagate = propagate
        sdk_log.removeHandler(handler)


def _report_in_process(model: str | None, api_key: str, timeout: float,
                       model_label: str | None) -> Report:
    from server.entrypoints.runtime import ServerConfig, ServerThread

    with tempfile.TemporaryDirectory(prefix="compat-report-") as data_dir:
        config = ServerConfig(model=model, port=0, data_dir=Path(data_dir), api_keys="")
        with ServerThread(config) as server:
            return run_report(server.url, api_key, timeout, model_label)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    raise SystemExit(main())
