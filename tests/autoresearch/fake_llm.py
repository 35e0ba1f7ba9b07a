"""Fake LLM endpoints for the proposer tests: scripted answers through the real SDKs.

`FakeGemini` is a local HTTP server speaking the Gemini API's `generateContent`, which
`google-genai` reaches through `http_options.base_url`. `openai_transport` is an
`httpx.MockTransport` for the `openai` SDK's `http_client`. Both replay a script of answers
(a JSON text, or `SLOW`) and keep every request. A `SLOW` answer never comes: the Gemini fake
holds the request until it is closed, and the transport raises the client's own timeout, so a
client returns only if its timeout works, with no clock in the test.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

SLOW = object()


class Script:
    def __init__(self, answers: list[Any]):
        self.answers = list(answers)
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []

    def next(self, body: dict[str, Any], headers: dict[str, str]) -> Any:
        self.requests.append(body)
        self.headers.append(headers)
        return self.answers.pop(0) if self.answers else SLOW


class FakeGemini:
    def __init__(self, script: Script):
        self.script = script
        self.released = threading.Event()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                body["_path"] = self.path
                answer = fake.script.next(body, dict(self.headers))
                if answer is SLOW:
                    fake.released.wait(120)  # past any client timeout: no answer
                    return
                payload = {"candidates": [{"content": {"role": "model",
                                                       "parts": [{"text": answer}]},
                                           "finishReason": "STOP"}]}
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.released.set()
        self.server.shutdown()
        self.server.server_close()


def openai_transport(script: Script) -> httpx.MockTransport:
    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        answer = script.next(body, dict(request.headers))
        if answer is SLOW:
            raise httpx.ReadTimeout("timed out", request=request)
        return httpx.Response(200, json={
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0,
            "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": answer}}],
        })

    return httpx.MockTransport(handler)
