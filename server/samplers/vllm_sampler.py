"""Sampling through a vLLM server, with the torch engine's `sample(jobs)` contract.

`VLLMSampler.sample(jobs)` takes the same `SampleJob`s as `server.engine.engine.Engine.sample` and
returns the same `SampleResult`s, so a sampler worker can hold either. For each job it

1. publishes the job's adapter (if any) as an immutable PEFT directory named by its content
   (`server.samplers.adapters`), and hot-loads that name into vLLM once;
2. sends one `/v1/completions` request (n = num_samples) with the mapping of
   `server.samplers.completions`, all jobs of a batch concurrently from a thread pool;
3. parses the answer into token ids, per-token logprobs and stop reasons.

A failed request fails its own job only: `sample_each` returns an exception in that job's place,
and `sample` raises `SampleBatchError` after remembering the jobs that succeeded, so a caller that
retries the jobs one by one (as `server.scheduling.scheduler` does) gets those results back
without sampling them twice; the memory lasts until a batch arrives that retries none of them.
Every failure is a `VLLMError` (a `RuntimeError`: a server error, not the user's).

At start-up the sampler measures the server's logprob semantics (`server.samplers.semantics`)
and refuses a server that reports raw-model logprobs, unless told not to be strict, in which case
only jobs for which raw and tempered logprobs coincide (temperature 0 or 1) are sampled.

Adapters that train `lm_head` cannot be served by vLLM for Gemma (its output layer is the tied
embedding, which vLLM does not wrap with LoRA); such jobs go to the fallback sampler (the torch
engine) when one is given, and fail with a clear message otherwise.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from server.engine.engine import Engine, SampleJob
from server.engine.jobs import mask_unscored
from server.engine.lora import ATTN_MODULES, MLP_MODULES
from server.engine.model_loading import default_cache_dir
from server.protocol.codec import SampledSequence, SampleResult
from server.samplers.adapters import AdapterPublisher, LoadedAdapters, PublishedAdapter
from server.samplers.completions import (
    completion_body,
    max_new_tokens,
    parse_prompt_logprobs,
    parse_sequences,
    prompt_logprobs_body,
    wants_prompt_logprobs,
)
from server.samplers.fallbacks import FallbackLog, explain, trained_modules, unservable_reason
from server.samplers.openai_http import (
    OpenAICompatClient,
    VLLMError,
    VLLMRequestError,
    VLLMUnavailable,
)
from server.samplers.semantics import REQUIRED_FLAG, LogprobSemantics, SemanticsError, probe

log = logging.getLogger(__name__)
WAIT_FIRST_S = 1.0
WAIT_MAX_S = 30.0
"""Backoff between attempts to reach a vLLM that is still starting: 1, 2, 4 ... 30 s."""

SERVABLE_MODULES = ATTN_MODULES + MLP_MODULES
"""LoRA targets vLLM applies to Gemma 3; `lm_head` is not among them."""


class Sampler(Protocol):
    """Anything that samples a batch of jobs: the torch `Engine` or a `VLLMSampler`."""

    def sample(self, jobs: list[SampleJob]) -> list[SampleResult]: ...


class SampleBatchError(VLLMError):
    """Some jobs of a batch failed; `outcomes` holds each job's result or exception."""

    def __init__(self, outcomes: list[SampleResult | BaseException]):
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        super().__init__(f"{len(failures)} of {len(outcomes)} sampling jobs failed; first: "
                         f"{failures[0]}")
        self.outcomes = outcomes


KEEP_PUBLISHED = 64
"""Adapter directories kept at least: several RL steps of several runs, so one that is about to
be loaded is never pruned; older ones are written again if asked for."""


