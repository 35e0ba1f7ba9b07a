"""The checks behind the SDK compatibility report: one probe per method family.

A probe receives the shared `Workspace` (clients, and fixtures such as a trained run and its
checkpoints, built on first use) and a `Call` that invokes the variant under test, `name` or
`name_async`, and settles its answer. The probe calls the server, checks that the answer means
something (lengths, finiteness, round trips, state that changes or is restored) and returns one
sentence saying what it verified; a check that does not hold raises `CheckFailed`.
`UNSUPPORTED` lists, with the reason, the families that have no self-hosted counterpart.
Which methods exist, and the report itself, live in `tools.compat_report`.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import inspect
import itertools
import logging
import math
import os
import typing
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cached_property
from typing import Any

import tinker
from tinker.lib.api_future_impl import QueueState

RANK = 4
LEARNING_RATE = 1e-2
PROMPT = [2, 17, 33, 48, 65, 80, 97, 120]
"""Token ids small enough for any vocabulary the server may serve (tiny test models included)."""
EXACT = 1e-5
"""Tolerance for logprobs that must be identical (same weights, same code path)."""
CROSS_PATH = 2e-3
"""Tolerance between the sampler (KV-cache) path and the training forward."""
CHANGED = 1e-4
"""Smallest logprob change that counts as "the weights changed"."""


class CheckFailed(AssertionError):
    """An answer came back but did not mean what it should."""


def expect(condition: object, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


def family(method: str) -> str:
    return method.removesuffix("_async")


# ---------------------------------------------------------------------- unsupported by design
_CONSOLE = (
    "Links to the hosted Tinker Console web UI; a self-hosted server has no console "
    "(the URL is built on the client and never reaches the server)."
)
_BILLING = "Billing and pricing belong to the hosted service; the server meters nothing."
UNSUPPORTED: dict[tuple[str, str], str] = {
    ("ServiceClient", "get_console_url"): _CONSOLE,
    ("TrainingClient", "get_console_url"): _CONSOLE,
    ("RestClient", "assign_session_project"): (
        "Projects are not modelled: each API key owns its sessions, runs and checkpoints."
    ),
    ("RestClient", "export_session_trace"): (
        "Perfetto timeline exports are built by the hosted service and served from signed URLs."
    ),
    ("RestClient", "whoami"): (
        "Decodes identity claims from a JWT; the server authenticates plain API keys "
        "(`pjwt_auth_enabled` is false), so there is no JWT to read."
    ),
    ("RestClient", "get_audit_log"): "Organization audit logs (projects, teams) are not kept.",
    ("AdminClient", "get_audit_log"): "Organization audit logs (projects, teams) are not kept.",
    ("RestClient", "get_billing_usage"): _BILLING,
    ("AdminClient", "get_billing_usage"): _BILLING,
    ("RestClient", "get_current_checkpoint_storage_usage"): _BILLING,
    ("AdminClient", "get_current_checkpoint_storage_usage"): _BILLING,
}


# -------------------------------------------------------------------------------- invoking
def _settle(value: Any, timeout: float) -> Any:
    """Resolve what a sync method returned: futures are waited on, anything else is the answer."""
    result = getattr(value, "result", None)
    if callable(result) and not isinstance(value, tinker.SamplingClient | tinker.TrainingClient):
        return result(timeout=timeout)
    return value


async def _settle_async(value: Any) -> Any:
    while inspect.isawaitable(value):
        value = await value
    return value


class Call:
    """Invokes one variant (`name` or `name_async`) of the method under test and settles it."""

    def __init__(self, method: str, timeout: float):
        self.method = method
        self.is_async = method.endswith("_async")
        self.timeout = timeout

    def __call__(self, target: Any, *args: Any, **kwargs: Any) -> Any:
        fn = getattr(target, self.method)
        if self.is_async:
            return asyncio.run(asyncio.wait_for(_settle_async(fn(*args, **kwargs)), self.timeout))
        return _settle(fn(*args, **kwargs), self.timeout)

    @property
    def tag(self) -> str:
        """Distinguishes checkpoint names made by the two variants of one method."""
        return "a" if self.is_async else "s"


# ------------------------------------------------------------------------------- workspace
def datum(tokens: list[int] | None = None) -> tinker.Datum:
    tokens = PROMPT if tokens is None else tokens
    return tinker.Datum(
        model_input=tinker.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )


def logprobs_of(output: tinker.ForwardBackwardOutput) -> list[list[float]]:
    return [[float(x) for x in out["logprobs"].tolist()] for out in output.loss_fn_outputs]


def max_diff(a: list[float], b: list[float]) -> float:
    expect(len(a) == len(b), f"length {len(a)} != {len(b)}")
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def checkpoint(rest: tinker.RestClient, path: str) -> tinker.Checkpoint | None:
    run_id = path[len("tinker://") :].split("/", 1)[0]
    for ckpt in rest.list_checkpoints(run_id).result().checkpoints:
        if ckpt.tinker_path == path:
            return ckpt
    return None


class Workspace:
    """Clients and shared fixtures (a trained run, its checkpoints), built on first use.

    Shared fixtures are never mutated by probes; probes that train make their own runs.
    """

    def __init__(self, url: str, api_key: str, timeout: float):
        self.url, self.api_key, self.timeout = url, api_key, timeout
        self.svc = tinker.ServiceClient(base_url=url, api_key=api_key)
        self.rest = tinker.RestClient(base_url=url, api_key=api_key)
        self._names = itertools.count()

    def close(self) -> None:
        self.svc.close("success").result(timeout=self.timeout)

    def name(self, stem: str) -> str:
        return f"{stem}-{next(self._names)}"

    @cached_property
    def base_model(self) -> str:
        models = self.rest.get_server_capabilities().result().supported_models
        expect(models and models[0].model_name, "the server lists no model")
        return str(models[0].model_name)

    def new_training(self, seed: int = 0) -> tinker.TrainingClient:
        return self.svc.create_lora_training_client(
            base_model=self.base_model, rank=RANK, seed=seed
        ).result()

    def forward(self, tc: tinker.TrainingClient) -> list[float]:
        return logprobs_of(tc.forward([datum()], "cross_entropy").result())[0]

    def step(self, tc: tinker.TrainingClient) -> None:
        tc.forward_backward([datum()], "cross_entropy").result()
        tc.optim_step(tinker.AdamParams(learning_rate=LEARNING_RATE)).result()

    def sampler_logprobs(self, sampler: tinker.SamplingClient) -> list[float]:
        """The prompt's logprobs under `sampler`, aligned with `forward` (position 0 dropped)."""
        values = sampler.compute_logprobs(tinker.ModelInput.from_ints(PROMPT)).result()
        return [float(v) for v in values[1:]]

    @cached_property
    def scratch(self) -> tinker.TrainingClient:
        """A run that is never stepped: its weights stay those of the base model."""
        return self.new_training()

    @cached_property
    def trained(self) -> tinker.TrainingClient:
        tc = self.new_training()
        self.step(tc)
        return tc

    @cached_property
    def trained_logprobs(self) -> list[float]:
        return self.forward(self.trained)

    @cached_property
    def two_step_logprobs(self) -> list[float]:
        """Logprobs after two steps from the same start as `trained`: what a run restored from
        `trained_state_path` with its optimizer state must reach after one more step."""
        tc = self.new_training()
        self.step(tc)
        self.step(tc)
        return self.forward(tc)

    @cached_property
    def trained_state_path(self) -> str:
        return self.trained.save_state(self.name("trained")).result().path

    @cached_property
    def trained_sampler_path(self) -> str:
        return self.trained.save_weights_for_sampler(self.name("trained-sampler")).result().path

    @cached_property
    def base_sampler(self) -> tinker.SamplingClient:
        return self.svc.create_sampling_client(base_model=self.base_model).result()

    @cached_property
    def base_logprobs(self) -> list[float]:
        return self.forward(self.scratch)

    @cached_property
    def session_id(self) -> str:
        """The session that owns the shared runs, found through the REST surface."""
        run_id = self.trained.get_info().model_id
        for session_id in self.rest.list_sessions(limit=10_000).result().sessions:
            if run_id in self.rest.get_session(session_id).result().training_run_ids:
                return session_id
        raise CheckFailed(f"no session lists training run {run_id}")

    def expect_trained(self, sampler: tinker.SamplingClient, what: str) -> None:
        """`sampler` serves the shared trained weights, not the base model's."""
        got = self.sampler_logprobs(sampler)
        diff = max_diff(got, self.trained_logprobs)
        expect(diff < CROSS_PATH, f"{what}: logprobs differ from the trained run's by {diff:.2e}")
        expect(
            max_diff(got, self.base_logprobs) > CHANGED,
            f"{what}: logprobs are the base model's, not the trained weights'",
        )


