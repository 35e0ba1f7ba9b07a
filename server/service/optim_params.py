"""Parsing an `optim_step` request's optimizer parameters strictly.

A typo in a hyperparameter name (`learning_rat`) silently falling back to the default would
train with the wrong value and nobody would know, so unknown or ill-typed keys are refused with
the key named, as are values AdamW cannot use.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from server.engine.engine import AdamParams, DimuonParams
from server.service.request_fields import FieldError, number

ADAM_KEYS = tuple(f.name for f in fields(AdamParams))
DIMUON_KEYS = tuple(f.name for f in fields(DimuonParams))
OPTIMIZER_VERSIONS = {"adamw": None, "dimuon": 1}
"""The optimizer families a run can be created with, and the config version each speaks."""
MAX_LEARNING_RATE = 1.0
"""Far above any LoRA learning rate that trains (1e-5 to 1e-2); beyond it one step moves every
weight by about the learning rate and the run is destroyed without any value going NaN."""


def parse_optimizer_config(raw: Any) -> str:
    """The optimizer family a `create_model` or `load_weights` body asks for (`adamw` when it
    names none): `optimizer_config` as the SDK sends `AdamOptimizerConfig` or
    `DimuonOptimizerConfig`."""
    if raw is None:
        return "adamw"
    if not isinstance(raw, dict):
        raise FieldError(f"optimizer_config must be an object, got {raw!r}")
    kind = raw.get("type", "adamw")
    if kind not in OPTIMIZER_VERSIONS:
        raise FieldError(f"optimizer_config.type must be one of {sorted(OPTIMIZER_VERSIONS)}, "
                         f"got {kind!r}")
    allowed = {"type"} | ({"version"} if OPTIMIZER_VERSIONS[kind] else set())
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise FieldError(f"unknown optimizer_config field {unknown[0]!r} for {kind!r}")
    if OPTIMIZER_VERSIONS[kind] and raw.get("version", 1) != OPTIMIZER_VERSIONS[kind]:
        raise FieldError(f"optimizer_config.version: {kind} version "
                         f"{OPTIMIZER_VERSIONS[kind]} is served, got {raw.get('version')!r}")
    return kind


def optimizer_config(kind: str) -> dict[str, Any]:
    """The `optimizer_config` a run reports in `get_info`."""
    version = OPTIMIZER_VERSIONS[kind]
    return {"type": kind, **({"version": version} if version else {})}


def _raw_params(body: dict[str, Any]) -> dict[str, Any]:
    raw = body.get("adam_params")
    if raw is None:
        raw = body.get("optim_params", body.get("optimizer_params"))
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise FieldError(f"adam_params must be an object, got {raw!r}")
    return raw


def parse_optim_params(body: dict[str, Any], run_optimizer: str) -> AdamParams | DimuonParams:
    """An `optim_step` body's parameters for a run created with `run_optimizer`; parameters of
    the other family are refused by name."""
    raw = _raw_params(body)
    kind = raw.get("type", "adamw")
    if kind not in OPTIMIZER_VERSIONS:
        raise FieldError(f"optimizer parameters of type {kind!r} are not served; "
                         f"known: {sorted(OPTIMIZER_VERSIONS)}")
    if kind != run_optimizer:
        wanted = {"adamw": "AdamParams", "dimuon": "DimuonParams"}[run_optimizer]
        raise FieldError(f"this run was created with the {run_optimizer} optimizer; optim_step "
                         f"sent {kind} parameters: send {wanted}")
    return parse_dimuon_params(raw) if kind == "dimuon" else parse_adam_params(body)


def parse_dimuon_params(raw: dict[str, Any]) -> DimuonParams:
    """Dimuon's step parameters, strictly (unknown keys and out-of-range values named)."""
    unknown = sorted(k for k in raw if k not in DIMUON_KEYS and k != "type")
    if unknown:
        raise FieldError(f"unknown Dimuon parameter {unknown[0]!r}; known: "
                         f"{', '.join(DIMUON_KEYS)}")
    if "learning_rate" not in raw:
        raise FieldError("optimizer_params.learning_rate is required for Dimuon")
    values = {k: number(v, f"optimizer_params.{k}") for k, v in raw.items() if k != "type"}
    params = DimuonParams(**values)
    if not 0 <= params.learning_rate <= MAX_LEARNING_RATE:
        raise FieldError(f"optimizer_params.learning_rate must be in [0, {MAX_LEARNING_RATE}], "
                         f"got {params.learning_rate}")
    if not 0 <= params.beta1 < 1:
        raise FieldError(f"optimizer_params.beta1 must be in [0, 1), got {params.beta1}")
    if params.grad_clip_norm < 0:  # the SDK: nonpositive disables clipping
        params = DimuonParams(params.learning_rate, 0.0, params.beta1)
    return params


def parse_adam_params(body: dict[str, Any]) -> AdamParams:
    """The AdamW parameters of an `optim_step` body (`adam_params`, or the aliases the SDK's
    request model accepts: `optim_params`, `optimizer_params` of type `adamw`)."""
    raw = _raw_params(body)
    kind = raw.get("type", "adamw")
    if kind != "adamw":
        raise FieldError(f"AdamW parameters expected, got optimizer type {kind!r}")
    unknown = sorted(k for k in raw if k not in ADAM_KEYS and k != "type")
    if unknown:
        raise FieldError(
            f"unknown Adam parameter {unknown[0]!r}"
            + (f" (and {unknown[1:]})" if len(unknown) > 1 else "")
            + f"; known: {', '.join(ADAM_KEYS)}"
        )
    values = {k: number(v, f"adam_params.{k}") for k, v in raw.items() if k != "type"}
    params = AdamParams(**values)
    checks = {
        "learning_rate": 0 <= params.learning_rate <= MAX_LEARNING_RATE,
        "beta1": 0 <= params.beta1 < 1,
        "beta2": 0 <= params.beta2 < 1,
        "eps": params.eps > 0,
        "weight_decay": params.weight_decay >= 0,
        "grad_clip_norm": params.grad_clip_norm >= 0,
    }
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        rules = {
            "learning_rate": f"in [0, {MAX_LEARNING_RATE}]",
            "beta1": "in [0, 1)",
            "beta2": "in [0, 1)",
            "eps": "> 0",
            "weight_decay": ">= 0",
            "grad_clip_norm": ">= 0 (0 turns clipping off)",
        }
        key = bad[0]
        raise FieldError(f"adam_params.{key} must be {rules[key]}, got {getattr(params, key)}")
    if params.learning_rate * params.weight_decay > 1:
        # AdamW multiplies each weight by (1 - lr * weight_decay): past 1 it flips signs and
        # grows without bound.
        raise FieldError(
            "adam_params: learning_rate * weight_decay must be at most 1, got "
            f"{params.learning_rate} * {params.weight_decay}"
        )
    return params
