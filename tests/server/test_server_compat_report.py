"""The SDK compatibility report, generated against a server on the tiny model.

The report must cover every public method of every client class the SDK exports, call the
supported ones for real, and never let a broken or unknown method pass as supported.
"""

from __future__ import annotations

import inspect
import os
import re
import threading
from pathlib import Path

import pytest
import tinker

from tests.server.server_helpers import API_KEY
from tools import compat_fields, compat_probes, compat_report
from tools.compat_fields import FieldStatus
from tools.compat_report import Status

SUPPORTED_FLOOR = 76
"""Measured on SDK 0.38.0: 76 of 107 methods reach the server and are supported (12 client-side,
19 unsupported by design)."""
MODEL_LABEL = "tiny random Gemma 3 (2 layers, the test suite's)"
"""The tiny model lives in a temporary directory; the report names it by what it is."""
COMMITTED = Path(__file__).resolve().parents[2] / "docs" / "tinker-compatibility.md"
UPDATE = "AUTORESEARCH_UPDATE_COMPAT_REPORT"
"""Set to 1 to rewrite the committed report from this run (then review the diff)."""

ROW = re.compile(
    r"^\| `(?P<method>\w+)`(?: \((?P<note>\w+)\))? \| (?P<status>[^|]+) \| (?P<detail>.*) \|$"
)


