"""A stand-in for the Kubernetes API server: the few endpoints the study's Kubernetes executor
uses.

Jobs (create, get, list, delete) and Pods (list, read log) in any namespace, over real HTTP, so
the official `kubernetes` client is exercised unchanged. A created Job "runs" on a background
thread: after `run_seconds`, `behaviour(job)` runs it (the unit tests answer at once; the
rehearsal runs the Job's pod as a local process) and says whether it succeeded and what its log
says; then a pod with the Job's pod-template labels appears, finished.
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

Behaviour = Callable[[dict[str, Any]], tuple[bool, str]]

JOB = re.compile(r"^/apis/batch/v1/namespaces/([^/]+)/jobs(?:/([^/]+))?$")
PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods$")
LOG = re.compile(r"^/api/v1/namespaces/([^/]+)/pods/([^/]+)/log$")


def _matches(labels: dict[str, str], selector: str | None) -> bool:
    if not selector:
        return True
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


class FakeKube:
    def __init__(self, behaviour: Behaviour, run_seconds: float = 0.2):
        self.behaviour = behaviour
        self.run_seconds = run_seconds
        self.jobs: dict[tuple[str, str], dict[str, Any]] = {}
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.logs: dict[tuple[str, str], str] = {}
        self.created: list[str] = []
        self.create_attempts: list[str] = []
        self.deleted: list[str] = []
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: Any, content_type: str = "application/json"):
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _status(self, code: int, reason: str, message: str) -> None:
                self._send(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                  "reason": reason, "message": message, "code": code})

            def do_POST(self) -> None:  # noqa: N802
                match = JOB.match(urlparse(self.path).path)
                if not match or match.group(2):
                    return self._status(404, "NotFound", self.path)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                key = (match.group(1), body["metadata"]["name"])
                with fake.lock:
                    fake.create_attempts.append(key[1])
                    if key in fake.jobs:
                        return self._status(409, "AlreadyExists", f"jobs {key[1]} exists")
                    body["metadata"]["namespace"] = key[0]
                    body["metadata"]["uid"] = f"uid-{len(fake.created)}"
                    body["status"] = {"active": 1}
                    fake.jobs[key] = body
                    fake.created.append(key[1])
                threading.Thread(target=fake._run, args=(key,), daemon=True).start()
                self._send(201, body)

            def do_GET(self) -> None:  # noqa: N802
                url = urlparse(self.path)
                selector = parse_qs(url.query).get("labelSelector", [None])[0]
                with fake.lock:
                    if match := JOB.match(url.path):
                        ns, name = match.groups()
                        if name:
                            job = fake.jobs.get((ns, name))
                            if job is None:
                                return self._status(404, "NotFound", f"jobs {name} not found")
                            return self._send(200, job)
                        items = [j for (n, _), j in fake.jobs.items() if n == ns
                                 and _matches(j["metadata"].get("labels", {}), selector)]
                        return self._send(200, {"kind": "JobList", "apiVersion": "batch/v1",
                                                "metadata": {}, "items": items})
                    if match := PODS.match(url.path):
                        items = [p for (n, _), p in fake.pods.items() if n == match.group(1)
                                 and _matches(p["metadata"]["labels"], selector)]
                        return self._send(200, {"kind": "PodList", "apiVersion": "v1",
                                                "metadata": {}, "items": items})
                    if match := LOG.match(url.path):
                        text = fake.logs.get(match.groups())
                        if text is None:
                            return self._status(404, "NotFound", "no such pod")
                        return self._send(200, text, "text/plain")
                self._status(404, "NotFound", self.path)

            def do_DELETE(self) -> None:  # noqa: N802
                match = JOB.match(urlparse(self.path).path)
                with fake.lock:
                    if not match or (match.group(1), match.group(2)) not in fake.jobs:
                        return self._status(404, "NotFound", self.path)
                    fake.jobs.pop((match.group(1), match.group(2)))
                    fake.deleted.append(match.group(2))
                self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def _run(self, key: tuple[str, str]) -> None:
        time.sleep(self.run_seconds)
        with self.lock:
            job = self.jobs.get(key)
        if job is None:
            return
        ok, log = self.behaviour(job)
        pod_name = f"{key[1]}-x7k2p"
        labels = dict(job["spec"]["template"]["metadata"].get("labels", {}))
        labels["job-name"] = key[1]
        with self.lock:
            self.pods[(key[0], pod_name)] = {
                "kind": "Pod", "apiVersion": "v1",
                "metadata": {"name": pod_name, "namespace": key[0], "labels": labels},
                "status": {"phase": "Succeeded" if ok else "Failed"}}
            self.logs[(key[0], pod_name)] = log
            job["status"] = ({"succeeded": 1} if ok else {
                "failed": 1, "conditions": [{"type": "Failed", "status": "True",
                                             "reason": "BackoffLimitExceeded"}]})

    def kubeconfig(self, namespace: str = "autoresearch") -> dict[str, Any]:
        return {"apiVersion": "v1", "kind": "Config", "current-context": "fake",
                "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                "users": [{"name": "fake", "user": {"token": "fake-token"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake",
                                                          "namespace": namespace}}]}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