# ---------------------------------------------------------------------------------- probes
Probe = Callable[[Workspace, Call], str]
PROBES: dict[tuple[str, str], Probe] = {}


def probe(client: str, *families: str) -> Callable[[Probe], Probe]:
    """Register a checker for one or more method families (`name` and `name_async`)."""

    def register(fn: Probe) -> Probe:
        for name in families:
            PROBES[(client, name)] = fn
        return fn

    return register


def _client_side_telemetry(ws: Workspace, call: Call, target: Any) -> str:
    value = call(target)
    expect(value is None or hasattr(value, "log"), f"unexpected telemetry object {value!r}")
    return (
        "Client-side accessor: the SDK's telemetry object (None when TINKER_TELEMETRY=0); "
        "the server accepts `/telemetry` batches."
    )


# ServiceClient ---------------------------------------------------------------------------
@probe("ServiceClient", "create_lora_training_client")
def _create_lora(ws: Workspace, call: Call) -> str:
    meta = {"probe": f"create-{call.tag}"}
    tc = call(ws.svc, base_model=ws.base_model, rank=RANK, seed=3, user_metadata=meta)
    info = tc.get_info()
    expect(info.lora_rank == RANK, f"get_info lora_rank {info.lora_rank} != {RANK}")
    run = ws.rest.get_training_run(info.model_id).result()
    expect(
        run.lora_rank == RANK and run.user_metadata == meta,
        f"training run reports rank {run.lora_rank}, metadata {run.user_metadata}",
    )
    return "New run reports the requested rank and user_metadata (get_info, get_training_run)."


@probe("ServiceClient", "create_sampling_client")
def _service_sampler(ws: Workspace, call: Call) -> str:
    base = call(ws.svc, base_model=ws.base_model)
    got = ws.sampler_logprobs(base)
    expect(max_diff(got, ws.base_logprobs) < CROSS_PATH, "base sampler disagrees with a forward")
    ws.expect_trained(call(ws.svc, model_path=ws.trained_sampler_path), "model_path sampler")
    return (
        "`base_model=` samples the base model; `model_path=` serves the saved sampler weights "
        "(prompt logprobs match the trained run's forward)."
    )


@probe("ServiceClient", "create_training_client_from_state")
def _from_state(ws: Workspace, call: Call) -> str:
    tc = call(ws.svc, ws.trained_state_path)
    info = tc.get_info()
    expect(info.model_id != ws.trained.get_info().model_id, "the restored run reuses the source id")
    expect(info.lora_rank == RANK, f"restored rank {info.lora_rank} != {RANK}")
    diff = max_diff(ws.forward(tc), ws.trained_logprobs)
    expect(diff < EXACT, f"restored logprobs differ from the saved run's by {diff:.2e}")
    return "A new run with the checkpoint's rank and identical logprobs."


