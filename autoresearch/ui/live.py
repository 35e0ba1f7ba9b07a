"""Running a study in this notebook's process and steering it: `LiveStudy`, `embedded_server`.

    live = LiveStudy(study, "runs/studies/demo").start()   # runs in a background thread
    live.pause(); live.resume(); live.stop_trial("t0002"); live.stop()
    outcome = live.wait()
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autoresearch.study.control import ControlledExecutor, ControlledProposer, StudyControl
from autoresearch.study.executors.base import Executor
from autoresearch.study.spec import Study
from autoresearch.ui.snapshot import StudySnapshot, read_snapshot


# ------------------------------------------------------------ running
class LiveStudy:
    """Runs a study in a background thread of this process, steerable through its control file.

    Without a server URL (argument, the study's, or $TINKER_BASE_URL) it starts the embedded
    training server and keeps it up after the study ends (`server_url` stays valid for sampling
    from checkpoints) until `close()`.
    """

    def __init__(self, study: Study, output_dir: str | Path | None = None,
                 server_url: str | None = None, api_key: str | None = None,
                 executor: Executor | None = None):
        self.study = study
        self.directory = Path(output_dir or study.directory())
        self.control = StudyControl(self.directory)
        self.server_url = server_url or study.resolved_server_url()
        self.api_key = api_key
        self._executor = executor
        self._stack = contextlib.ExitStack()
        self._thread: threading.Thread | None = None
        self._outcome: Any = None
        self._error: BaseException | None = None

    # ---------------------------------------------------------- lifecycle
    def start(self) -> LiveStudy:
        from autoresearch.study.proposers import make_proposer
        from autoresearch.study.runner import StudyRunner

        if self._thread is not None:
            raise RuntimeError("this study is already running")
        self.control.reset()
        executor = ControlledExecutor(self._executor or self._own_executor(), self.control)
        proposer = ControlledProposer(make_proposer(self.study.proposer, self.study.seed),
                                      self.control)
        runner = StudyRunner(self.study, self.directory, executor, proposer)
        self._thread = threading.Thread(target=self._run, args=(runner,), name="study",
                                        daemon=True)
        self._thread.start()
        return self

    def _own_executor(self) -> Executor:
        import os

        from autoresearch.study.executors.local import LocalExecutor
        from rewards import RewardPool

        if self.study.executor.kind == "kubernetes":
            from autoresearch.study.executors.kubernetes import KubernetesExecutor

            executor = KubernetesExecutor(self.study.name, self.study.executor, self.server_url)
            self._stack.callback(executor.close)
            return executor
        if self.server_url is None:
            from server.entrypoints.runtime import ServerConfig, ServerThread

            server = ServerThread(ServerConfig(model=self.study.embedded_model, port=0,
                                               data_dir=self.directory / "server-data",
                                               api_keys=""))
            self.server_url = self._stack.enter_context(server).url
        pool = self._stack.enter_context(RewardPool(workers=self.study.reward_workers))
        key = self.api_key or os.environ.get("TINKER_API_KEY") or "tml-local"
        self.api_key = key
        return LocalExecutor(self.server_url, key, pool)

    def _run(self, runner: Any) -> None:
        try:
            self._outcome = runner.run()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
            self._error = exc

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> Any:
        """Block until the study ends; its `StudyOutcome` (or its exception, raised here)."""
        if self._thread is None:
            raise RuntimeError("the study was not started")
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"the study is still running after {timeout}s")
        if self._error is not None:
            raise self._error
        return self._outcome

    def close(self) -> None:
        """Stop the embedded server and scoring workers (after the study has ended)."""
        if self.running:
            self.stop()
            self._thread.join()
        self._stack.close()

    def __enter__(self) -> LiveStudy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ steering
    def pause(self) -> None:
        self.control.pause()

    def resume(self) -> None:
        self.control.resume()

    def stop(self) -> None:
        self.control.stop()

    def stop_trial(self, trial_id: str) -> None:
        self.control.stop_trial(trial_id)

    def snapshot(self) -> StudySnapshot | None:
        return read_snapshot(self.directory)

    def dashboard(self, **options: Any):
        """A live dashboard of this study (needs ipywidgets)."""
        from autoresearch.ui.widgets import StudyDashboard

        return StudyDashboard(self.directory, server_url=self.server_url, control=self.control,
                              live=self, **options)


@contextlib.contextmanager
def embedded_server(model: str | None = None, data_dir: str | Path = "runs/server-data",
                    **options: Any) -> Iterator[Any]:
    """The embedded training server for the duration of a `with` block (notebooks)."""
    from server.entrypoints.runtime import ServerConfig, ServerThread

    options.setdefault("api_keys", "")
    with ServerThread(ServerConfig(model=model, port=0, data_dir=Path(data_dir),
                                   **options)) as server:
        yield server
