"""Parsing an `optim_step` request's optimizer parameters strictly.

A typo in a hyperparameter name (`learning_rat`) silently falling back to the default would
train with the wrong value and nobody would know, so unknown or ill-typed keys are refused with
the key named, as are values AdamW cannot use.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from server.engine.engine import AdamParams
from server.service.request_fields import FieldError, number

ADAM_KEYS = tuple(f.name for f in fields(AdamParams))
MAX_LEARNING_RATE = 1.0
"""Far above any LoRA learning rate that trains (1e-5 to 1e-2); beyond it one step moves every
weight by about the learning rate and the run is destroyed without any value going NaN."""


def parse_adam_params(body: dict[str, Any]) -> AdamParams:
    """The AdamW parameters of an `optim_step` body (`adam_params`, or the aliases the SDK's
    request model accepts: `optim_params`, `optimizer_params` of type `adamw`)."""
    raw = body.get("adam_params")
    if raw is None:
        raw = body.get("optim_params", body.get("optimizer_params"))
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise FieldError(f"adam_params must be an object, got {raw!r}")
    kind = raw.get("type", "adamw")
    if kind != "adamw":
        raise FieldError(f"only AdamW is supported, got optimizer type {kind!r}")
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