@probe("ServiceClient", "create_training_client_from_state_with_optimizer")
def _from_state_with_optimizer(ws: Workspace, call: Call) -> str:
    restored = call(ws.svc, ws.trained_state_path)
    ws.step(restored)
    diff = max_diff(ws.forward(restored), ws.two_step_logprobs)
    expect(diff < EXACT, f"the next step differs from an uninterrupted run's by {diff:.2e}")
    return (
        "One more step from the restored run matches an uninterrupted run's second step "
        "exactly (weights and AdamW moments restored)."
    )


@probe("ServiceClient", "get_server_capabilities")
def _service_capabilities(ws: Workspace, call: Call) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        caps = call(ws.svc)
    model = caps.supported_models[0]
    expect(model.model_name == ws.base_model, f"model {model.model_name} != {ws.base_model}")
    expect((model.max_context_length or 0) > len(PROMPT), "no usable max_context_length")
    return "Lists the served model with its context length."


@probe("ServiceClient", "create_rest_client")
def _create_rest(ws: Workspace, call: Call) -> str:
    rest = call(ws.svc)
    expect(isinstance(rest, tinker.RestClient), f"got {type(rest).__name__}")
    expect(checkpoint(rest, ws.trained_state_path) is not None, "the client cannot see our runs")
    return "A RestClient with the same credentials (sees this key's checkpoints)."


@probe("ServiceClient", "create_custom_loss")
def _custom_loss(ws: Workspace, call: Call) -> str:
    def neg_ll(logprobs, weights):
        loss = -(logprobs * weights).sum()
        return loss, {"custom/neg_ll:sum": loss}

    handle = call(ws.svc, neg_ll, {"logprobs": 1, "weights": 1})
    out = ws.scratch.forward_backward_custom([datum()], handle).result()
    expected = -sum(ws.base_logprobs)
    got = out.metrics.get("custom/neg_ll:sum")
    expect(
        got is not None and abs(got - expected) < 1e-3 * max(1.0, abs(expected)),
        f"custom metric {got} != {expected}",
    )
    return (
        "Traced loss runs client-side (`custom_loss_server_side` is off) through "
        "forward_backward_custom; its metric equals the negative log-likelihood."
    )


@probe("ServiceClient", "close")
def _close(ws: Workspace, call: Call) -> str:
    svc = tinker.ServiceClient(base_url=ws.url, api_key=ws.api_key)
    run_id = (
        svc.create_lora_training_client(base_model=ws.base_model, rank=RANK)
        .result()
        .get_info()
        .model_id
    )
    expect(call(svc, "success") is None, "close answered something")
    session_id = run_id.split(":", 1)[0]
    sessions = ws.rest.list_sessions(limit=10_000).result().sessions
    expect(
        any(run_id in ws.rest.get_session(s).result().training_run_ids for s in sessions),
        f"the closed session {session_id} lost its run",
    )
    return "Finishes the session (`/sessions/{id}/finish`); its runs stay listed."


@probe("ServiceClient", "get_telemetry")
def _service_telemetry(ws: Workspace, call: Call) -> str:
    return _client_side_telemetry(ws, call, ws.svc)


@probe("ServiceClient", "copy_weights")
def _service_copy(ws: Workspace, call: Call) -> str:
    svc = tinker.ServiceClient(base_url=ws.url, api_key=ws.api_key, project_id="compat")
    copied = _check_copy(ws, ws.trained_state_path, call(svc, ws.trained_state_path))
    diff = max_diff(
        ws.forward(ws.svc.create_training_client_from_state(copied).result()), ws.trained_logprobs
    )
    expect(diff < EXACT, f"a run restored from the copy differs by {diff:.2e}")
    return (
        "Copies a state checkpoint within the server (projects are not modelled: "
        "`project_id` is recorded on the copy's run); a run restored from the copy has "
        "identical logprobs."
    )


def _check_copy(ws: Workspace, source: str, copied: str) -> str:
    expect(copied != source and copied.startswith("tinker://"), f"copy path {copied!r}")
    expect(copied.rsplit("/", 2)[-2] == source.rsplit("/", 2)[-2], "the copy changed kind")
    expect(checkpoint(ws.rest, copied) is not None, "the copy is not listed")
    return copied


# TrainingClient --------------------------------------------------------------------------
@probe("TrainingClient", "forward")
def _forward(ws: Workspace, call: Call) -> str:
    lps = logprobs_of(call(ws.scratch, [datum()], "cross_entropy"))
    expect(len(lps) == 1 and len(lps[0]) == len(PROMPT) - 1, "wrong logprobs shape")
    expect(all(math.isfinite(x) and x <= 0 for x in lps[0]), "logprobs not finite and <= 0")
    expect(max_diff(lps[0], ws.base_logprobs) < EXACT, "forward is not repeatable")
    return "Per-datum logprobs of the target length, finite and <= 0, repeatable."


