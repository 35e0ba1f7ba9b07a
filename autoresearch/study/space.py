"""The search space of a study: which `TrialConfig` fields a proposer may change, and how far.

A space maps dotted config paths (`rl.adam.learning_rate`, `reward.weights.rows`) to a `Param`:
a numeric range (optionally on a log scale, optionally stepped) or a list of choices. Every
proposer's answer passes through `SearchSpace.validate`, so an LLM cannot move a field the study
did not open, nor push one outside its bounds; the result is then validated as a whole by
`TrialConfig.with_changes`.

A space may also hold study dimensions: names that are not config fields but stand for config
changes only the study can resolve, such as which of its declared warm-ups a trial forks from
(`warmup`: the warm-up's name, resolved to that warm-up's checkpoint).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autoresearch.rl.config import TrialConfig

Value = bool | int | float | str
Changes = dict[str, Value]
"""Dotted config path -> new value: what a proposal asks to change relative to the base trial."""


class Param(BaseModel):
    """One tunable field: a numeric range or a set of choices."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    low: float | None = None
    high: float | None = None
    log: bool = False
    """Sample on a log scale (learning rates)."""
    step: float | None = Field(None, gt=0)
    integer: bool | None = None
    """Integer-valued; inferred from the config field's type when unset."""
    choices: list[Value] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Param:
        if self.choices is not None:
            if self.low is not None or self.high is not None or not self.choices:
                raise ValueError("a parameter has either non-empty choices or low/high, not both")
            return self
        if self.low is None or self.high is None or self.low > self.high:
            raise ValueError("a numeric parameter needs low <= high")
        if self.log and self.low <= 0:
            raise ValueError("a log-scale parameter needs low > 0")
        return self

    @property
    def categorical(self) -> bool:
        return self.choices is not None

    def describe(self) -> str:
        if self.choices is not None:
            return "one of " + ", ".join(repr(c) for c in self.choices)
        kind = "integer" if self.integer else "number"
        scale = ", log scale" if self.log else ""
        step = f", step {self.step:g}" if self.step else ""
        return f"{kind} in [{self.low:g}, {self.high:g}]{scale}{step}"

    def check(self, value: Any) -> Value:
        """The value, normalised, or ValueError saying why it is outside this parameter."""
        if self.choices is not None:
            for choice in self.choices:
                if value == choice and type(value) is type(choice):
                    return choice
            raise ValueError(f"{value!r} is not {self.describe()}")
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{value!r} is not a number")
        if not math.isfinite(value) or not self.low <= value <= self.high:
            raise ValueError(f"{value!r} is outside [{self.low:g}, {self.high:g}]")
        if self.integer:
            if float(value) != int(value):
                raise ValueError(f"{value!r} is not an integer")
            return int(value)
        return float(value)


DEFAULT_SPACE: dict[str, Param] = {
    "sft.adam.learning_rate": Param(low=5e-5, high=2e-3, log=True),
    "rl.adam.learning_rate": Param(low=1e-5, high=5e-4, log=True),
    "rl.temperature": Param(low=0.6, high=1.2),
    "rl.advantage": Param(choices=["mean", "zscore"]),
    "reward.weights.executes": Param(low=0.0, high=0.3),
    "reward.weights.columns": Param(low=0.0, high=0.5),
    "reward.weights.rows": Param(low=0.0, high=0.5),
}
"""Learning rates, sampling temperature, the advantage baseline and the shaping rewards."""


def _config_value(config: TrialConfig, dotted: str) -> Any:
    node: Any = config.model_dump(mode="json")
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            raise ValueError(f"unknown config field {dotted!r}")
        node = node[key]
    return node


@dataclass(frozen=True)
class StudyDimension:
    """A searchable name that is not a config field: its base value, and the config changes
    each value stands for (a proposal and the journal keep the name; the trial gets the
    changes)."""

    base: Value
    changes: Callable[[Value], dict[str, Any]]


