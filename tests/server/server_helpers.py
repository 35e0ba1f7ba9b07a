"""Helpers shared by the server tests: the tiny model, servers, datums and engine probes.

Everything here drives the server the way a client does (through the `tinker` SDK), except
`EngineProbe`, which wraps the engine of an in-process server so a test can hold the engine
thread while it queues work, and see which batches the scheduler formed.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import tinker
from tinker import types

from tools.gemma_shapes import build_model
from tools.processes import ServiceProcess, server_command, wait_until, without_api_keys

NEEDS_REDIS = pytest.mark.skipif(
    shutil.which("redis-server") is None,
    reason="redis-server is not installed (apt-get install -y redis-server)",
)
"""For a test module that starts a real `redis-server` (distributed mode)."""

API_KEY = "tml-tests"
REPO_ROOT = Path(__file__).resolve().parents[2]


def build_tiny_model(directory: Path, corpus: list[str] | None = None,
                     max_position_embeddings: int = 512) -> Path:
    """Save a random 2-layer Gemma 3 and a byte-level BPE tokenizer of ~300 tokens."""
    return build_model(directory, "tiny", corpus, max_position_embeddings)


def start_server(model_dir: Path | None, data_dir: Path, **overrides):
    """An in-process server on a free port; the caller stops it."""
    from server.entrypoints.runtime import ServerConfig, ServerThread

    overrides.setdefault("api_keys", "")  # open: ignore AUTORESEARCH_API_KEYS from the shell
    # The suite's numerical references are float32 and must not depend on whether this CPU has
    # bf16 instructions; the bf16 default has tests of its own (test_server_bf16.py).
    overrides.setdefault("dtype", "float32")
    config = ServerConfig(model=None if model_dir is None else str(model_dir), port=0,
                          data_dir=data_dir, **overrides)
    return ServerThread(config).start()


class SubprocessServer(ServiceProcess):
    """`python -m server` in its own process, as an operator would run it."""

    def __init__(self, model_dir: Path, data_dir: Path, log_path: Path,
                 api_keys: str | None = None):
        from server.entrypoints.runtime import free_port

        self.port = free_port()
        keys = {"AUTORESEARCH_API_KEYS": api_keys} if api_keys else {}
        super().__init__(
            server_command("--model", str(model_dir), "--port", str(self.port), "--data-dir",
                           str(data_dir), "--dtype", "float32"),
            log_path, url=f"http://127.0.0.1:{self.port}", env=without_api_keys(**keys))
        self.start()

    def wait_healthy(self, timeout: float = 300.0) -> SubprocessServer:
        self.wait_answers(timeout=timeout)
        return self


def start_redis(directory: Path) -> tuple[subprocess.Popen, str]:
    """A throwaway `redis-server` on a free loopback port (no persistence); returns the
    process and its URL once it answers a ping."""
    import redis

    from server.entrypoints.runtime import free_port

    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(directory)],
        stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)

    def answers() -> bool:
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False

    try:
        wait_until(answers, 10, "redis-server to answer a ping", interval=0.05)
    except TimeoutError:
        process.kill()
        raise
    return process, url


# ------------------------------------------------------------------ data
def sft_datum(ids: list[int], weights: list[float] | None = None) -> types.Datum:
    """Next-token prediction on `ids` (weights default to 1 on every target)."""
    targets = ids[1:]
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={
            "target_tokens": targets,
            "weights": weights if weights is not None else [1.0] * len(targets),
        },
    )


def rl_datum(prompt: list[int], completion: list[int], sampled_lps: list[float],
             advantage: float) -> types.Datum:
    """A policy-gradient datum with one advantage on every completion token (the trial loop's
    own datum builder, so tests train on exactly what trials send)."""
    from autoresearch.rl.trial import rl_datum as trial_rl_datum

    return trial_rl_datum(prompt, completion, list(sampled_lps),
                          np.full(len(completion), advantage))


def output_logprobs(output: types.ForwardBackwardOutput) -> list[np.ndarray]:
    return [o["logprobs"].to_numpy().astype(np.float64) for o in output.loss_fn_outputs]


def forward_logprobs(client: tinker.TrainingClient, data: list[types.Datum]) -> list[np.ndarray]:
    """Per-datum target logprobs under the run's current weights (a forward-only pass)."""
    scoring = [
        types.Datum(
            model_input=d.model_input,
            loss_fn_inputs={
                "target_tokens": d.loss_fn_inputs["target_tokens"],
                "weights": [0.0] * d.model_input.length,
            },
        )
        for d in data
    ]
    return output_logprobs(client.forward(scoring, "cross_entropy").result())


def sft_step(client: tinker.TrainingClient, data: list[types.Datum], lr: float = 1e-2) -> float:
    """One cross-entropy step; returns the loss before the update."""
    fb = client.forward_backward(data, "cross_entropy")
    client.optim_step(types.AdamParams(learning_rate=lr)).result()
    return fb.result().metrics["loss:sum"]


def new_run(service: tinker.ServiceClient, base_model: str, seed: int = 0,
            rank: int = 8) -> tinker.TrainingClient:
    return service.create_lora_training_client(base_model=base_model, rank=rank,
                                               seed=seed).result()


# ---------------------------------------------------------------- probes
class EngineProbe:
    """Wraps an in-process server's `engine.forward_backward` and `engine.sample`.

    It records how many jobs each engine call carried (2+ forward_backward jobs means runs were
    fused into one batch; 2+ sample jobs means requests were decoded together) and, when armed,
    holds the engine thread inside the next forward_backward call until released, so a test
    can queue work and let the scheduler take all of it in one turn.
    """

    def __init__(self, engine):
        self.engine = engine
        self.calls: list[int] = []
        self.sample_calls: list[int] = []
        self._forward_backward: Callable = engine.forward_backward
        self._sample: Callable = engine.sample
        self._armed = False
        self._entered = threading.Event()
        self._release = threading.Event()
        engine.forward_backward = self._call
        engine.sample = self._call_sample

    def _call(self, jobs):
        if self._armed:
            self._armed = False
            self._entered.set()
            self._release.wait(timeout=60)
        self.calls.append(len(jobs))
        return self._forward_backward(jobs)

    def _call_sample(self, jobs):
        self.sample_calls.append(len(jobs))
        return self._sample(jobs)

    def arm(self) -> None:
        self._entered.clear()
        self._release.clear()
        self._armed = True

    def wait_held(self, timeout: float = 30.0) -> None:
        if not self._entered.wait(timeout):
            raise TimeoutError("the engine never reached the held call")

    def release(self) -> None:
        self._release.set()

    def restore(self) -> None:
        self._release.set()
        self.engine.forward_backward = self._forward_backward
        self.engine.sample = self._sample


def wait_queued(scheduler, expected: dict[str, int], timeout: float = 30.0) -> None:
    """Block until each queue has at least `expected[name]` requests waiting (a run id, or
    `_sampling` for sample requests)."""
    wait_until(lambda: all(scheduler.queue_depths().get(rid, 0) >= n
                           for rid, n in expected.items()),
               timeout, f"requests queued as {expected}")