@probe("TrainingClient", "forward_backward")
def _forward_backward(ws: Workspace, call: Call) -> str:
    out = call(ws.scratch, [datum(), datum(PROMPT[:5])], "cross_entropy")
    lps = logprobs_of(out)
    lengths = [len(x) for x in lps]
    expect(lengths == [len(PROMPT) - 1, 4], f"logprob lengths {lengths}")
    loss = out.metrics.get("loss:sum")
    expect(loss is not None and math.isfinite(loss), f"loss:sum is {loss}")
    expected = -sum(sum(x) for x in lps)
    expect(abs(loss - expected) < 1e-3 * max(1.0, abs(expected)), f"loss:sum {loss} != {expected}")
    expect(max_diff(lps[0], ws.base_logprobs) < EXACT, "logprobs disagree with forward")
    prompt = len(PROMPT) // 2  # a prompt that weighs 0, as in an SFT example
    weighted = tinker.Datum(
        model_input=tinker.ModelInput.from_ints(PROMPT[:-1]),
        loss_fn_inputs={
            "target_tokens": PROMPT[1:],
            "weights": [0.0] * prompt + [1.0] * (len(PROMPT) - 1 - prompt),
        },
    )
    [masked] = logprobs_of(call(ws.scratch, [weighted], "cross_entropy"))
    expect(all(x == 0.0 for x in masked[:prompt]), "unweighted positions are not 0.0")
    expect(max_diff(masked[prompt:], ws.base_logprobs[prompt:]) < EXACT,
           "weighted logprobs disagree with forward")
    losses = _rl_losses(ws)
    return (
        "Per-datum logprobs of each datum's length; finite loss:sum = -sum(weights * logprobs). "
        "Positions the loss reads nothing at (weight 0; no advantage and no sampled logprob) "
        "skip the output head and return 0.0; `forward` scores every position. "
        f"Every built-in RL loss ({losses}) equals its closed form on samples taken with "
        "record_stability_info=True (stable_reinforce through provenance spans)."
    )


def _rl_losses(ws: Workspace) -> str:
    """Every built-in RL loss the SDK names, on two sequences sampled from the untrained run's
    own snapshot (so every importance ratio is 1): each loss must equal its closed form."""
    sampler = ws.scratch.save_weights_and_get_sampling_client(record_stability_info=True).result()
    params = tinker.SamplingParams(max_tokens=4, temperature=1.0, seed=5, stop=[])
    seqs = sampler.sample(tinker.ModelInput.from_ints(PROMPT[:4]), 2, params).result().sequences
    data, expected_is, expected_lp = [], 0.0, 0.0
    for seq, advantage in zip(seqs, (1.0, -0.5), strict=True):
        n_prompt, n = 4, len(seq.tokens)
        pad = n_prompt - 1
        inputs = {
            "target_tokens": [0] * pad + list(seq.tokens),
            "logprobs": [0.0] * pad + [float(x) for x in seq.logprobs],
            "advantages": [0.0] * pad + [advantage] * n,
            "sequence_ratio_mask": [0.0] * pad + [1.0] * n,
        }
        sid = seq.sequence_id
        data.append(
            tinker.Datum(
                model_input=tinker.ModelInput.from_ints(PROMPT[:4] + list(seq.tokens[:-1])),
                loss_fn_inputs=inputs,
            ).with_provenance(
                model_input=[tinker.PromptProvenanceSpan(sequence_id=sid, length=n_prompt),
                             tinker.SampledProvenanceSpan(sequence_id=sid, length=n - 1)],
                loss_fn_inputs=[
                    tinker.PromptProvenanceSpan(sequence_id=sid, offset=1, length=pad),
                    tinker.SampledProvenanceSpan(sequence_id=sid, length=n),
                ],
            )
        )
        expected_is -= advantage * n
        expected_lp -= advantage * sum(float(x) for x in seq.logprobs)
    closed_form = {
        "importance_sampling": expected_is,
        "ppo": expected_is,
        "gspo": expected_is,
        "cispo": expected_lp,
        "dro": expected_lp,
        "stable_reinforce": expected_lp,
    }
    config = {"dro": {"beta": 0.05}}
    for loss_fn in typing.get_args(tinker.types.LossFnType):
        if loss_fn in ("cross_entropy", "custom"):
            continue  # cross_entropy is checked above; custom losses have their own method
        expect(loss_fn in closed_form, f"no closed form for the SDK's loss {loss_fn!r}")
        out = ws.scratch.forward(data, loss_fn, config.get(loss_fn)).result()
        loss = out.metrics.get("loss:sum")
        want = closed_form[loss_fn]
        if loss_fn == "dro":  # its quadratic term counts at every position, prompt included
            for d, lps in zip(data, logprobs_of(out), strict=True):
                q = d.loss_fn_inputs["logprobs"].tolist()
                want += 0.5 * 0.05 * sum((lp - s) ** 2 for lp, s in zip(lps, q, strict=True))
        expect(
            loss is not None and abs(loss - want) < 1e-2 * max(1.0, abs(want)),
            f"{loss_fn}: loss:sum {loss} != {want}",
        )
    return ", ".join(closed_form)


@probe("TrainingClient", "forward_backward_custom")
def _forward_backward_custom(ws: Workspace, call: Call) -> str:
    def nll(data, logprobs_list):
        loss = sum(-lp.sum() for lp in logprobs_list)
        return loss, {"nll:sum": float(loss)}

    tc = ws.new_training()
    out = call(tc, [datum()], nll)
    expect(len(logprobs_of(out)[0]) == len(PROMPT) - 1, "wrong logprobs length")
    expect(abs(out.metrics["nll:sum"] + sum(ws.base_logprobs)) < 1e-3, "custom metric is off")
    tc.optim_step(tinker.AdamParams(learning_rate=LEARNING_RATE)).result()
    diff = max_diff(ws.forward(tc), ws.trained_logprobs)
    expect(diff < 1e-4, f"a custom NLL step differs from a cross_entropy step by {diff:.2e}")
    return (
        "A custom NLL gives the right metric, and the step it drives matches a built-in "
        "cross_entropy step (gradients flow through the surrogate weights)."
    )


