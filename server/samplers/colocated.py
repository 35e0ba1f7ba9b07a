"""vLLM beside the torch engine in one process: the single server's sampler on CUDA.

`python -m server --device cuda` starts `vllm serve` as a child process on the same GPU, with a
share of its memory (`--vllm-gpu-memory-utilization`), and sends it every sample request whose
adapter it can serve, straight from the request thread: the engine thread keeps training while
vLLM samples, and vLLM batches the requests of every run continuously. Adapters reach vLLM as
immutable PEFT directories named by their content (`adapters`), published from the sampler
snapshot a request names, and hot-loaded once.

A run vLLM cannot serve (for Gemma an adapter that trains `lm_head`, the SDK's default
`train_unembed=True`; a rank above `--vllm-max-lora-rank`) samples on the torch engine: said when
the run is created, logged once per snapshot and counted per request on `/metrics`
(`autoresearch_sampler_fallbacks_total{reason}`). A request vLLM cannot take because it has
stopped answering goes back to the engine, counted as `vllm_unavailable`; any other error of
vLLM's is that request's answer.
"""

from __future__ import annotations

import atexit
import logging
import shlex
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from server.engine.engine import Engine
from server.observability.metrics import ServerMetrics
from server.samplers.fallbacks import FallbackLog
from server.samplers.openai_http import OpenAICompatClient, VLLMUnavailable
from server.samplers.vllm_process import VLLMServer, serve_command
from server.samplers.vllm_sampler import VLLMSampler, vllm_installed
from server.scheduling.scheduler import Work

log = logging.getLogger(__name__)

SAMPLERS = ("auto", "vllm", "torch")


@dataclass
class VLLMOptions:
    """How the single process samples: `sampler` auto (vLLM on CUDA when it can be started,
    else the engine), vllm or torch; and the vLLM it starts or joins."""

    sampler: str = "auto"
    url: str | None = None
    """An already-running vLLM to sample on instead of starting one (it must read adapters from
    this server's data directory at the same path)."""
    executable: str = "vllm"
    """The command that starts vLLM (`vllm`; a stand-in's `python -m ...` where there is no
    GPU)."""
    port: int = 0
    """The port the started vLLM listens on (the command line's 0: a free one, picked by the
    caller)."""
    gpu_memory_utilization: float = 0.3
    """vLLM's share of the GPU's memory (weights, KV cache, CUDA graphs); the engine, loaded
    first, trains in what is left."""
    max_lora_rank: int = 64
    max_loras: int = 8
    max_in_flight: int = 64
    """Requests sent to vLLM at once; more wait here, and vLLM batches those it holds."""
    ready_timeout_s: float = 900.0


def wants_vllm(options: VLLMOptions, device: str) -> tuple[bool, str]:
    """Whether to sample on vLLM, and the reason, for a server whose engine runs `device`
    (cuda, mps or cpu; an emulated layout's kind)."""
    if options.sampler not in SAMPLERS:
        raise ValueError(f"--sampler must be one of {SAMPLERS}, got {options.sampler!r}")
    if options.sampler != "auto":
        return options.sampler == "vllm", f"--sampler {options.sampler}"
    if device != "cuda":
        return False, f"vLLM samples on CUDA only; this engine runs {device}"
    if options.url or options.executable != "vllm" or vllm_installed():
        return True, "the engine runs CUDA"
    return False, ("the vllm package is not installed (pip install 'autoresearch[vllm]' in an "
                   "environment whose torch it pins)")


