"""Tinker sampling requests as OpenAI `/v1/completions` bodies, and the answers back.

Pure functions, no HTTP. The mapping keeps the semantics of the torch sampler
(`server.engine.engine.Engine.sample`):

- `stop` absent: stop at end of sequence. The engine's own end-of-sequence ids are sent as
  `stop_token_ids`, so both samplers stop on the same tokens whatever the server's generation
  config says.
- `stop: []`: no stop at all, end of sequence included (`ignore_eos`).
- `stop: [ints]`: only those token ids stop (`stop_token_ids` + `ignore_eos`).
- `stop: [strings]`: only those strings stop (`stop` + `ignore_eos`), matched on text decoded
  *with* special tokens, as the torch sampler does, so `"<end_of_turn>"` works as a stop string.
- Every token generated is returned, including the stop token or the tokens that completed a
  stop string: vLLM truncates only the text, never `token_ids` or logprobs.
- `top_k <= 0` means no top-k; it is sent as -1 (accepted by every vLLM release), and `top_p`,
  `top_k` and `temperature` are always sent, so a model's generation config cannot change them.
- Tokens come back as ids (`return_tokens_as_token_ids`), with one logprob per token.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from server.engine.engine import DEFAULT_MAX_TOKENS, SampleJob
from server.engine.jobs import TOPK_PAD_ID, TOPK_PAD_LOGPROB
from server.protocol.codec import SampledSequence
from server.samplers.openai_http import VLLMError


class ResponseError(VLLMError):
    """A completion answer that does not have the expected shape (a server-side failure)."""


def max_new_tokens(job: SampleJob) -> int:
    return DEFAULT_MAX_TOKENS if job.params.max_tokens is None else job.params.max_tokens


def stop_fields(stop: list[str] | list[int] | None, eos_token_ids: set[int] | None) -> dict:
    """The stop-related request fields for Tinker's three kinds of `stop`."""
    if stop is None:
        fields: dict[str, Any] = {"ignore_eos": False}
        if eos_token_ids:
            fields["stop_token_ids"] = sorted(int(i) for i in eos_token_ids)
        return fields
    if not stop:
        return {"ignore_eos": True}
    if all(isinstance(s, int) and not isinstance(s, bool) for s in stop):
        return {"ignore_eos": True, "stop_token_ids": [int(s) for s in stop]}
    if all(isinstance(s, str) for s in stop):
        strings = [s for s in stop if s]
        fields = {"ignore_eos": True, "include_stop_str_in_output": True,
                  "skip_special_tokens": False, "spaces_between_special_tokens": False}
        if strings:
            fields["stop"] = strings
        return fields
    raise ValueError("stop must be all strings or all token ids")


def completion_body(
    job: SampleJob,
    model: str,
    eos_token_ids: set[int] | None = None,
    *,
    with_prompt_logprobs: bool = True,
) -> dict[str, Any]:
    """The `/v1/completions` body that samples `job.num_samples` continuations of its prompt."""
    p = job.params
    body: dict[str, Any] = {
        "model": model,
        "prompt": [int(t) for t in job.prompt],
        "n": job.num_samples,
        "max_tokens": max_new_tokens(job),
        "temperature": float(p.temperature),
        "top_p": float(p.top_p),
        "top_k": int(p.top_k) if p.top_k and p.top_k > 0 else -1,
        "logprobs": max(int(job.topk_sample_logprobs), 0),
        "return_tokens_as_token_ids": True,
        "stream": False,
        **stop_fields(p.stop, eos_token_ids),
    }
    if p.seed is not None:
        body["seed"] = int(p.seed)
    if with_prompt_logprobs and wants_prompt_logprobs(job):
        body["prompt_logprobs"] = max(int(job.topk_prompt_logprobs), 0)
    return body


def prompt_logprobs_body(job: SampleJob, model: str) -> dict[str, Any]:
    """A one-token request whose only purpose is the prompt's untempered logprobs."""
    return {
        "model": model,
        "prompt": [int(t) for t in job.prompt],
        "n": 1,
        "max_tokens": 1,
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "prompt_logprobs": max(int(job.topk_prompt_logprobs), 0),
        "return_tokens_as_token_ids": True,
        "stream": False,
    }


def wants_prompt_logprobs(job: SampleJob) -> bool:
    return bool(job.prompt_logprobs or job.topk_prompt_logprobs)