class VLLMSampler:
    """Samples `SampleJob`s on a vLLM server; see the module docstring."""

    streams = True
    """Each job is its own request, which vLLM batches continuously with whatever else is in
    flight: a caller may send jobs one at a time as they come (the sampler worker does)."""

    def __init__(
        self,
        client: OpenAICompatClient,
        adapter_root: str | Path,
        *,
        model: str | None = None,
        eos_token_ids: Iterable[int] | None = None,
        max_loaded_adapters: int = 16,
        max_concurrency: int = 32,
        fallback: Sampler | None = None,
        servable_modules: Iterable[str] = SERVABLE_MODULES,
        strict_logprobs: bool = True,
        fallbacks: FallbackLog | None = None,
        max_lora_rank: int | None = None,
    ):
        self.client, self.adapter_root, self.model = client, Path(adapter_root), model
        self.max_lora_rank = max_lora_rank
        """The `--max-lora-rank` vLLM was started with; adapters above it go to the fallback."""
        self.fallbacks = fallbacks or FallbackLog()
        self.publisher: AdapterPublisher | None = None
        self.eos_token_ids = set(eos_token_ids) if eos_token_ids is not None else None
        self.fallback = fallback
        self.servable_modules = frozenset(servable_modules)
        self.strict_logprobs = strict_logprobs
        self.semantics: LogprobSemantics | None = None
        self.loaded = LoadedAdapters(max_loaded_adapters, client.load_lora_adapter,
                                     client.unload_lora_adapter)
        self.keep_published = max(KEEP_PUBLISHED, 2 * max_loaded_adapters)
        """Published adapter directories kept on disk (the newest; loaded ones always)."""
        self._pool = ThreadPoolExecutor(max_concurrency, thread_name_prefix="vllm-sampler")
        self._memo: dict[int, tuple[SampleJob, SampleResult]] = {}
        self._memo_lock = threading.Lock()
        self._warned_filters = False

    # ------------------------------------------------------------ lifecycle
    def start(self) -> VLLMSampler:
        """Find the served base model and check the server's logprob semantics."""
        served = self.client.models()
        bases = [m["id"] for m in served if not m.get("parent")]
        if self.model is None:
            if not bases:
                raise VLLMError("vLLM serves no base model")
            self.model = bases[0]
        elif self.model not in bases:
            raise VLLMError(f"vLLM serves {bases}, not {self.model!r}; start it with "
                            f"--served-model-name {self.model}")
        try:
            self.publisher = AdapterPublisher(self.adapter_root, self.model)
        except OSError as exc:  # a read-only mount, say
            raise VLLMError(f"cannot publish adapters under {self.adapter_root}/adapters "
                            f"({exc.strerror or exc}): give the sampler a writable directory "
                            "that vLLM sees at the same path (--adapter-root)") from None
        self.semantics = probe(self.client, self.model)
        if not self.semantics.tempered:
            message = (f"vLLM at {self.client.base_url} reports raw-model logprobs, but Tinker "
                       f"clients expect them under the sampling temperature; start vLLM with "
                       f"{REQUIRED_FLAG}")
            if self.strict_logprobs:
                raise SemanticsError(message)
            log.error("%s. Only jobs at temperature 0 or 1 will be sampled.", message)
        return self

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.client.close()

    def __enter__(self) -> VLLMSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------- sampling
    def sample(self, jobs: list[SampleJob]) -> list[SampleResult]:
        """Every job's result, or `SampleBatchError` (one job: its own error) if any failed."""
        outcomes = self.sample_each(jobs)
        failures = [o for o in outcomes if isinstance(o, BaseException)]
        if not failures:
            return outcomes  # type: ignore[return-value]
        if len(jobs) == 1:
            raise failures[0]
        with self._memo_lock:
            self._memo = {id(job): (job, out) for job, out in zip(jobs, outcomes, strict=True)
                          if not isinstance(out, BaseException)}
        raise SampleBatchError(outcomes)

    def sample_each(self, jobs: list[SampleJob]) -> list[SampleResult | BaseException]:
        """Each job's result or the exception that failed it, in job order; never raises."""
        if self.publisher is None:
            raise VLLMError("VLLMSampler.start() must run before sampling")
        outcomes: list[SampleResult | BaseException | None] = [None] * len(jobs)
        with self._memo_lock:
            for i, job in enumerate(jobs):
                kept = self._memo.pop(id(job), None)
                if kept is not None and kept[0] is job:
                    outcomes[i] = kept[1]
            if all(outcome is None for outcome in outcomes):
                self._memo.clear()  # a new batch, not a retry of the last one
        remote: list[int] = []
        local: list[int] = []
        for i, job in enumerate(jobs):
            if outcomes[i] is not None:
                continue
            if self._servable(job):
                remote.append(i)
            else:
                local.append(i)
        published = self._publish({id(jobs[i].adapter): jobs[i].adapter for i in remote
                                   if jobs[i].adapter is not None})
        futures: dict[int, Future] = {}
        for i in remote:
            adapter = jobs[i].adapter
            target = published.get(id(adapter)) if adapter is not None else None
            if isinstance(target, BaseException):
                outcomes[i] = target
            else:
                futures[i] = self._pool.submit(self._sample_job, jobs[i], target)
        if local:
            if self.fallback is not None:
                self.fallbacks.unservable([jobs[i] for i in local], self.servable_modules,
                                          self.max_lora_rank)
            for i, outcome in zip(local, self._sample_locally([jobs[i] for i in local]),
                                  strict=True):
                outcomes[i] = outcome
        for i, future in futures.items():
            try:
                outcomes[i] = future.result()
            except Exception as exc:  # noqa: BLE001 - one job's failure is that job's result
                log.warning("vLLM sampling job failed: %s", exc)
                outcomes[i] = exc if isinstance(exc, VLLMError) else VLLMError(
                    f"vLLM sampling failed: {type(exc).__name__}: {exc}")
        return outcomes  # type: ignore[return-value]

    def _servable(self, job: SampleJob) -> bool:
        return self.unservable_reason(job) is None

    def unservable_reason(self, job: SampleJob) -> str | None:
        """Why vLLM cannot sample this job's adapter (`fallbacks.REASONS`), or None."""
        if job.adapter is None:
            return None
        return unservable_reason(job.adapter.spec.rank, trained_modules(job.adapter),
                                 self.servable_modules, self.max_lora_rank)

    def why_not(self, rank: int, modules: set[str]) -> str | None:
        """For a run being created: the sentence saying why its samples will not come from
        vLLM, or None when they will."""
        reason = unservable_reason(rank, modules, self.servable_modules, self.max_lora_rank)
        return None if reason is None else explain(reason, rank, modules,
                                                   self.servable_modules, self.max_lora_rank)

    def _publish(self, adapters: dict) -> dict[int, PublishedAdapter | BaseException]:
        published: dict[int, PublishedAdapter | BaseException] = {}
        for key, adapter in adapters.items():
            try:
                published[key] = self.publisher.publish(adapter)
            except Exception as exc:  # noqa: BLE001 - fails the jobs that use this adapter
                log.error("publishing an adapter failed: %s", exc)
                published[key] = VLLMError(f"publishing the adapter for vLLM failed: {exc}")
        fresh = {p.name for p in published.values() if isinstance(p, PublishedAdapter)}
        self.publisher.prune(self.keep_published, self.loaded.held() | fresh)
        return published

    def _sample_locally(self, jobs: list[SampleJob]) -> list[SampleResult | BaseException]:
        if self.fallback is None:
            return [VLLMError(self._refusal(job)) for job in jobs]
        try:
            return list(self.fallback.sample(jobs))
        except Exception as exc:  # noqa: BLE001
            if len(jobs) == 1:
                return [exc]
            return [self._sample_locally([job])[0] for job in jobs]

    def _refusal(self, job: SampleJob) -> str:
        adapter = job.adapter
        assert adapter is not None
        return ("vLLM cannot sample this adapter and there is no torch sampler to fall back on: "
                + str(self.why_not(adapter.spec.rank, trained_modules(adapter))))

    def _check_semantics(self, job: SampleJob) -> None:
        p = job.params
        filtered = p.top_p < 1.0 or (p.top_k is not None and p.top_k > 0)
        if self.semantics is not None and not self.semantics.tempered and p.temperature not in (
                0.0, 1.0):
            raise SemanticsError(f"this vLLM server reports raw logprobs, which are wrong at "
                                 f"temperature {p.temperature}; start it with {REQUIRED_FLAG}")
        tempered = self.semantics is not None and self.semantics.tempered
        if filtered and tempered and p.temperature > 0 and not self._warned_filters:
            self._warned_filters = True
            log.warning("with top_p/top_k, vLLM reports logprobs renormalised over the kept "
                        "tokens; the torch sampler reports them under the full tempered "
                        "distribution")

    def _sample_job(self, job: SampleJob, adapter: PublishedAdapter | None) -> SampleResult:
        self._check_semantics(job)
        model = adapter.name if adapter is not None else self.model
        result = SampleResult(sequences=[])
        prompt_answer = None
        separate_prompt = wants_prompt_logprobs(job) and (
            max_new_tokens(job) == 0
            or (self.semantics is not None and self.semantics.prompt_tempered
                and job.params.temperature != 1.0))
        if max_new_tokens(job) == 0:
            result.sequences = [SampledSequence([], [], False) for _ in range(job.num_samples)]
        else:
            body = completion_body(job, model, self.eos_token_ids,
                                   with_prompt_logprobs=not separate_prompt)
            answer = self._complete(body, adapter)
            result.sequences = parse_sequences(answer, job)
            prompt_answer = answer
        if separate_prompt:
            prompt_answer = self._complete(prompt_logprobs_body(job, model), adapter)
        if wants_prompt_logprobs(job):
            values, top = parse_prompt_logprobs(prompt_answer, job)
            result.prompt_logprobs = values if job.prompt_logprobs else None
            result.topk_prompt = top
            mask_unscored(result, job)  # vLLM scores the whole prompt; answer what was asked
        return result

    def _complete(self, body: dict, adapter: PublishedAdapter | None) -> dict:
        if adapter is None:
            return self.client.completions(body)
        for attempt in (0, 1):
            with self.loaded.use(adapter.name, adapter.path):
                try:
                    return self.client.completions(body)
                except VLLMRequestError as exc:
                    if attempt or exc.status != 404 or "does not exist" not in exc.message:
                        raise
            # The server no longer knows the name (it restarted): load it again, once.
            log.warning("vLLM forgot adapter %s; loading it again", adapter.name)
            self.loaded.forget(adapter.name)
        raise AssertionError("unreachable")


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def make_sampler(
    backend: str,
    *,
    engine: Engine | None = None,
    base_url: str | None = None,
    adapter_root: str | Path | None = None,
    model: str | None = None,
    api_key: str | None = None,
    strict_logprobs: bool = True,
    client: OpenAICompatClient | None = None,
    client_options: dict | None = None,
    fallbacks: FallbackLog | None = None,
    wait_s: float = 0.0,
    **options,
) -> Sampler:
    """The sampler for `backend`: "torch" (the engine) or "vllm", which falls back to the engine
    with a logged warning when no vLLM server is usable (no URL, unreachable, or reporting the
    wrong logprob semantics). `client_options` go to `OpenAICompatClient` (timeouts, retries),
    `options` to `VLLMSampler` (e.g. `max_loaded_adapters`). `fallbacks` logs and counts every
    request that goes to the torch sampler instead of vLLM. `wait_s` is how long an unreachable
    vLLM is waited for (it loads a model for minutes after its pod starts), with backoff, before
    that; a vLLM that answers wrongly is refused at once.
    """
    fallbacks = fallbacks or FallbackLog()
    if backend == "torch":
        if engine is None:
            raise ValueError("the torch sampler needs an engine")
        return engine
    if backend != "vllm":
        raise ValueError(f"unknown sampling backend {backend!r}; choose 'torch' or 'vllm'")
    if client is None and base_url is None:
        reason = "no vLLM server URL was given"
        if not vllm_installed():
            reason += " and the vllm package is not installed"
        return _fall_back(engine, reason, fallbacks)
    client = client or OpenAICompatClient(base_url, api_key=api_key, **(client_options or {}))
    root = Path(adapter_root) if adapter_root is not None else default_cache_dir().parent
    name = model or (engine.model_name if engine is not None else None)
    sampler = VLLMSampler(
        client,
        root,
        model=name,
        eos_token_ids=engine.eos_ids if engine is not None else None,
        fallback=engine,
        strict_logprobs=strict_logprobs,
        fallbacks=fallbacks,
        **options,
    )
    deadline, pause = time.monotonic() + wait_s, WAIT_FIRST_S
    while True:
        try:
            return sampler.start()
        except VLLMUnavailable as exc:
            if time.monotonic() + pause > deadline:
                sampler.close()
                return _fall_back(engine, str(exc), fallbacks)
            log.info("vLLM at %s is not answering yet (%s); trying again in %.0f s",
                     client.base_url, exc, pause)
            time.sleep(pause)
            pause = min(WAIT_MAX_S, pause * 2)
        except VLLMError as exc:
            sampler.close()
            if isinstance(exc, SemanticsError):
                log.error("refusing vLLM: %s", exc)
            return _fall_back(engine, str(exc), fallbacks)



def _fall_back(engine: Engine | None, reason: str, fallbacks: FallbackLog) -> Sampler:
    if engine is None:
        raise VLLMError(f"vLLM sampling is unavailable ({reason}) and there is no torch engine "
                        "to fall back on")
    fallbacks.unavailable(reason)
    return engine
