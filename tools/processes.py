"""Child processes the tests and benchmarks start and wait for: one way to start a service
(`python -m server`, a worker, JupyterLab), wait until it answers, and stop it.

A service that exits before it answers raises with the end of its log, so a failed start
names its cause instead of timing out; `stop` terminates, then kills after a grace period.
`wait_until` is the one polling loop for conditions that have no event to wait on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType

import httpx

REPO = Path(__file__).resolve().parents[1]
HEALTH = "/api/v1/healthz"


def wait_until(predicate: Callable[[], bool], timeout: float = 30.0, what: str = "",
               interval: float = 0.01) -> None:
    """Poll `predicate` until it holds; `TimeoutError` naming `what` if it never does."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what or 'the condition'}")
        time.sleep(interval)


def http_status(url: str, timeout: float = 2.0, **params: str) -> int | None:
    """The status `url` answers with, or None if nothing answers."""
    try:
        return httpx.get(url, params=params or None, timeout=timeout).status_code
    except httpx.HTTPError:
        return None


def server_command(*args: str) -> list[str]:
    """`python -m server ARGS` with this interpreter."""
    return [sys.executable, "-m", "server", *args]


def without_api_keys(env: Mapping[str, str] | None = None, **extra: str) -> dict[str, str]:
    """The environment (default: this process's) without `AUTORESEARCH_API_KEYS`, so a server
    started from a shell that has keys set is still open unless the caller says otherwise."""
    base = dict(os.environ if env is None else env)
    base.pop("AUTORESEARCH_API_KEYS", None)
    return {**base, **extra}


class ServiceProcess:
    """One child process with its output in a log file, started by `start()` and always
    stopped by `stop()` (or the `with` block)."""

    def __init__(self, command: Sequence[str], log_path: Path, url: str = "",
                 env: Mapping[str, str] | None = None, cwd: Path = REPO) -> None:
        self.command, self.log_path, self.url = list(command), log_path, url
        self.env = dict(os.environ if env is None else env)
        self.cwd = cwd
        self.process: subprocess.Popen | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None, "not started"
        return self.process.pid

    def start(self) -> ServiceProcess:
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(self.command, cwd=self.cwd, env=self.env,
                                            stdout=log, stderr=subprocess.STDOUT)
        return self

    def exited(self) -> bool:
        return self.process is not None and self.process.poll() is not None

    def tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except FileNotFoundError:
            return ""

    def wait_answers(self, path: str = HEALTH, status: int = 200, timeout: float = 300.0,
                     **params: str) -> ServiceProcess:
        """Block until `url + path` answers `status`; raise with the log if the process exits
        first or the time runs out."""
        deadline = time.monotonic() + timeout
        while http_status(self.url + path, timeout=1.0, **params) != status:
            if self.exited():
                raise RuntimeError(f"{self.command[:3]} exited with {self.process.returncode}"
                                   f":\n{self.tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.url}{path} never answered {status}:\n{self.tail()}")
            time.sleep(0.05)
        return self

    def send(self, sig: signal.Signals) -> None:
        assert self.process is not None, "not started"
        self.process.send_signal(sig)
        if sig == signal.SIGKILL:
            self.process.wait(timeout=30)

    def stop(self, grace: float = 30.0) -> int | None:
        """Terminate (a stopped process is continued first, so it can), kill after `grace`
        seconds; the exit code, or None if it was never started."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        return self.process.returncode

    def __enter__(self) -> ServiceProcess:
        return self.start() if self.process is None else self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()