@pytest.fixture(scope="module")
def report_file(tiny_server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("compat") / "tinker-compatibility.md"
    compat_report.main(["--url", tiny_server.url, "--api-key", API_KEY, "--out", str(out),
                        "--timeout", "60", "--model-label", MODEL_LABEL])
    return out


@pytest.fixture(scope="module")
def rows(report_file: Path) -> dict[tuple[str, str], tuple[str, str]]:
    """(client, method) -> (status, detail), parsed back out of the Markdown tables."""
    parsed, client = {}, None
    for line in report_file.read_text().splitlines():
        if line.startswith("## "):
            client = line[3:].strip()
        elif client and (match := ROW.match(line)):
            parsed[(client, match["method"])] = (match["status"], match["detail"])
    return parsed


def _sdk_methods() -> set[tuple[str, str]]:
    methods = set()
    for name in dir(tinker):
        cls = getattr(tinker, name)
        if inspect.isclass(cls) and name.endswith("Client"):
            methods |= {(name, m) for m in dir(cls)
                        if not m.startswith("_") and callable(getattr(cls, m))}
    return methods


def test_report_has_a_row_for_every_public_method_of_every_sdk_client(rows):
    assert set(rows) == _sdk_methods()
    clients = {client for client, _ in rows}
    assert {"ServiceClient", "TrainingClient", "SamplingClient", "RestClient"} <= clients
    assert ("TrainingClient", "forward_backward_async") in rows


def test_no_method_fails_against_the_server(rows):
    failed = {f"{c}.{m}": detail for (c, m), (status, detail) in rows.items()
              if status == Status.FAILED.value}
    assert failed == {}


def test_every_supported_method_says_what_was_checked(rows):
    supported = {key: detail for key, (status, detail) in rows.items()
                 if status == Status.SUPPORTED.value}
    assert len(supported) >= SUPPORTED_FLOOR
    assert all(detail.strip() for detail in supported.values())
    for core in ["forward_backward", "optim_step", "save_state", "load_state"]:
        assert ("TrainingClient", core) in supported
    assert ("SamplingClient", "sample_async") in supported
    for export in [("TrainingClient", "save_weights_external"),
                   ("RestClient", "get_external_weights_urls")]:
        assert export in supported


def test_unsupported_methods_are_exactly_the_declared_ones_with_their_reasons(rows):
    unsupported = {key for key, (status, _) in rows.items()
                   if status == Status.UNSUPPORTED.value}
    declared = {(c, m) for c, m in rows
                if (c, compat_probes.family(m)) in compat_probes.UNSUPPORTED}
    assert unsupported == declared
    assert ("RestClient", "get_billing_usage") in unsupported


def test_summary_and_header_match_the_tables(report_file: Path, rows):
    text = report_file.read_text()
    assert compat_report.REGENERATE in text.splitlines()[0]
    assert f"`tinker` {tinker.__version__}" in text
    counts = {s: sum(status == s.value for status, _ in rows.values()) for s in Status}
    assert (f"**{counts[Status.SUPPORTED]} supported**, **{counts[Status.CLIENT_SIDE]} "
            f"client-side**, **{counts[Status.UNSUPPORTED]} unsupported by design**, "
            f"**{counts[Status.FAILED]} failed**") in text


class _FutureClient:
    def brand_new_method(self) -> None: ...


def test_a_method_the_report_does_not_know_is_reported_failed_not_supported():
    outcome = compat_report.classify(None, "FutureClient", _FutureClient, "brand_new_method", 1.0)
    assert outcome.status is Status.FAILED
    assert "no probe" in outcome.detail


def test_a_hanging_probe_is_reported_failed_within_its_timeout(monkeypatch):
    release = threading.Event()
    monkeypatch.setitem(compat_probes.PROBES, ("FutureClient", "brand_new_method"),
                        lambda ws, call: release.wait(30) and "never")
    try:
        outcome = compat_report.classify(None, "FutureClient", _FutureClient,
                                         "brand_new_method", 0.3)
    finally:
        release.set()
    # The probe returns only once released, after `classify` came back: a FAILED outcome
    # naming a timeout is the timeout at work, no clock needed.
    assert outcome.status is Status.FAILED
    assert "TimeoutError" in outcome.detail


def test_methods_the_sdk_answers_alone_are_client_side_not_supported(rows):
    """Telemetry accessors (None with telemetry off), the queue-state hook and answers the SDK
    caches (the base model's name, a run's info, the tokenizer) send no request: the server's
    request counter shows it, so they cannot count as supported."""
    client_side = {key for key, (status, _) in rows.items() if status == Status.CLIENT_SIDE.value}
    never_sent = {key for key in rows if key[1] in ("get_telemetry", "on_queue_state_change")}
    assert len(never_sent) == 6
    assert never_sent <= client_side
    assert ("TrainingClient", "forward_backward") not in client_side


def test_the_request_counter_sees_a_probe_that_reaches_the_server(tiny_server):
    before = compat_report.server_requests(tiny_server.url)
    tinker.ServiceClient(base_url=tiny_server.url, api_key=API_KEY).get_server_capabilities()
    assert compat_report.server_requests(tiny_server.url) > before


def test_the_committed_report_is_the_one_this_server_generates(report_file: Path):
    generated = report_file.read_text()
    if os.environ.get(UPDATE) == "1":
        COMMITTED.write_text(generated)
    assert COMMITTED.read_text() == generated, (
        f"docs/tinker-compatibility.md is out of date: rerun this file with {UPDATE}=1 and "
        "commit the result")


FIELD_ROW = re.compile(
    r"^\| (?P<type>\w+) \| `(?P<field>\w+)` \| (?P<status>[^|]+) \| (?P<detail>.*) \|$"
)


def test_every_request_field_is_served_refused_or_declared_and_none_failed(report_file: Path):
    """Every field of every request type and optimizer config the SDK has gets a row; the
    fields the server does not compute are refused with their name, checked through the SDK."""
    rows = {(m["type"], m["field"]): (m["status"], m["detail"])
            for line in report_file.read_text().splitlines() if (m := FIELD_ROW.match(line))}
    expected = {(name, field) for name, model in compat_fields.field_types().items()
                for field in compat_fields.field_names(model)}
    assert set(rows) == expected
    assert not {key: row for key, row in rows.items() if row[0] == FieldStatus.FAILED.value}
    for key in [("SampleRequest", "prompt_alt_tokens_k"),
                ("SampleRequest", "target_prompt_logprobs"),
                ("SampleRequest", "topk_sample_logprobs"),
                ("LoadWeightsRequest", "weights_access_token"),
                ("SaveWeightsForSamplerRequest", "kind")]:
        assert rows[key][0] == FieldStatus.REFUSED.value and key[1] in rows[key][1], key
    assert rows[("DimuonOptimizerConfig", "version")][0] == FieldStatus.SERVED.value


def test_a_field_the_report_does_not_know_is_failed_not_passed(monkeypatch):
    outcome = compat_fields.classify_field(None, "FutureRequest", "brand_new_field")
    assert outcome.status is FieldStatus.FAILED and "not declared" in outcome.detail
    monkeypatch.setitem(compat_fields.SERVED, ("FutureRequest", "x"),
                        ("made up", ("TrainingClient", "no_such_probe")))
    named = compat_fields.classify_field(None, "FutureRequest", "x")
    assert named.status is FieldStatus.FAILED and "does not exist" in named.detail
