"""A client that sends its request slowly cannot hold a connection open: headers and bodies
each have a deadline, after which the connection is closed (headers) or answered 408 (body),
and the server goes on serving everyone else."""

from __future__ import annotations

import socket
from urllib.parse import urlparse

import httpx
import pytest

import server.api.http_body as http_body
from server.api.http_protocol import HeaderTimeoutProtocol
from tests.server.server_helpers import API_KEY, start_server


@pytest.fixture
def quick_deadlines(monkeypatch):
    monkeypatch.setattr(HeaderTimeoutProtocol, "header_timeout", 0.5)
    monkeypatch.setattr(http_body, "BODY_READ_SECONDS", 0.5)


@pytest.fixture
def server(tiny_model_dir, tmp_path, quick_deadlines):
    server = start_server(tiny_model_dir, tmp_path / "data")
    yield server
    server.stop()


def _connect(url: str) -> socket.socket:
    parsed = urlparse(url)
    conn = socket.create_connection((parsed.hostname, parsed.port), timeout=30)
    return conn


def test_a_request_whose_headers_never_finish_is_closed(server):
    conn = _connect(server.url)
    conn.sendall(b"POST /api/v1/healthz HTTP/1.1\r\nHost: x\r\n")  # no blank line: never ends
    assert conn.recv(1024) == b""  # closed by the server, not by this socket's 30 s timeout
    conn.close()
    assert httpx.get(server.url + "/api/v1/healthz", timeout=10).status_code == 200


def test_a_body_that_never_finishes_is_answered_408(server):
    conn = _connect(server.url)
    conn.sendall(b"POST /api/v1/create_session HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/json\r\nContent-Length: 1000\r\n"
                 b"X-API-Key: " + API_KEY.encode() + b"\r\n\r\n{\"tags\":")
    answer = conn.recv(4096)
    conn.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
    assert httpx.get(server.url + "/api/v1/healthz", timeout=10).status_code == 200