class SearchSpace:
    """A validated space over one base config."""

    def __init__(self, params: dict[str, Param], base: TrialConfig,
                 dimensions: dict[str, StudyDimension] | None = None):
        self.base = base
        self.dimensions = dict(dimensions or {})
        self.params: dict[str, Param] = {}
        for path, param in params.items():
            if path in self.dimensions:
                if not param.categorical:
                    raise ValueError(f"{path!r} is chosen by name: declare it with choices")
                self.params[path] = param
                continue
            current = _config_value(base, path)  # raises on an unknown field
            if isinstance(current, dict):
                raise ValueError(f"{path!r} is a section, not a field")
            if param.integer is None and not param.categorical:
                param = param.model_copy(update={"integer": isinstance(current, int)
                                                 and not isinstance(current, bool)})
            self.params[path] = param

    def base_values(self) -> dict[str, Any]:
        return {path: self.dimensions[path].base if path in self.dimensions
                else _config_value(self.base, path) for path in self.params}

    def config_changes(self, changes: Changes) -> dict[str, Any]:
        """`changes` as config fields: each study dimension replaced by what its value
        stands for."""
        out: dict[str, Any] = {}
        for path, value in changes.items():
            dimension = self.dimensions.get(path)
            out.update(dimension.changes(value) if dimension is not None else {path: value})
        return out

    def apply(self, changes: Changes) -> TrialConfig:
        """The base config with `changes` made (not checked against the space)."""
        return self.base.with_changes(self.config_changes(changes))

    def validate(self, changes: dict[str, Any]) -> tuple[Changes, TrialConfig]:
        """Check changes against the space and the config; ValueError lists every problem."""
        if not isinstance(changes, dict):
            raise ValueError("changes must be an object mapping config paths to values")
        problems, clean = [], {}
        for path, value in changes.items():
            param = self.params.get(path)
            if param is None:
                problems.append(f"{path}: not in the search space (allowed: "
                                f"{', '.join(self.params)})")
                continue
            try:
                clean[path] = param.check(value)
            except ValueError as exc:
                problems.append(f"{path}: {exc}")
        if problems:
            raise ValueError("; ".join(problems))
        try:
            config = self.apply(clean)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            raise ValueError(f"the resulting trial config is invalid: {exc}") from exc
        return clean, config

    def describe(self) -> dict[str, str]:
        return {path: param.describe() for path, param in self.params.items()}

    def json_schema(self) -> dict[str, Any]:
        """JSON schema of a `changes` object (for structured LLM output)."""
        properties: dict[str, Any] = {}
        for path, param in self.params.items():
            if param.categorical:
                kinds = sorted({_json_type(c) for c in param.choices or []})
                prop: dict[str, Any] = {"enum": list(param.choices or [])}
                prop["type"] = kinds[0] if len(kinds) == 1 else kinds
            else:
                prop = {"type": "integer" if param.integer else "number",
                        "minimum": param.low, "maximum": param.high}
            prop["description"] = param.describe()
            properties[path] = prop
        return {"type": "object", "properties": properties, "additionalProperties": False}


def _json_type(value: Value) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return "string"


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, path + "."))
        else:
            out[path] = value
    return out


def config_diff(config: TrialConfig, reference: TrialConfig,
                ignore: tuple[str, ...] = ("name",)) -> dict[str, dict[str, Any]]:
    """Fields where `config` differs from `reference`: {path: {"from": old, "to": new}}."""
    new = flatten(config.model_dump(mode="json"))
    old = flatten(reference.model_dump(mode="json"))
    return {path: {"from": old.get(path), "to": value} for path, value in sorted(new.items())
            if path not in ignore and old.get(path) != value}


def config_key(config: TrialConfig) -> str:
    """Identity of a config apart from its name, seed and test-split reading (a study's trials
    read dev only): replicates share it."""
    dev_only = config.eval.model_copy(update={"test_tasks": 0, "baseline": False})
    return config.model_copy(update={"name": "trial", "seed": 0, "eval": dev_only}).fingerprint()