def token_id(key: str | int) -> int:
    """A token id from `"token_id:123"` (returned tokens) or `"123"` (logprob dict keys)."""
    if isinstance(key, int):
        return key
    text = str(key)
    if text.startswith("token_id:"):
        text = text[len("token_id:") :]
    try:
        return int(text)
    except ValueError:
        raise ResponseError(f"expected a token id, got {key!r}; is return_tokens_as_token_ids "
                            "supported by this server?") from None


def _topk_rows(rows: list[dict[str, Any] | None], k: int) -> tuple[np.ndarray, np.ndarray]:
    """`[len, k]` ids and logprobs from per-position `{token: logprob}` dicts, best first."""
    ids = np.full((len(rows), k), TOPK_PAD_ID, dtype=np.int32)
    lps = np.full((len(rows), k), TOPK_PAD_LOGPROB, dtype=np.float32)
    for i, row in enumerate(rows):
        if not row:
            continue
        entries = sorted(((token_id(t), _logprob_value(v)) for t, v in row.items()),
                         key=lambda e: -e[1])[:k]
        for j, (tok, lp) in enumerate(entries):
            ids[i, j], lps[i, j] = tok, lp
    return ids, lps


def _logprob_value(value: Any) -> float:
    """A logprob from either a bare float (completion top_logprobs) or a Logprob object."""
    if isinstance(value, dict):
        value = value.get("logprob")
    if value is None:
        return float("nan")
    return float(value)


def parse_sequences(response: dict[str, Any], job: SampleJob) -> list[SampledSequence]:
    """One `SampledSequence` per choice, in choice order: token ids, logprobs, stop reason."""
    choices = sorted(response.get("choices") or [], key=lambda c: c.get("index", 0))
    if len(choices) != job.num_samples:
        raise ResponseError(f"asked for {job.num_samples} samples, got {len(choices)} choices")
    sequences = []
    for choice in choices:
        logprobs = choice.get("logprobs") or {}
        tokens = [token_id(t) for t in logprobs.get("tokens") or []]
        values = logprobs.get("token_logprobs") or []
        if choice.get("token_ids") is not None:
            returned = [int(t) for t in choice["token_ids"]]
            if tokens and returned != tokens:
                raise ResponseError("token_ids and logprob tokens disagree")
            tokens = returned
        if len(values) != len(tokens):
            raise ResponseError(f"{len(tokens)} tokens but {len(values)} logprobs")
        reason = choice.get("finish_reason")
        if reason not in ("stop", "length"):
            raise ResponseError(f"generation ended with finish_reason {reason!r}")
        topk = None
        if job.topk_sample_logprobs > 0:
            topk = _topk_rows(logprobs.get("top_logprobs") or [None] * len(tokens),
                              job.topk_sample_logprobs)
        sequences.append(SampledSequence(tokens, [_logprob_value(v) for v in values],
                                         reason == "stop", topk))
    return sequences


def parse_prompt_logprobs(
    response: dict[str, Any], job: SampleJob
) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
    """The prompt's logprobs (NaN at position 0) and, if asked, its top-k matrices."""
    choices = response.get("choices") or []
    rows = choices[0].get("prompt_logprobs") if choices else None
    if rows is None:
        rows = response.get("prompt_logprobs")
    if rows is None or len(rows) != len(job.prompt):
        raise ResponseError(f"expected prompt logprobs for {len(job.prompt)} tokens, got "
                            f"{None if rows is None else len(rows)}")
    values = np.full(len(job.prompt), np.nan, dtype=np.float32)
    for i, row in enumerate(rows):
        if i == 0 or not row:
            continue
        by_id = {token_id(t): v for t, v in row.items()}
        if job.prompt[i] not in by_id:
            raise ResponseError(f"prompt logprobs at position {i} lack the prompt token")
        values[i] = _logprob_value(by_id[job.prompt[i]])
    top = None
    if job.topk_prompt_logprobs > 0:
        ranked = [None] + [
            {t: v for t, v in (row or {}).items() if _rank(v) <= job.topk_prompt_logprobs}
            for row in rows[1:]
        ]
        top = _topk_rows(ranked, job.topk_prompt_logprobs)
    return values, top


def _rank(value: Any) -> float:
    """A logprob entry's rank (1 = most likely); entries without one are kept."""
    if isinstance(value, dict) and value.get("rank") is not None:
        return float(value["rank"])
    return 0.0