@probe("TrainingClient", "optim_step")
def _optim_step(ws: Workspace, call: Call) -> str:
    tc = ws.new_training()
    tc.forward_backward([datum()], "cross_entropy").result()
    result = call(tc, tinker.AdamParams(learning_rate=LEARNING_RATE))
    expect(isinstance(result.metrics or {}, dict), "metrics is not a dict")
    after = ws.forward(tc)
    expect(max_diff(after, ws.base_logprobs) > CHANGED, "logprobs did not change after the step")
    expect(sum(after) > sum(ws.base_logprobs), "the step did not lower the loss on its batch")
    expect(max_diff(after, ws.trained_logprobs) < EXACT, "the same step is not reproducible")
    return (
        "Subsequent logprobs change, the loss on the trained batch goes down, and the same "
        "step from the same seed is reproducible."
    )


@probe("TrainingClient", "save_state")
def _save_state(ws: Workspace, call: Call) -> str:
    name = ws.name(f"save-state-{call.tag}")
    path = call(ws.scratch, name, ttl_seconds=7200, user_metadata={"k": "v"}).path
    run_id = ws.scratch.get_info().model_id
    expect(path == f"tinker://{run_id}/weights/{name}", f"unexpected path {path}")
    ckpt = checkpoint(ws.rest, path)
    expect(ckpt is not None, "list_checkpoints does not contain the saved path")
    expect(ckpt.checkpoint_type == "training", f"checkpoint_type {ckpt.checkpoint_type}")
    expect(
        ckpt.expires_at is not None and ckpt.user_metadata == {"k": "v"},
        "ttl_seconds / user_metadata were not recorded",
    )
    return "Returns tinker://<run>/weights/<name>; list_checkpoints has it with TTL and metadata."


@probe("TrainingClient", "save_weights_for_sampler")
def _save_for_sampler(ws: Workspace, call: Call) -> str:
    name = ws.name(f"sampler-{call.tag}")
    path = call(ws.trained, name).path
    run_id = ws.trained.get_info().model_id
    expect(path == f"tinker://{run_id}/sampler_weights/{name}", f"unexpected path {path}")
    ckpt = checkpoint(ws.rest, path)
    expect(ckpt is not None and ckpt.checkpoint_type == "sampler", "not listed as a sampler")
    ws.expect_trained(ws.svc.create_sampling_client(model_path=path).result(), "saved sampler")
    return "Returns tinker://<run>/sampler_weights/<name>; a sampler on it serves those weights."


@probe("TrainingClient", "save_weights_and_get_sampling_client")
def _save_and_sample(ws: Workspace, call: Call) -> str:
    ws.expect_trained(call(ws.trained), "snapshot sampler")
    return "The snapshot sampler's prompt logprobs match the trained run's forward."


@probe("TrainingClient", "create_sampling_client")
def _training_sampler(ws: Workspace, call: Call) -> str:
    ws.expect_trained(call(ws.trained, ws.trained_sampler_path), "sampler from path")
    return "A sampler on a saved sampler path serves those weights."


@probe("TrainingClient", "load_state")
def _load_state(ws: Workspace, call: Call) -> str:
    tc = ws.new_training()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        call(tc, ws.trained_state_path)
    diff = max_diff(ws.forward(tc), ws.trained_logprobs)
    expect(diff < EXACT, f"after load_state logprobs differ from the saved run's by {diff:.2e}")
    return "A fresh run that loads a trained checkpoint has identical logprobs."


@probe("TrainingClient", "load_state_with_optimizer")
def _load_state_with_optimizer(ws: Workspace, call: Call) -> str:
    tc = ws.new_training()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        call(tc, ws.trained_state_path)
    ws.step(tc)
    diff = max_diff(ws.forward(tc), ws.two_step_logprobs)
    expect(diff < EXACT, f"the next step differs from an uninterrupted run's by {diff:.2e}")
    return (
        "One more step after loading matches an uninterrupted run's second step exactly "
        "(weights and AdamW moments restored)."
    )


@probe("TrainingClient", "save_weights_external")
def _save_weights_external(ws: Workspace, call: Call) -> str:
    name = ws.name(f"export-{call.tag}")
    path = call(ws.trained, name, ttl_seconds=3600).path
    run_id = ws.trained.get_info().model_id
    expect(path == f"tinker://{run_id}/external_weights/{name}", f"unexpected path {path}")
    ckpt = checkpoint(ws.rest, path)
    expect(ckpt is not None and ckpt.checkpoint_type == "external", "not listed as external")
    expect(ckpt.expires_at is not None, "ttl_seconds was not recorded")
    return "Returns tinker://<run>/external_weights/<name>, listed as an external checkpoint."


@probe("TrainingClient", "get_info")
def _get_info(ws: Workspace, call: Call) -> str:
    info = call(ws.trained)
    expect(info.model_id and info.lora_rank == RANK, f"id {info.model_id}, rank {info.lora_rank}")
    expect(info.model_data.model_name == ws.base_model, f"model_name {info.model_data.model_name}")
    return "Run id, LoRA rank and base model name."


@probe("TrainingClient", "get_tokenizer")
def _training_tokenizer(ws: Workspace, call: Call) -> str:
    return _check_tokenizer(call(ws.trained))


def _check_tokenizer(tokenizer: Any) -> str:
    ids = tokenizer.encode("select name from users")
    expect(ids, "the tokenizer encodes nothing")
    text = tokenizer.decode(ids, skip_special_tokens=True)
    expect("select" in text and "users" in text, f"decode round trip gave {text!r}")
    return "Loads locally (the server reports its tokenizer path) and round-trips text."


@probe("TrainingClient", "get_telemetry")
def _training_telemetry(ws: Workspace, call: Call) -> str:
    return _client_side_telemetry(ws, call, ws.trained)


