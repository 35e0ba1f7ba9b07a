"""The offline proposer: Optuna's TPE (or random search) over the declared space, no network.

The Optuna study is rebuilt from the journal on every call (finished trials with their dev
accuracy, crashed ones as failed, queued and running ones as running), with a sampler seeded by
the study seed and the number of trials so far. So proposals depend only on the journal: a
resumed study proposes what the uninterrupted one would have, and nothing needs saving besides
the journal. Running trials are seen through TPE's constant liar, so parallel proposals spread.
"""

from __future__ import annotations

import hashlib
import warnings
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState

from autoresearch.study.proposers.base import Context, Proposal, ProposalBatch
from autoresearch.study.space import Param, SearchSpace

optuna.logging.set_verbosity(optuna.logging.WARNING)

MAX_DRAWS = 50
"""Samples drawn per proposal before concluding the space has no new configuration left."""


def distribution(param: Param) -> BaseDistribution:
    if param.categorical:
        return CategoricalDistribution(list(param.choices or []))
    if param.integer:
        step = int(param.step) if param.step and not param.log else 1
        return IntDistribution(int(param.low), int(param.high), log=param.log, step=step)
    step = param.step if param.step and not param.log else None
    return FloatDistribution(float(param.low), float(param.high), log=param.log, step=step)


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:4], "little")


class OptunaProposer:
    def __init__(self, sampler: str = "tpe", seed: int = 0, startup_trials: int = 3):
        if sampler not in ("tpe", "random"):
            raise ValueError(f"unknown sampler {sampler!r}")
        self.sampler_kind = sampler
        self.seed = seed
        self.startup_trials = startup_trials
        self.name = "optuna-tpe" if sampler == "tpe" else "random"

    def _sampler(self, n_trials: int) -> optuna.samplers.BaseSampler:
        seed = _seed(self.seed, n_trials)
        if self.sampler_kind == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return optuna.samplers.TPESampler(seed=seed, n_startup_trials=self.startup_trials,
                                              constant_liar=True)

    def _study(self, context: Context, dists: dict[str, BaseDistribution]) -> optuna.Study:
        explored = context.explored()
        study = optuna.create_study(direction="maximize", sampler=self._sampler(len(explored)))
        base = context.space.base_values()
        for row in explored:
            params = {**base, **(row["changes"] or {})}
            params = {k: v for k, v in params.items() if k in dists and _contains(dists[k], v)}
            finished = row["status"] in ("done", "kept", "discarded")
            if finished and row["dev_accuracy"] is not None:
                state, value = TrialState.COMPLETE, float(row["dev_accuracy"])
            elif row["status"] == "crashed":
                state, value = TrialState.FAIL, None
            elif row["status"] == "pruned":  # TPE ranks it below the trials that went on
                state, value = TrialState.PRUNED, None
            else:
                state, value = TrialState.RUNNING, None
            study.add_trial(optuna.trial.create_trial(
                params=params, distributions={k: dists[k] for k in params}, value=value,
                state=state))
        return study

    def propose(self, context: Context, n: int) -> ProposalBatch:
        space: SearchSpace = context.space
        dists = {path: distribution(param) for path, param in space.params.items()}
        study = self._study(context, dists)
        finished = [t for t in study.trials if t.state == TrialState.COMPLETE]
        proposals: list[Proposal] = []
        seen: set[str] = set()
        for _ in range(n):
            for _ in range(MAX_DRAWS):
                trial = study.ask(dists)
                changes = {k: _plain(v) for k, v in trial.params.items()
                           if v != space.base_values().get(k)}
                changes, config = space.validate(changes)
                key = config.fingerprint()
                if context.is_new(changes) and key not in seen:
                    break
                study.tell(trial, state=TrialState.FAIL)  # a repeat: draw again
            else:
                break
            seen.add(key)
            proposals.append(Proposal(changes, self._rationale(finished, changes)))
        return ProposalBatch(self.name, "sampled", proposals)

    def _rationale(self, finished: list[Any], changes: dict[str, Any]) -> str:
        what = ", ".join(f"{k}={_fmt(v)}" for k, v in changes.items()) or "the base config"
        if self.sampler_kind == "random" or len(finished) < self.startup_trials:
            how = ("random sample" if self.sampler_kind == "random" else
                   f"random start-up sample ({len(finished)} of {self.startup_trials} "
                   "finished trials TPE needs before modelling)")
            return f"{how}: {what}"
        best = max(t.value for t in finished)
        return (f"TPE over {len(finished)} finished trials (best dev accuracy {best:.3f}) "
                f"expects {what} to score well")


def _contains(dist: BaseDistribution, value: Any) -> bool:
    try:
        return dist._contains(dist.to_internal_repr(value))
    except (ValueError, TypeError):
        return False


def _plain(value: Any) -> Any:
    return value.item() if hasattr(value, "item") else value


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)
