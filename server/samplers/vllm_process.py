"""The `vllm serve` command this backend needs, and a process wrapper that starts and stops it.

The flags, and why each is needed:

- `--enable-lora --max-loras N --max-lora-rank R`: multi-LoRA serving. N adapters share one
  batch on the GPU; R must be at least the rank of every adapter sampled (vLLM accepts 8, 16,
  32, 64, 128, 256, 320 and 512). `--max-cpu-loras` sizes vLLM's own host-side cache.
- env `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`: enables `/v1/load_lora_adapter` and
  `/v1/unload_lora_adapter`, through which new adapter versions are hot-loaded.
- `--logprobs-mode processed_logprobs`: logprobs under the tempered distribution, as Tinker
  reports them (see `server.samplers.semantics`); the sampler checks this at start-up.
- `--max-logprobs`: the largest top-k of logprobs a request may ask for (default 20).
- `--served-model-name`: the name base-model requests use; the training server's model name.
- `--generation-config vllm`: ignore the model's generation_config.json sampling defaults
  (Gemma's ship top_k=64, top_p=0.95); the sampler sends every parameter anyway.
- env `VLLM_BATCH_INVARIANT=1` (unless `batch_invariant=False`): vLLM's batch-invariant
  kernels, so a request's samples do not depend on what shares its batch, as on the torch
  engine. vLLM documents it as beta, on NVIDIA GPUs of compute capability 8.0 or later; its
  kernels are not the torch trainer's, so sampler and trainer agree closely, not bitwise.

Adapters are read by the vLLM process from their published directories, so the adapter root
must be on storage that both processes see (the same machine, or a shared volume mounted at the
same path).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

log = logging.getLogger(__name__)

LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
RUNTIME_LORA_ENV = {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
BATCH_INVARIANT_ENV = "VLLM_BATCH_INVARIANT"


def serve_command(
    model: str | Path,
    *,
    served_model_name: str,
    port: int = 8000,
    host: str = "127.0.0.1",
    max_loras: int = 8,
    max_lora_rank: int = 64,
    max_cpu_loras: int | None = None,
    max_logprobs: int = 20,
    dtype: str | None = None,
    max_model_len: int | None = None,
    gpu_memory_utilization: float | None = None,
    executable: str = "vllm",
    extra: Sequence[str] = (),
    batch_invariant: bool = True,
) -> tuple[list[str], dict[str, str]]:
    """The argv and the extra environment of a `vllm serve` this backend can sample from."""
    if max_lora_rank not in LORA_RANKS:
        raise ValueError(f"vLLM accepts --max-lora-rank in {LORA_RANKS}, got {max_lora_rank}")
    argv = [
        *shlex.split(executable), "serve", str(model),
        "--served-model-name", served_model_name,
        "--host", host,
        "--port", str(port),
        "--enable-lora",
        "--max-loras", str(max_loras),
        "--max-lora-rank", str(max_lora_rank),
        "--max-cpu-loras", str(max_cpu_loras or 4 * max_loras),
        "--logprobs-mode", "processed_logprobs",
        "--max-logprobs", str(max_logprobs),
        "--generation-config", "vllm",
    ]
    if dtype:
        argv += ["--dtype", dtype]
    if max_model_len:
        argv += ["--max-model-len", str(max_model_len)]
    if gpu_memory_utilization:
        argv += ["--gpu-memory-utilization", str(gpu_memory_utilization)]
    argv += list(extra)
    env = dict(RUNTIME_LORA_ENV)
    if batch_invariant:
        env[BATCH_INVARIANT_ENV] = "1"
    return argv, env


class VLLMServer:
    """A `vllm serve` child process: started, awaited until it answers, and stopped."""

    def __init__(self, argv: list[str], env: dict[str, str], url: str, log_path: Path):
        self.argv, self.env, self.url, self.log_path = argv, env, url.rstrip("/"), log_path
        self.process: subprocess.Popen | None = None

    def start(self, ready_timeout_s: float = 900.0) -> VLLMServer:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        handle = open(self.log_path, "wb")  # noqa: SIM115 - the child keeps writing to it
        log.info("starting %s", shlex.join(self.argv))
        self.process = subprocess.Popen(self.argv, env={**os.environ, **self.env},
                                        stdout=handle, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        handle.close()
        deadline = time.monotonic() + ready_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm serve exited with status {self.process.returncode}:\n"
                                   + self.log_tail())
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/v1/models", timeout=2.0).status_code == 200:
                    return self
            time.sleep(1.0)
        self.stop()
        raise TimeoutError(f"vllm serve did not answer within {ready_timeout_s:.0f}s:\n"
                           + self.log_tail())

    def log_tail(self, lines: int = 40) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM to the server's process group (it spawns engine workers), then SIGKILL."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)

    def __enter__(self) -> VLLMServer:
        return self if self.process is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