# SamplingClient --------------------------------------------------------------------------
@probe("SamplingClient", "sample")
def _sample(ws: Workspace, call: Call) -> str:
    prompt = tinker.ModelInput.from_ints(PROMPT)
    params = tinker.SamplingParams(max_tokens=4, temperature=1.0, seed=11)
    first = call(ws.base_sampler, prompt, num_samples=2, sampling_params=params)
    expect(len(first.sequences) == 2, f"{len(first.sequences)} sequences for num_samples=2")
    for seq in first.sequences:
        expect(1 <= len(seq.tokens) <= 4, f"{len(seq.tokens)} tokens for max_tokens=4")
        expect(
            seq.logprobs is not None and len(seq.logprobs) == len(seq.tokens),
            "logprobs missing or of a different length than tokens",
        )
        expect(all(math.isfinite(x) and x <= 0 for x in seq.logprobs), "logprobs not finite <= 0")
    again = call(ws.base_sampler, prompt, num_samples=2, sampling_params=params)
    expect(
        [s.tokens for s in again.sequences] == [s.tokens for s in first.sequences],
        "the same seed gave different tokens",
    )
    seq = first.sequences[0]
    scored = ws.base_sampler.compute_logprobs(
        tinker.ModelInput.from_ints(PROMPT + list(seq.tokens))
    ).result()[len(PROMPT) :]
    diff = max_diff([float(x) for x in scored], [float(x) for x in seq.logprobs])
    expect(diff < CROSS_PATH, f"sampled logprobs differ from re-scored ones by {diff:.2e}")
    return (
        "num_samples sequences, each <= max_tokens with one logprob per token; a seed "
        "repeats; sampled logprobs equal the model's when re-scored."
    )


@probe("SamplingClient", "compute_logprobs")
def _compute_logprobs(ws: Workspace, call: Call) -> str:
    values = call(ws.base_sampler, tinker.ModelInput.from_ints(PROMPT))
    expect(len(values) == len(PROMPT), f"{len(values)} logprobs for {len(PROMPT)} tokens")
    expect(values[0] is None, f"first position is {values[0]!r}, not None")
    rest = [float(v) for v in values[1:]]
    expect(all(math.isfinite(x) and x <= 0 for x in rest), "logprobs not finite and <= 0")
    diff = max_diff(rest, ws.base_logprobs)
    expect(diff < CROSS_PATH, f"differs from a training forward by {diff:.2e}")
    # The SDK itself fails the call if earlier positions come back scored.
    last = call(ws.base_sampler, tinker.ModelInput.from_ints(PROMPT), prompt_logprobs_last_n=3)
    expect(len(last) == len(PROMPT) and all(v is None for v in last[:-3]),
           f"prompt_logprobs_last_n=3 scored {sum(v is not None for v in last)} positions")
    diff = max_diff([float(v) for v in last[-3:]], rest[-3:])
    expect(diff < CROSS_PATH, f"the last 3 differ from the whole prompt's by {diff:.2e}")
    return ("None, then one float per prompt token, equal to a training forward's logprobs; "
            "with prompt_logprobs_last_n=3, None but for the last 3, which equal those.")


@probe("SamplingClient", "get_base_model")
def _get_base_model(ws: Workspace, call: Call) -> str:
    name = call(ws.base_sampler)
    expect(name == ws.base_model, f"{name} != {ws.base_model}")
    return "The served base model's name."


@probe("SamplingClient", "get_tokenizer")
def _sampler_tokenizer(ws: Workspace, call: Call) -> str:
    """The SDK loads this tokenizer by base-model name alone (a SamplingClient has no
    tokenizer_id). A Hub id is first installed from the server into the Hugging Face cache,
    as docs/cookbook.md tells clients to."""
    how = "by base-model name (a local directory here)"
    if ws.base_model.count("/") == 1 and not os.path.exists(ws.base_model):
        from server.entrypoints.install_tokenizer import install_tokenizer

        install_tokenizer(ws.url, ws.api_key)
        how = (
            f"by Hub id ({ws.base_model}) after `autoresearch-install-tokenizer` installed "
            "the server's tokenizer into the Hugging Face cache"
        )
    _check_tokenizer(call(ws.base_sampler))
    return f"Loads {how} and round-trips text."


@probe("SamplingClient", "create")
def _sampler_create(ws: Workspace, call: Call) -> str:
    sampler = call(tinker.SamplingClient, ws.svc.holder, model_path=ws.trained_sampler_path)
    ws.expect_trained(sampler, "SamplingClient.create")
    return "Low-level constructor over a ServiceClient's holder; serves the given weights."


@probe("SamplingClient", "get_sampler_handle", "from_sampler_handle")
def _sampler_handle(ws: Workspace, call: Call) -> str:
    sampler = ws.svc.create_sampling_client(model_path=ws.trained_sampler_path).result()
    if call.method == "get_sampler_handle":
        handle = call(sampler)
        expect(
            ws.api_key not in base64.urlsafe_b64decode(handle).decode(),
            "the handle carries the API key",
        )
        clone = tinker.SamplingClient.from_sampler_handle(handle, api_key=ws.api_key)
    else:
        clone = call(tinker.SamplingClient, sampler.get_sampler_handle(), api_key=ws.api_key)
    ws.expect_trained(clone, "client from handle")
    return "A handle without credentials; the client rebuilt from it samples the same weights."


@probe("SamplingClient", "on_queue_state_change")
def _queue_state(ws: Workspace, call: Call) -> str:
    with _captured("tinker") as records:
        call(ws.base_sampler, QueueState.PAUSED_CAPACITY, "compat check")
    expect(any("compat check" in r.getMessage() for r in records), "no paused-queue warning")
    return (
        "Client-side hook fed by `queue_state` in long-poll answers; this server always "
        "reports `active` (it queues instead of pausing). A paused state is logged."
    )


