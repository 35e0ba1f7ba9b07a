"""What the engine is given and gives back: jobs, parameters, run state, errors, counters.

Plain values shared by every part of the engine (`training`, `sampling`) and by the service
that builds them from requests.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from server.engine.dimuon import Dimuon
from server.engine.lora import AdapterWeights
from server.protocol.codec import Datum, SampleResult


class UserError(ValueError):
    """The request is invalid; report it to the client as a `user` error."""


class NonFiniteRun(UserError):
    """The run's weights are not finite; load a checkpoint into it to go on."""


@dataclass
class AdamParams:
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


@dataclass
class DimuonParams:
    """One Dimuon step's parameters (`dimuon`; Tinker's `DimuonParams`, version 1)."""

    learning_rate: float = 1e-4
    grad_clip_norm: float = 0.0
    beta1: float = 0.9


@dataclass
class RunState:
    """What the engine holds for one training run: its adapter and its own optimizer."""

    adapter: AdapterWeights
    optimizer: torch.optim.Optimizer
    steps: int = 0
    nonfinite: str | None = None
    """Why the run's weights are not finite (set when weights were loaded so); such a run
    refuses training until a checkpoint is loaded into it."""

    @property
    def optimizer_type(self) -> str:
        """`dimuon` or `adamw`: the family this run's optimizer belongs to."""
        return "dimuon" if isinstance(self.optimizer, Dimuon) else "adamw"


@dataclass
class ForwardBackwardJob:
    state: RunState
    data: list[Datum]
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool


@dataclass
class ForwardBackwardResult:
    outputs: list[dict[str, np.ndarray]]
    metrics: dict[str, float]


@dataclass
class SamplingParams:
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: list[str] | list[int] | None = None


TOPK_PAD_ID = 0
TOPK_PAD_LOGPROB = -99999.0
"""A top-k row of (TOPK_PAD_ID, TOPK_PAD_LOGPROB) pairs is a position the SDK reads as None."""


@dataclass
class SampleJob:
    adapter: AdapterWeights | None
    prompt: list[int]
    num_samples: int
    params: SamplingParams
    prompt_logprobs: bool = False
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    prompt_logprobs_last_n: int | None = None
    """Score only the prompt's last N tokens (the SDK's `prompt_logprobs_last_n`): earlier
    positions come back unscored (NaN, top-k rows of padding) and cost no output head."""
    first_sample: int = 0
    """Index of this job's first sample within its request: a request wider than one decode
    batch is decoded as several jobs, and each row keeps the random stream of its index."""


@dataclass
class EngineStats:
    """Counters for observability; the scheduler reads them."""

    busy_seconds: float = 0.0
    train_tokens: int = 0
    sample_tokens: int = 0
    train_batches: int = 0
    fused_passes: int = 0
    """Training body passes that carried several runs' micro-batches (under invariance)."""
    sample_batches: int = 0
    prefill_seconds: float = 0.0
    """Time spent prefilling prompts for decoding (part of `busy_seconds`)."""
    sample_seconds: float = 0.0
    """Time in `sample` calls, prefill included (part of `busy_seconds`)."""
    train_seconds: float = 0.0
    """Time in `forward_backward` and `optim_step` calls (part of `busy_seconds`): with
    `sample_seconds`, what a benchmark splits an engine's work into."""
    last_batch_rows: int = 0
    started: float = field(default_factory=time.monotonic)


def first_scored_position(job: SampleJob) -> int:
    """The first prompt position whose logprob a job asks for (position 0 never has one)."""
    if job.prompt_logprobs_last_n is None:
        return 1
    return max(1, len(job.prompt) - job.prompt_logprobs_last_n)


def mask_unscored(result: SampleResult, job: SampleJob) -> SampleResult:
    """`result` with the prompt positions before the requested suffix unscored, for a backend
    that scored the whole prompt: NaN logprobs (the SDK's None) and all-padding top-k rows."""
    first = first_scored_position(job)
    if first <= 1:
        return result
    if result.prompt_logprobs is not None:
        values = np.array(result.prompt_logprobs, dtype=np.float32)
        values[:first] = np.nan
        result.prompt_logprobs = values
    if result.topk_prompt is not None:
        ids, lps = (np.array(a) for a in result.topk_prompt)
        ids[:first], lps[:first] = TOPK_PAD_ID, TOPK_PAD_LOGPROB
        result.topk_prompt = (ids, lps)
    return result