class VLLMBeside:
    """Routes a single server's sample requests: to vLLM when it can serve them, else back to
    the engine's scheduler. `take` is called on a request thread."""

    def __init__(self, sampler: VLLMSampler, server: VLLMServer | None, fallbacks: FallbackLog,
                 metrics: ServerMetrics, max_in_flight: int = 64):
        self.sampler, self.server, self.fallbacks = sampler, server, fallbacks
        self.metrics = metrics
        self._pool = ThreadPoolExecutor(max_in_flight, thread_name_prefix="vllm-request")
        self._lock = threading.Lock()
        self._queued: Counter[str] = Counter()
        self._closed = False

    def why_not(self, rank: int, modules: set[str]) -> str | None:
        """For a run being created: why its samples will come from the engine, or None."""
        return self.sampler.why_not(rank, modules)

    def queued_tokens(self, owner: str) -> int:
        """Tokens of this key's requests sent to vLLM and not yet answered."""
        with self._lock:
            return self._queued[owner]

    def take(self, work: Work, local: Callable[[Work], None]) -> bool:
        """Send `work` to vLLM and return True, or return False (counted with its reason) when
        vLLM cannot serve its adapter, for the caller to queue on the engine. A request vLLM
        stops answering is handed to `local`."""
        job = work.sample
        assert job is not None
        if self.sampler.unservable_reason(job) is not None:
            self.fallbacks.unservable([job], self.sampler.servable_modules,
                                      self.sampler.max_lora_rank)
            return False
        with self._lock:
            if self._closed:
                return False
            self._queued[work.owner] += work.tokens
        self._pool.submit(self._sample, work, local)
        return True

    def _sample(self, work: Work, local: Callable[[Work], None]) -> None:
        (outcome,) = self.sampler.sample_each([work.sample])  # type: ignore[list-item]
        with self._lock:
            self._queued[work.owner] -= work.tokens
            if self._queued[work.owner] <= 0:
                del self._queued[work.owner]
        if isinstance(outcome, VLLMUnavailable):
            self.fallbacks.unavailable(str(outcome))
            local(work)
        elif isinstance(outcome, BaseException):
            work.done(None, outcome)
        else:
            self.metrics.record_tokens("sample", sum(len(s.tokens) for s in outcome.sequences))
            self.metrics.sample_requests.labels("vllm").inc()
            work.done(outcome, None)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._pool.shutdown(wait=True, cancel_futures=False)
        self.sampler.close()
        if self.server is not None:
            self.server.stop()


def start_beside(engine: Engine, options: VLLMOptions, model: str, data_dir: Path,
                 metrics: ServerMetrics) -> VLLMBeside | None:
    """vLLM for `engine`'s model, started (or joined at `options.url`) and checked, or None with
    the reason logged (and counted, where the server would have sampled on vLLM) when this
    server samples on its engine. `model` is what vLLM loads: the engine's directory or Hub id;
    a vLLM to start listens on `options.port`."""
    fallbacks = FallbackLog(metrics.count_fallback)
    use, why = wants_vllm(options, engine.layout.kind)
    if not use:
        log.info("sampling on the torch engine: %s", why)
        if options.sampler == "auto" and engine.layout.kind == "cuda":
            fallbacks.unavailable(why)
        return None
    server = None
    url = options.url
    if url is None:
        argv, env = serve_command(
            model, served_model_name=engine.model_name, port=options.port,
            max_loras=options.max_loras, max_lora_rank=options.max_lora_rank,
            gpu_memory_utilization=options.gpu_memory_utilization,
            executable=options.executable, batch_invariant=engine.invariance_guaranteed)
        url = f"http://127.0.0.1:{options.port}"
        server = VLLMServer(argv, env, url, data_dir / "vllm" / "vllm.log")
        log.info("starting vLLM beside the engine (%s of the GPU's memory): %s",
                 options.gpu_memory_utilization, shlex.join(argv))
        try:
            server.start(options.ready_timeout_s)
        except (RuntimeError, TimeoutError) as exc:
            fallbacks.unavailable(f"vLLM did not start: {exc}")
            return None
        atexit.register(server.stop)
    sampler = VLLMSampler(OpenAICompatClient(url), data_dir / "vllm", model=engine.model_name,
                          eos_token_ids=engine.eos_ids, fallbacks=fallbacks,
                          max_lora_rank=options.max_lora_rank,
                          max_concurrency=options.max_in_flight)
    try:
        sampler.start()
    except Exception as exc:  # noqa: BLE001 - refused (wrong logprobs, wrong model): use the engine
        sampler.close()
        if server is not None:
            server.stop()
        fallbacks.unavailable(f"vLLM at {url} was refused: {exc}")
        return None
    log.info("sampling on vLLM at %s; runs it cannot serve sample on the torch engine", url)
    return VLLMBeside(sampler, server, fallbacks, metrics, options.max_in_flight)