@probe("SamplingClient", "get_telemetry")
def _sampler_telemetry(ws: Workspace, call: Call) -> str:
    return _client_side_telemetry(ws, call, ws.base_sampler)


@contextmanager
def _captured(logger_name: str) -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler, logger = Keep(logging.WARNING), logging.getLogger(logger_name)
    level = logger.level  # a caller (e.g. a command line) may have silenced the SDK's warnings
    logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


# RestClient ------------------------------------------------------------------------------
@probe("RestClient", "get_server_capabilities")
def _rest_capabilities(ws: Workspace, call: Call) -> str:
    model = call(ws.rest).supported_models[0]
    expect(
        model.model_name == ws.base_model and model.trainable and model.sampleable,
        f"capabilities report {model}",
    )
    return "The served model, trainable and sampleable, with its context length."


@probe("RestClient", "get_training_run")
def _get_training_run(ws: Workspace, call: Call) -> str:
    state, sampler = ws.trained_state_path, ws.trained_sampler_path
    run_id = ws.trained.get_info().model_id
    run = call(ws.rest, run_id)
    expect(
        run.training_run_id == run_id and run.lora_rank == RANK,
        f"got id {run.training_run_id}, rank {run.lora_rank}",
    )
    expect(run.base_model == ws.base_model and run.is_lora, "wrong base model or not LoRA")
    expect(
        run.last_checkpoint is not None and run.last_checkpoint.tinker_path == state,
        "last_checkpoint is not the run's state checkpoint",
    )
    expect(
        run.last_sampler_checkpoint is not None
        and run.last_sampler_checkpoint.checkpoint_type == "sampler"
        and checkpoint(ws.rest, sampler) is not None,
        "last_sampler_checkpoint missing",
    )
    return "Right id, rank and base model; last_checkpoint / last_sampler_checkpoint filled."


@probe("RestClient", "get_training_run_by_tinker_path")
def _run_by_path(ws: Workspace, call: Call) -> str:
    run = call(ws.rest, ws.trained_state_path)
    expect(run.training_run_id == ws.trained.get_info().model_id, "wrong run for the path")
    return "Resolves a checkpoint path to its run."


@probe("RestClient", "get_weights_info_by_tinker_path")
def _weights_info(ws: Workspace, call: Call) -> str:
    info = call(ws.rest, ws.trained_state_path)
    expect(
        info.lora_rank == RANK and info.base_model == ws.base_model,
        f"rank {info.lora_rank}, base {info.base_model}",
    )
    return "Reports the checkpoint's LoRA rank and base model."


@probe("RestClient", "list_checkpoints")
def _list_checkpoints(ws: Workspace, call: Call) -> str:
    run_id = ws.trained.get_info().model_id
    paths = {c.tinker_path for c in call(ws.rest, run_id).checkpoints}
    expect({ws.trained_state_path, ws.trained_sampler_path} <= paths, f"listed {sorted(paths)}")
    return "Contains the run's state and sampler checkpoints."


@probe("RestClient", "list_user_checkpoints")
def _list_user_checkpoints(ws: Workspace, call: Call) -> str:
    path = ws.scratch.save_state(ws.name(f"user-{call.tag}")).result().path
    page = call(ws.rest, limit=100, offset=0)
    expect(path in {c.tinker_path for c in page.checkpoints}, "the newest checkpoint is missing")
    expect(page.cursor is not None and page.cursor.total_count >= 1, "no cursor")
    return "Newest first, with a cursor; contains a just-saved checkpoint."


@probe("RestClient", "list_training_runs")
def _list_runs(ws: Workspace, call: Call) -> str:
    run_id, offset, seen = ws.trained.get_info().model_id, 0, set()
    while True:
        page = call(ws.rest, limit=50, offset=offset)
        seen |= {r.training_run_id for r in page.training_runs}
        offset += 50
        if run_id in seen or not page.training_runs:
            break
    expect(run_id in seen, f"{run_id} is not listed")
    expect(page.cursor.total_count >= len(seen), "cursor total_count is short")
    return "Pages with a cursor; lists this key's runs."


@probe("RestClient", "list_sessions")
def _list_sessions(ws: Workspace, call: Call) -> str:
    sessions = call(ws.rest, limit=10_000).sessions
    expect(ws.session_id in sessions, "our session is not listed")
    return "Lists this key's sessions."


@probe("RestClient", "get_session")
def _get_session(ws: Workspace, call: Call) -> str:
    ws.svc.create_sampling_client(model_path=ws.trained_sampler_path).result()
    session = call(ws.rest, ws.session_id)
    expect(ws.trained.get_info().model_id in session.training_run_ids, "run missing")
    expect(session.sampler_ids, "no sampler ids")
    return "The session's training runs and samplers."


@probe("RestClient", "search_sessions")
def _search_sessions(ws: Workspace, call: Call) -> str:
    from tinker.types import ClientFinishedSessionStatusQuery, SessionSearchRequest

    mine = ws.session_id
    found = call(ws.rest, SessionSearchRequest(session_id=mine))
    expect([s.session_id for s in found.sessions] == [mine], "the exact session id did not match")
    expect(found.sessions[0].checkpoints_count >= 1, "checkpoints of the session not counted")
    finished = call(ws.rest, SessionSearchRequest(
        session_id=mine, statuses=[ClientFinishedSessionStatusQuery()]))
    expect(not finished.sessions, "a running session matched a finished-status filter")
    page = call(ws.rest, SessionSearchRequest(limit=1))
    expect(len(page.sessions) == 1, f"{len(page.sessions)} sessions for limit=1")
    if page.next_cursor is not None:
        more = call(ws.rest, SessionSearchRequest(limit=1, cursor=page.next_cursor))
        expect(all(s.session_id != page.sessions[0].session_id for s in more.sessions),
               "the next page repeats the first")
    return (
        "The key's own sessions (there are no projects or organisations): exact id, status "
        "filter, newest first, paging by cursor, checkpoints counted."
    )


