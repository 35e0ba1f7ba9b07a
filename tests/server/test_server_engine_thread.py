"""An engine's host work happens on one thread: its model's loading, then the loop driving it.

Every thread that runs torch's parallel CPU kernels keeps an OpenMP team of its own, and more
teams' threads than cores make libgomp's workers sleep after every parallel region
(`server.engine.engine_thread`). These tests pin the mechanism: the thread that loads a
server's model is the one its scheduler's jobs run on, for the single-process server and for
the split deployment's trainer and torch sampler.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from server.engine.engine_thread import EngineThread, on_own_thread
from tests.server.server_helpers import API_KEY, new_run, sft_datum, sft_step, start_server


def _fail(message: str) -> None:
    raise ValueError(message)


def test_a_call_runs_on_the_thread_and_hands_back_its_result_or_its_error() -> None:
    thread = EngineThread("calls")
    assert thread.call(threading.get_ident) == thread.ident != threading.get_ident()
    assert thread.call(lambda a, b=0: a + b, 2, b=3) == 5
    with pytest.raises(ValueError, match="from the thread"):
        thread.call(_fail, "from the thread")
    stop = threading.Event()
    assert thread.run_loop(stop.wait) is thread
    with pytest.raises(RuntimeError, match="already runs its loop"):
        thread.call(int)
    with pytest.raises(RuntimeError, match="already runs a loop"):
        thread.run_loop(stop.wait)
    assert thread.is_alive()
    stop.set()
    thread.join(5)
    assert not thread.is_alive()


def test_a_build_that_fails_raises_in_the_caller_and_ends_its_thread() -> None:
    with pytest.raises(ValueError, match="no such model"):
        on_own_thread(lambda: _fail("no such model"), name="doomed-engine")
    deadline = time.monotonic() + 5
    while any(t.name == "doomed-engine" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "the failed build's thread is still alive"
        time.sleep(0.01)


def test_a_server_trains_on_the_thread_that_loaded_its_model(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tinker

    from server.entrypoints import runtime

    loaded_on: list[int] = []
    load = runtime.load_base_model

    def recording_load(*args, **kwargs):
        loaded_on.append(threading.get_ident())
        return load(*args, **kwargs)

    monkeypatch.setattr(runtime, "load_base_model", recording_load)
    server = start_server(tiny_model_dir, tmp_path)
    try:
        engine = server.service.engine
        trained_on: list[int] = []
        forward_backward = engine.forward_backward

        def recording_forward_backward(jobs):
            trained_on.append(threading.get_ident())
            return forward_backward(jobs)

        engine.forward_backward = recording_forward_backward
        with tinker.ServiceClient(base_url=server.url, api_key=API_KEY) as service:
            training = new_run(service, str(tiny_model_dir))
            sft_step(training, [sft_datum([5, 6, 7, 8, 9])])
        assert loaded_on == [engine.thread.ident] and loaded_on[0] != threading.get_ident()
        assert trained_on == loaded_on
        assert server.service.scheduler.stalled_seconds() == 0.0  # its loop is alive there
    finally:
        server.stop()
    engine.thread.join(10)
    assert not engine.thread.is_alive(), "the engine thread outlived its stopped scheduler"


@pytest.mark.parametrize("role", ["trainer", "sampler"])
def test_a_split_role_serves_its_model_under_the_configured_name(
    role: str, tiny_model_dir: Path
) -> None:
    """`--model DIR --model-name org/name` names the model for the split roles too (they once
    built their engines without the rename, so a trainer refused clients asking for org/name)."""
    from server.entrypoints.args import config_from_args
    from server.entrypoints.roles import role_parser
    from server.entrypoints.runtime import build_engine

    args = role_parser(role).parse_args([
        "--redis-url", "redis://127.0.0.1:1/0", "--model", str(tiny_model_dir), "--model-name",
        "tiny-org/tiny-gemma3", "--device", "cpu", "--dtype", "float32"])
    engine = build_engine(config_from_args(args), thread_name=f"{role}-engine")
    assert engine.model_name == "tiny-org/tiny-gemma3"
    assert engine.thread is not None and engine.thread.ident != threading.get_ident()
    assert any(t.name == f"{role}-engine" for t in threading.enumerate())
    engine.thread.run_loop(lambda: None)  # a loop that returns ends the thread
    engine.thread.join(10)
    assert not engine.thread.is_alive()
