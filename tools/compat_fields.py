"""What the server does with every field the `tinker` SDK can send: request bodies and the
optimizer configs and parameters inside them.

The fields are not listed by hand: every pydantic model or dataclass in `tinker.types` whose
name ends in `Request` (the training requests travel as dataclasses, encoded as protobuf), every
optimizer config and parameter set, `LoraConfig`, `SamplingParams`, `ForwardBackwardInput` and
`Datum` are enumerated with their fields by introspection. Each field is then matched to what
the server does with it:

- *served*: the server acts on it; the row names the method probe that exercises it;
- *refused by name*: the server answers 400 naming the field (answering without what it asks
  for would hand the client values that never came); checked live, through the SDK;
- *protocol*: the SDK's own plumbing (type tags, ids, sequence numbers);
- *no effect*: accepted and recorded nowhere, said why (a client's version string, say);
- *never sent*: the server's client configuration keeps the SDK from sending it; checked live;
- *unsupported by design*: a hosted-service feature (billing), as in the method tables.

A field this table does not know (new in the SDK?) is reported as failed.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pydantic
import tinker
from tinker import types

from tools.compat_probes import PROBES, PROMPT, CheckFailed, Workspace, expect


class FieldStatus(enum.StrEnum):
    SERVED = "served"
    REFUSED = "refused by name"
    PROTOCOL = "protocol"
    NO_EFFECT = "no effect"
    NEVER_SENT = "never sent"
    UNSUPPORTED = "unsupported by design"
    FAILED = "failed"


EXTRA_TYPES = ("LoraConfig", "SamplingParams", "AdamParams", "DimuonParams",
               "AdamOptimizerConfig", "DimuonOptimizerConfig", "ForwardBackwardInput", "Datum")


def field_names(model: type) -> list[str]:
    """A pydantic model's or a dataclass's fields, in declaration order."""
    if dataclasses.is_dataclass(model):
        return [f.name for f in dataclasses.fields(model)]
    return list(model.model_fields)


def field_types() -> dict[str, type]:
    """Every request type, optimizer config and parameter set the SDK exports."""
    found = {}
    for name in sorted(dir(types)):
        obj = getattr(types, name)
        typed = inspect.isclass(obj) and (issubclass(obj, pydantic.BaseModel)
                                          or dataclasses.is_dataclass(obj))
        if typed and (name.endswith("Request") or name in EXTRA_TYPES):
            found[name] = obj
    return found


# ------------------------------------------------------------------------- declarations
Probe = tuple[str, str]
"""A method probe of `tools.compat_probes` (client, method family) that exercises a field."""

_OPTIM = ("TrainingClient", "optim_step")
_CREATE = ("ServiceClient", "create_lora_training_client")
_SAMPLE = ("SamplingClient", "sample")
_LOAD = ("TrainingClient", "load_state")
_SEARCH = ("RestClient", "search_sessions")

BY_NAME: dict[str, tuple[FieldStatus, str]] = {
    "type": (FieldStatus.PROTOCOL, "the request's type tag, set by the SDK"),
    "seq_id": (FieldStatus.PROTOCOL, "orders a run's requests: applied in seq_id order"),
    "session_id": (FieldStatus.PROTOCOL, "the session the request belongs to"),
    "model_id": (FieldStatus.PROTOCOL, "the training run addressed"),
    "model_seq_id": (FieldStatus.PROTOCOL, "numbers the session's runs: the new run's id"),
    "sampling_session_seq_id": (FieldStatus.PROTOCOL,
                                "numbers the session's samplers: the new sampler's id"),
    "request_id": (FieldStatus.PROTOCOL, "the future retrieved"),
    "sdk_version": (FieldStatus.NO_EFFECT,
                    "the client's version; every version is answered the same"),
}
"""Fields that mean the same in every type that has them."""

SERVED: dict[tuple[str, str], tuple[str, Probe]] = {
    ("AdamParams", "learning_rate"): ("AdamW's step size", _OPTIM),
    ("AdamParams", "beta1"): ("AdamW's first-moment decay", _OPTIM),
    ("AdamParams", "beta2"): ("AdamW's second-moment decay", _OPTIM),
    ("AdamParams", "eps"): ("AdamW's epsilon", _OPTIM),
    ("AdamParams", "weight_decay"): ("decoupled weight decay", _OPTIM),
    ("AdamParams", "grad_clip_norm"): ("global gradient-norm clipping (0: off)", _OPTIM),
    ("DimuonParams", "learning_rate"): ("the step's Frobenius norm per matrix, scaled", _OPTIM),
    ("DimuonParams", "grad_clip_norm"): ("global gradient-norm clipping", _OPTIM),
    ("DimuonParams", "beta1"): ("momentum of the running average", _OPTIM),
    ("DimuonOptimizerConfig", "version"): ("the update's version (1)", _CREATE),
    ("LoraConfig", "rank"): ("the adapter's rank", _CREATE),
    ("LoraConfig", "seed"): ("the adapter's initialisation", _CREATE),
    ("LoraConfig", "train_unembed"): ("adapts the output head", _CREATE),
    ("LoraConfig", "train_mlp"): ("adapts the MLP projections", _CREATE),
    ("LoraConfig", "train_attn"): ("adapts the attention projections", _CREATE),
    ("SamplingParams", "max_tokens"): ("the completion's length cap", _SAMPLE),
    ("SamplingParams", "seed"): ("the draws' seed: the same seed, the same tokens", _SAMPLE),
    ("SamplingParams", "stop"): ("stop strings or token ids", _SAMPLE),
    ("SamplingParams", "temperature"): ("the draws' temperature (0: greedy)", _SAMPLE),
    ("SamplingParams", "top_k"): ("top-k truncation", _SAMPLE),
    ("SamplingParams", "top_p"): ("nucleus truncation", _SAMPLE),
    ("CreateModelRequest", "base_model"): ("must be the served model", _CREATE),
    ("CreateModelRequest", "user_metadata"): ("kept on the run", _CREATE),
    ("CreateModelRequest", "lora_config"): ("the adapter (see LoraConfig)", _CREATE),
    ("CreateModelRequest", "optimizer_config"): ("AdamW or Dimuon, for the run's life",
                                                 _CREATE),
    ("CreateSamplingSessionRequest", "base_model"): ("must be the served model",
                                                     ("ServiceClient", "create_sampling_client")),
    ("CreateSamplingSessionRequest", "model_path"): ("the sampler checkpoint served",
                                                     ("ServiceClient", "create_sampling_client")),
    ("CreateSessionRequest", "tags"): ("kept on the session, searchable", _SEARCH),
    ("CreateSessionRequest", "user_metadata"): ("kept on the session, searchable", _SEARCH),
    ("CreateSessionRequest", "display_name"): ("kept on the session, searchable", _SEARCH),
    ("CopyWeightsRequest", "source_path"): ("the checkpoint copied",
                                            ("RestClient", "copy_weights")),
    ("CopyWeightsRequest", "ttl_seconds"): ("the copy's expiry", ("RestClient", "copy_weights")),
    ("CopyWeightsRequest", "destination_project_id"): (
        "recorded on the copy's run (projects are not modelled)", ("RestClient", "copy_weights")),
    ("GetInfoRequest", "model_id"): ("the run described", ("TrainingClient", "get_info")),
    ("LoadWeightsRequest", "base_model"): ("must be the served model", _LOAD),
    ("LoadWeightsRequest", "user_metadata"): ("kept on the new run", _LOAD),
    ("LoadWeightsRequest", "path"): ("the checkpoint loaded", _LOAD),
    ("LoadWeightsRequest", "optimizer"): ("loads the optimizer state too",
                                          ("TrainingClient", "load_state_with_optimizer")),
    ("LoadWeightsRequest", "optimizer_config"): ("the new run's optimizer",
                                                 ("ServiceClient",
                                                  "create_training_client_from_state")),
    ("OptimStepRequest", "optim_params"): ("AdamParams or DimuonParams, matching the run",
                                           _OPTIM),
    ("ForwardBackwardRequest", "forward_backward_input"): (
        "the batch and its loss", ("TrainingClient", "forward_backward")),
    ("ForwardRequest", "forward_input"): ("the batch and its loss",
                                          ("TrainingClient", "forward")),
    ("ForwardBackwardInput", "data"): ("the batch's data", ("TrainingClient", "forward_backward")),
    ("ForwardBackwardInput", "loss_fn"): ("every built-in loss",
                                          ("TrainingClient", "forward_backward")),
    ("ForwardBackwardInput", "loss_fn_config"): ("the loss's settings (clip ranges, beta)",
                                                 ("TrainingClient", "forward_backward")),
    ("Datum", "model_input"): ("the input tokens", ("TrainingClient", "forward_backward")),
    ("Datum", "loss_fn_inputs"): ("per-position targets, weights, logprobs, advantages",
                                  ("TrainingClient", "forward_backward")),
    ("Datum", "loss_fn_input_spans"): (
        "where the loss rows' tokens were sampled: checked against the sampling records a "
        "recorded sampler kept", ("TrainingClient", "forward_backward")),
    ("SampleRequest", "num_samples"): ("completions drawn", _SAMPLE),
    ("SampleRequest", "prompt"): ("the prompt's tokens", _SAMPLE),
    ("SampleRequest", "sampling_params"): ("see SamplingParams", _SAMPLE),
    ("SampleRequest", "base_model"): ("samples the base model", _SAMPLE),
    ("SampleRequest", "model_path"): ("samples a sampler checkpoint", _SAMPLE),
    ("SampleRequest", "sampling_session_id"): ("samples a sampling session's weights", _SAMPLE),
    ("SampleRequest", "prompt_logprobs"): ("the prompt's logprobs",
                                           ("SamplingClient", "compute_logprobs")),
    ("SampleRequest", "topk_prompt_logprobs"): ("top-k logprobs at prompt positions",
                                                ("SamplingClient", "sample")),
    ("SampleRequest", "prompt_logprobs_last_n"): ("prompt logprobs of the last n positions",
                                                  ("SamplingClient", "compute_logprobs")),
    ("SampleRequest", "record_stability_info"): ("records the draws for training-time checks",
                                                 ("TrainingClient", "forward_backward")),
    ("SaveWeightsExternalRequest", "path"): ("the export's name",
                                             ("TrainingClient", "save_weights_external")),
    ("SaveWeightsExternalRequest", "ttl_seconds"): ("the signed URL's expiry",
                                                    ("TrainingClient", "save_weights_external")),
    ("SaveWeightsExternalRequest", "age_encryption_recipients"): (
        "encrypts the export to these age recipients", ("TrainingClient",
                                                        "save_weights_external")),
    ("SaveWeightsForSamplerRequest", "path"): ("the checkpoint's name",
                                               ("TrainingClient", "save_weights_for_sampler")),
    ("SaveWeightsForSamplerRequest", "ttl_seconds"): ("the checkpoint's expiry",
                                                      ("TrainingClient",
                                                       "save_weights_for_sampler")),
    ("SaveWeightsForSamplerRequest", "user_metadata"): ("kept on the checkpoint",
                                                        ("TrainingClient",
                                                         "save_weights_for_sampler")),
    ("SaveWeightsRequest", "path"): ("the checkpoint's name", ("TrainingClient", "save_state")),
    ("SaveWeightsRequest", "ttl_seconds"): ("the checkpoint's expiry",
                                            ("TrainingClient", "save_state")),
    ("SaveWeightsRequest", "overwrite"): ("replaces a checkpoint of the same name",
                                          ("TrainingClient", "save_state")),
    ("SaveWeightsRequest", "user_metadata"): ("kept on the checkpoint",
                                              ("TrainingClient", "save_state")),
    ("SessionHeartbeatRequest", "session_id"): ("keeps the session alive",
                                                ("ServiceClient", "create_lora_training_client")),
    ("SessionSearchRequest", "session_id"): ("filters by session", _SEARCH),
    ("SessionSearchRequest", "user_metadata"): ("filters by metadata", _SEARCH),
    ("SessionSearchRequest", "display_name"): ("filters by name", _SEARCH),
    ("SessionSearchRequest", "owner"): ("filters by owner (the caller's own)", _SEARCH),
    ("SessionSearchRequest", "statuses"): ("filters by status", _SEARCH),
    ("SessionSearchRequest", "limit"): ("page size", _SEARCH),
    ("SessionSearchRequest", "cursor"): ("next page", _SEARCH),
}
"""Fields the server acts on: what it does, and the method probe that exercises it."""

NO_EFFECT: dict[tuple[str, str], str] = {
    ("CreateSessionRequest", "project_id"): "projects are not modelled: recorded nowhere",
    ("FutureRetrieveRequest", "allow_metadata_only"): (
        "results always come whole, which the SDK accepts either way"),
    ("TelemetrySendRequest", "events"): "the server keeps no telemetry (it answers accepted)",
    ("TelemetrySendRequest", "platform"): "the server keeps no telemetry",
    ("TelemetrySendRequest", "session_id"): "the server keeps no telemetry",
    ("TelemetrySendRequest", "process_uuid"): "the server keeps no telemetry",
    ("ClientConfigRequest", "sdk_version"): "every version gets the same client configuration",
    ("Datum", "model_input_spans"): (
        "sent only with loss_fn_input_spans, whose provenance (the same sampled tokens, one "
        "position on) is what the server checks"),
}

UNSUPPORTED: dict[str, str] = {
    "GetBillingUsageRequest": "billing belongs to the hosted service (its methods are listed "
                              "unsupported by design)",
    "GetCurrentCheckpointStorageUsageRequest": "billing belongs to the hosted service",
}
"""Whole request types whose methods are unsupported by design."""


# ------------------------------------------------------------------------------ live checks
def _refused(call: Callable[[], object], field: str) -> str:
    """Run `call`; it must fail with an error that names `field`."""
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the refusal is what is checked
        text = str(exc)
        expect(field in text, f"refused, but the error does not name {field}: {text[:200]}")
        return f"400 naming the field: \"{' '.join(text.split())[:140]}\""
    raise CheckFailed(f"{field} was accepted")


def _sample_with(ws: Workspace, **extra: object) -> object:
    return ws.base_sampler.sample(
        tinker.ModelInput.from_ints(PROMPT), num_samples=1,
        sampling_params=tinker.SamplingParams(max_tokens=2, seed=0), **extra,
    ).result(timeout=ws.timeout)


def _client_config(ws: Workspace) -> dict[str, object]:
    answer = httpx.post(ws.url + "/api/v1/client/config", json={}, timeout=ws.timeout)
    answer.raise_for_status()
    return answer.json()


def _never_sent(flag: str) -> Callable[[Workspace], str]:
    def check(ws: Workspace) -> str:
        value = _client_config(ws).get(flag)
        expect(value is False, f"the client configuration says {flag}={value!r}")
        return f"the server's client configuration sets `{flag}` false, so the SDK never sends it"
    return check


def _unused_by_sdk(type_name: str) -> Callable[[Workspace], str]:
    def check(ws: Workspace) -> str:
        root = Path(tinker.__file__).parent
        users = [p for p in root.rglob("*.py") if "types" not in p.relative_to(root).parts
                 and type_name in p.read_text(errors="replace")]
        expect(not users, f"the SDK sends {type_name} from {[str(p) for p in users]}")
        return "no module of the SDK outside its types uses this type, so nothing sends it"
    return check


def _access_token(ws: Workspace) -> str:
    path = ws.trained_state_path
    return _refused(lambda: ws.svc.create_training_client_from_state(
        path, weights_access_token="grant").result(timeout=ws.timeout), "weights_access_token")


def _inflight(ws: Workspace) -> str:
    return _refused(lambda: ws.trained.save_weights_and_get_sampling_client(
        ws.name("inflight"), kind="inflight").result(timeout=ws.timeout), "kind")


REFUSED: dict[tuple[str, str], Callable[[Workspace], str]] = {
    ("SampleRequest", "topk_sample_logprobs"): lambda ws: _refused(
        lambda: _sample_with(ws, topk_sample_logprobs=2), "topk_sample_logprobs"),
    ("SampleRequest", "target_prompt_logprobs"): lambda ws: _refused(
        lambda: _sample_with(ws, target_prompt_logprobs=types.TensorData(
            data=[0] * len(PROMPT), dtype="int64", shape=[len(PROMPT)])),
        "target_prompt_logprobs"),
    ("SampleRequest", "prompt_alt_tokens_k"): lambda ws: _refused(
        lambda: _sample_with(ws, prompt_alt_tokens_k=2), "prompt_alt_tokens_k"),
    ("LoadWeightsRequest", "weights_access_token"): _access_token,
    ("CopyWeightsRequest", "weights_access_token"): lambda ws: _refused(
        lambda: ws.rest.copy_weights(ws.trained_state_path, "compat",
                                     weights_access_token="grant").result(timeout=ws.timeout),
        "weights_access_token"),
    ("SaveWeightsForSamplerRequest", "kind"): _inflight,
    ("SessionSearchRequest", "project_ids"): lambda ws: _refused(
        lambda: ws.rest.search_sessions(types.SessionSearchRequest(project_ids=["p"])).result(
            timeout=ws.timeout), "project_ids"),
}
"""Fields refused by name, each checked by sending it through the SDK."""

NEVER_SENT: dict[str, Callable[[Workspace], str]] = {
    "CreateCustomLossRequest": _never_sent("custom_loss_server_side"),
    "FuturesRetrieveRequest": _never_sent("sample_use_retrieve_futures"),
    "JoinSamplingSessionRequest": _never_sent("sample_join_sampling_session"),
    "UnloadModelRequest": _unused_by_sdk("UnloadModelRequest"),
}
"""Request types the SDK sends only when the server's client configuration asks for them."""