@probe("RestClient", "get_sampler")
def _get_sampler(ws: Workspace, call: Call) -> str:
    ws.svc.create_sampling_client(model_path=ws.trained_sampler_path).result()
    for sampler_id in ws.rest.get_session(ws.session_id).result().sampler_ids:
        answer = call(ws.rest, sampler_id)
        if answer.model_path == ws.trained_sampler_path:
            expect(answer.base_model == ws.base_model, f"base model {answer.base_model}")
            return "Reports a sampler's base model and the model_path it was created from."
    raise CheckFailed("no sampler reports the model_path it was created from")


def _own_checkpoint(ws: Workspace, stem: str) -> str:
    return ws.scratch.save_state(ws.name(stem)).result().path


@probe("RestClient", "delete_checkpoint", "delete_checkpoint_from_tinker_path")
def _delete(ws: Workspace, call: Call) -> str:
    path = _own_checkpoint(ws, f"delete-{call.tag}")
    run_id, kind, name = path[len("tinker://") :].split("/")
    if family(call.method) == "delete_checkpoint":
        call(ws.rest, run_id, f"{kind}/{name}")
    else:
        call(ws.rest, path)
    expect(checkpoint(ws.rest, path) is None, "the checkpoint is still listed")
    try:
        ws.svc.create_training_client_from_state(path).result()
    except Exception:  # noqa: BLE001 - the expected outcome
        return "Removes the checkpoint: no longer listed, and loading it fails."
    raise CheckFailed("a deleted checkpoint still loads")


@probe("RestClient", "publish_checkpoint_from_tinker_path", "unpublish_checkpoint_from_tinker_path")
def _publish(ws: Workspace, call: Call) -> str:
    path = _own_checkpoint(ws, f"publish-{call.tag}")
    publishing = family(call.method).startswith("publish")
    if not publishing:
        ws.rest.publish_checkpoint_from_tinker_path(path).result()
        expect(checkpoint(ws.rest, path).public, "publish did not set public")
    call(ws.rest, path)
    expect(checkpoint(ws.rest, path).public is publishing, "`public` did not flip")
    return f"Sets `public` to {publishing} in list_checkpoints."


@probe("RestClient", "set_checkpoint_ttl_from_tinker_path")
def _ttl(ws: Workspace, call: Call) -> str:
    path = _own_checkpoint(ws, f"ttl-{call.tag}")
    call(ws.rest, path, 3600)
    expires = checkpoint(ws.rest, path).expires_at
    expect(expires is not None, "expires_at not set")
    delta = (expires - dt.datetime.now(dt.UTC)).total_seconds()
    expect(3400 < delta <= 3600, f"expires_at is {delta:.0f} s away, not ~3600 s")
    call(ws.rest, path, None)
    expect(checkpoint(ws.rest, path).expires_at is None, "ttl None did not clear expires_at")
    return "Sets expires_at to now + TTL; None clears it."


@probe("RestClient", "copy_weights")
def _rest_copy(ws: Workspace, call: Call) -> str:
    copied = _check_copy(
        ws, ws.trained_sampler_path, call(ws.rest, ws.trained_sampler_path, "compat")
    )
    ws.expect_trained(ws.svc.create_sampling_client(model_path=copied).result(), "copied weights")
    return (
        "Copies a sampler checkpoint into a new run of the caller's (projects are not "
        "modelled); a sampler on the copy serves the same weights."
    )


@probe("RestClient", "get_external_weights_urls")
def _external_urls(ws: Workspace, call: Call) -> str:
    import httpx
    from safetensors.numpy import load as load_safetensors

    path = ws.trained.save_weights_external(ws.name(f"urls-{call.tag}")).result().path
    answer = call(ws.rest, path)
    expect(
        set(answer.urls) == {"adapter_config.json", "adapter_model.safetensors"},
        f"files {sorted(answer.urls)}",
    )
    expect(answer.expires > dt.datetime.now(dt.UTC), f"URLs expire in the past ({answer.expires})")
    files = {}
    for name, url in answer.urls.items():
        response = httpx.get(url, timeout=ws.timeout)  # no API key: the URL is the credential
        expect(response.status_code == 200, f"GET {name}: HTTP {response.status_code}")
        files[name] = response.content
    tensors = load_safetensors(files["adapter_model.safetensors"])
    expect(any(".lora_A." in k for k in tensors), "the download holds no LoRA tensors")
    marker = "/api/v1/external_weights/"
    tampered = answer.urls["adapter_config.json"].replace(marker, marker + "x")
    expect(httpx.get(tampered, timeout=ws.timeout).status_code >= 400, "a tampered URL worked")
    return (
        "One signed URL per file of the PEFT adapter, fetched without a key; the files load "
        "(LoRA tensors present) and a tampered URL is refused."
    )


@probe("RestClient", "get_telemetry")
def _rest_telemetry(ws: Workspace, call: Call) -> str:
    return _client_side_telemetry(ws, call, ws.rest)


@probe("AdminClient", "get_telemetry")
def _admin_telemetry(ws: Workspace, call: Call) -> str:
    admin = tinker.AdminClient(base_url=ws.url, api_key=ws.api_key)
    return _client_side_telemetry(ws, call, admin)
