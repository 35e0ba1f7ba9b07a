"""Which logprobs the inference server reports, measured on the server itself at start-up.

Tinker, and the torch sampler here, report each sampled token's logprob under the distribution
it was drawn from: `log_softmax(logits / T)`, renormalised over what top-k/top-p kept. vLLM's V1
engine by default reports the raw model's `log_softmax(logits)` whatever the temperature
(engine argument `--logprobs-mode`, default `raw_logprobs`); an RL loss fed those would
compute importance ratios against the wrong sampling distribution. vLLM (0.10 series onward)
reports tempered logprobs when started with `--logprobs-mode processed_logprobs`: the values
after penalties, temperature and top-k/top-p, renormalised (vllm/v1/sample/sampler.py and
ops/topk_topp_sampler.py).

Two consequences the sampler accounts for:

- With `top_p < 1` or `top_k > 0`, processed logprobs are renormalised over the tokens kept by
  the filter, which is the distribution really sampled from; the torch sampler reports the same
  (`server.engine.decoding.choose`), so both backends give one definition.
- Prompt logprobs are computed from raw logits in the vLLM releases seen so far (they ignore
  temperature). The probe measures this too; should a server temper them, the sampler fetches
  prompt logprobs with a separate temperature-1 request.

The probe: the same one-token request at temperature 1 and 0.5 with the top five logprobs. The
ranking of tokens does not change with temperature, so for two tokens a, b of the top five the
gap `lp(a) - lp(b)` doubles at T = 0.5 when logprobs are tempered and stays put when raw.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from server.samplers.completions import token_id
from server.samplers.openai_http import OpenAICompatClient, VLLMError

log = logging.getLogger(__name__)

REQUIRED_FLAG = "--logprobs-mode processed_logprobs"
PROBE_PROMPT = "The capital of France is"
PROBE_TEMPERATURE = 0.5
TOLERANCE = 0.2
"""On the gap ratio (2.0 tempered, 1.0 raw); bf16 logits move it by far less than this."""


class SemanticsError(VLLMError):
    """The server's logprobs are not the tempered ones Tinker clients rely on."""


@dataclass(frozen=True)
class LogprobSemantics:
    """What the probe measured."""

    tempered: bool
    """Sampled-token logprobs are `log_softmax(logits / T)`."""
    prompt_tempered: bool
    """Prompt logprobs change with the request's temperature."""
    gap_ratio: float
    """Measured gap at T = 0.5 over the gap at T = 1: 2 when tempered, 1 when raw."""

    def describe(self) -> str:
        kind = "tempered (processed)" if self.tempered else "NOT tempered (raw)"
        prompt = "tempered" if self.prompt_tempered else "untempered"
        return (f"sampled logprobs {kind}, gap ratio {self.gap_ratio:.3f} at "
                f"T={PROBE_TEMPERATURE}; prompt logprobs {prompt}")


def probe_body(model: str, temperature: float) -> dict[str, Any]:
    return {
        "model": model,
        "prompt": PROBE_PROMPT,
        "n": 1,
        "max_tokens": 1,
        "temperature": temperature,
        "top_p": 1.0,
        "top_k": -1,
        "seed": 0,
        "logprobs": 5,
        "prompt_logprobs": 0,
        "return_tokens_as_token_ids": True,
        "stream": False,
    }


def _first_top(answer: dict[str, Any]) -> dict[int, float]:
    try:
        row = answer["choices"][0]["logprobs"]["top_logprobs"][0]
    except (KeyError, IndexError, TypeError):
        raise SemanticsError("the probe answer carries no top logprobs") from None
    return {token_id(t): float(v) for t, v in (row or {}).items()}


def _prompt_values(answer: dict[str, Any]) -> list[float]:
    choices = answer.get("choices") or [{}]
    rows = choices[0].get("prompt_logprobs") or answer.get("prompt_logprobs") or []
    values = []
    for row in rows[1:]:
        best = max((v.get("logprob", -math.inf) if isinstance(v, dict) else float(v)
                    for v in (row or {}).values()), default=math.nan)
        values.append(float(best))
    return values


def interpret(at_one: dict[str, Any], at_half: dict[str, Any]) -> LogprobSemantics:
    """Compare the two probe answers (temperature 1 and 0.5)."""
    one, half = _first_top(at_one), _first_top(at_half)
    if any(v > 1e-3 for v in (*one.values(), *half.values())):
        raise SemanticsError(
            "the server returns logits, not logprobs (--logprobs-mode *_logits); start it with "
            + REQUIRED_FLAG)
    shared = [t for t in one if t in half and math.isfinite(one[t]) and math.isfinite(half[t])]
    if len(shared) < 2:
        raise SemanticsError("the probe found fewer than two tokens to compare")
    a, b = max(shared, key=one.__getitem__), min(shared, key=one.__getitem__)
    gap = one[a] - one[b]
    if gap < 1e-3:
        raise SemanticsError("the probe's top tokens are too close to tell raw from tempered")
    ratio = (half[a] - half[b]) / gap
    expected = 1.0 / PROBE_TEMPERATURE
    if abs(ratio - expected) > TOLERANCE and abs(ratio - 1.0) > TOLERANCE:
        raise SemanticsError(f"the server's logprobs follow neither raw nor tempered semantics "
                             f"(gap ratio {ratio:.3f})")
    p_one, p_half = _prompt_values(at_one), _prompt_values(at_half)
    prompt_tempered = bool(p_one) and len(p_one) == len(p_half) and max(
        abs(x - y) for x, y in zip(p_one, p_half, strict=True)) > 1e-3
    return LogprobSemantics(abs(ratio - expected) <= TOLERANCE, prompt_tempered, ratio)


def probe(client: OpenAICompatClient, model: str) -> LogprobSemantics:
    """Measure the server's logprob semantics with two one-token requests on `model`."""
    at_one = client.completions(probe_body(model, 1.0))
    at_half = client.completions(probe_body(model, PROBE_TEMPERATURE))
    semantics = interpret(at_one, at_half)
    log.info("vLLM logprob semantics: %s", semantics.describe())
    return semantics
