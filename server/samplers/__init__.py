"""Sampling backends other than the torch engine: vLLM behind its OpenAI-compatible server.

Every backend has the torch engine's contract, `sample(jobs: list[SampleJob]) ->
list[SampleResult]`, so a sampler worker holds whichever `make_sampler` returns.

- `vllm_sampler`: `VLLMSampler` (jobs -> concurrent completions -> results) and `make_sampler`.
- `completions`: Tinker sampling parameters as completion requests, and the answers back.
- `semantics`: the start-up probe of which logprobs the server reports.
- `adapters`: content-addressed PEFT directories, and which of them the server holds.
- `openai_http`: the HTTP client (timeouts, retries, server-category errors).
- `vllm_process`: the `vllm serve` command line, and a child-process wrapper.

May import `server.storage`, `engine`, `protocol` and `observability`; not the service.
"""

from server.samplers.vllm_sampler import SampleBatchError, Sampler, VLLMSampler, make_sampler

__all__ = ["Sampler", "SampleBatchError", "VLLMSampler", "make_sampler"]