# ----------------------------------------------------------------------------------- rows
@dataclass
class FieldOutcome:
    type_name: str
    field: str
    status: FieldStatus
    detail: str


def classify_field(ws: Workspace | None, type_name: str, field: str) -> FieldOutcome:
    """What the server does with one field: declared, and checked live where it can be."""
    def outcome(status: FieldStatus, detail: str) -> FieldOutcome:
        return FieldOutcome(type_name, field, status, detail)

    if type_name in UNSUPPORTED:
        return outcome(FieldStatus.UNSUPPORTED, UNSUPPORTED[type_name])
    if (type_name, field) in REFUSED or type_name in NEVER_SENT:
        check = REFUSED.get((type_name, field)) or NEVER_SENT[type_name]
        status = (FieldStatus.REFUSED if (type_name, field) in REFUSED
                  else FieldStatus.NEVER_SENT)
        if ws is None:
            return outcome(FieldStatus.FAILED, "not checked: no server")
        try:
            return outcome(status, check(ws))
        except Exception as exc:  # noqa: BLE001 - reported, never raised
            return outcome(FieldStatus.FAILED, f"{type(exc).__name__}: {str(exc)[:200]}")
    if (type_name, field) in SERVED:
        what, (client, family) = SERVED[(type_name, field)]
        if (client, family) not in PROBES:
            return outcome(FieldStatus.FAILED, f"names a probe that does not exist: "
                                               f"{client}.{family}")
        return outcome(FieldStatus.SERVED, f"{what}; exercised by the `{client}.{family}` probe")
    if (type_name, field) in NO_EFFECT:
        return outcome(FieldStatus.NO_EFFECT, NO_EFFECT[(type_name, field)])
    if field in BY_NAME:
        return outcome(*BY_NAME[field])
    return outcome(FieldStatus.FAILED, "not declared: a field this report does not know yet "
                                       "(new in the SDK?)")


def field_outcomes(ws: Workspace | None) -> list[FieldOutcome]:
    return [classify_field(ws, name, field)
            for name, model in field_types().items() for field in field_names(model)]
