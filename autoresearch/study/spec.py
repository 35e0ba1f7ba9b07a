"""A Study: a goal, a search space, a budget and how to run trials, declared in Python or YAML.

    study = Study.from_file("study.yaml")      # or Study(name=..., base_trial=TrialConfig(...))
    outcome = run_study(study)                   # autoresearch.study.runner; resumable

This module only describes a study; `autoresearch.study.runner` runs it and trusts what is
validated here, at the edge.
Secrets never appear in it: API keys come from the environment (`api_key_env` names the
variable), so the declaration is stored verbatim in the journal.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from autoresearch.rl.config import RLConfig, SFTConfig, TrialConfig
from autoresearch.study.expected_time import ExpectedTime
from autoresearch.study.space import DEFAULT_SPACE, Param, SearchSpace, StudyDimension


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Budget(_Strict):
    """What the study may spend. Exploration stops at the first limit reached."""

    max_trials: int = Field(8, ge=1, le=10_000)
    """Trials proposed to explore the space, the baseline (the base config) included."""
    max_steps: int | None = Field(None, ge=1)
    """Total SFT+RL steps over those trials (counted when a trial is proposed)."""
    max_tokens: int | None = Field(None, ge=1)
    """Total tokens trained on (counted as trials finish)."""
    max_wall_seconds: float | None = Field(None, gt=0)
    """No new trial is proposed after this long since the study was created (the time its
    warm-up took, if it trained one, not counted)."""
    confirm_seeds: int = Field(2, ge=0, le=16)
    """Fresh seeds each contender is re-run with to confirm a promising first look (0: nothing
    can be kept)."""
    max_confirm_trials: int = Field(4, ge=0, le=10_000)
    """Trials the study may spend on such re-runs, over and above `max_trials`."""
    seed_bank: int = Field(3, ge=0, le=64)
    """Runs of the base config that measure run-to-run noise, the baseline's own run included:
    `seed_bank - 1` extra runs on seeds drawn from the study's seed, queued with the baseline,
    over and above the other budgets. Every first look against the base config compares with
    their mean, their spread enters every confirmation's run-level test, the pruning margin and
    the report's power analysis; 0 or 1 means no bank: first looks compare with the baseline's
    one run, and the run-to-run variance comes from the confirmation re-runs alone."""
    test_seeds: int = Field(2, ge=0, le=16)
    """Fresh runs per arm for the test check when a change was kept: the kept config and the
    base config are each trained again on this many seeds that no dev decision saw, and the test
    split is read for those runs (the confirmation re-runs that kept the change carry the luck
    that selected it). 0: the test split is read for the confirmation re-runs and the base
    config's runs, and the report says the check inherits the selection."""
    alpha: float = Field(0.05, gt=0, lt=0.5)
    """The study's error budget: the chance that it keeps any change that is no better, split
    over the confirmations it can run (`decisions.ErrorBudget`)."""


ProposerKind = Literal["optuna", "random", "gemini", "openai"]


class ProposerSpec(_Strict):
    kind: ProposerKind = "optuna"
    """`optuna` (TPE, offline, the default), `random` (random search), `gemini` or `openai`
    (the LLM researcher; `openai` means any OpenAI-compatible endpoint: vLLM, Ollama)."""
    model: str | None = None
    """LLM model name (default: gemini-2.5-flash for gemini; required for openai)."""
    base_url: str | None = None
    """Endpoint of an OpenAI-compatible server, or a Gemini API proxy."""
    api_key_env: str | None = None
    """Name of the environment variable holding the key (default: GEMINI_API_KEY, then
    GOOGLE_API_KEY for gemini; OPENAI_API_KEY for openai)."""
    timeout_s: float = Field(60.0, gt=0, le=3600)
    max_attempts: int = Field(3, ge=1, le=10)
    """Requests per proposal: the first answer plus repairs and retries after timeouts."""
    temperature: float = Field(0.7, ge=0, le=2)
    startup_trials: int = Field(3, ge=1, le=1000)
    """Completed trials TPE samples at random before it starts modelling the space."""
    fallback: Literal["optuna", "random"] = "optuna"
    """Offline proposer used when the LLM fails."""


class ExecutorSpec(_Strict):
    kind: Literal["local", "kubernetes"] = "local"
    max_parallel_trials: int = Field(1, ge=1, le=1024)
    schedule: Literal["rounds", "asap"] = "rounds"
    """`rounds`: up to `max_parallel_trials` trials start together, and what comes next is
    decided and proposed once all of them have ended; pruning compares a trial only with the
    trials of earlier rounds, so neither depends on which trial ended first (with a
    batch-invariant server, a trial's numbers do not depend on its neighbours either). `asap`:
    a freed slot is refilled at once, which finishes sooner when trials differ in length, but
    proposals and pruning then depend on which trial happened to end first."""
    job_template: str | None = None
    """Kubernetes: the trial Job template (default /config/trial-job.yaml)."""
    namespace: str | None = None
    """Kubernetes: default $POD_NAMESPACE, else the kubeconfig's, else `default`."""
    image: str | None = None
    """Kubernetes: trial image (default $AUTORESEARCH_RUNNER_IMAGE, else the template's)."""
    poll_seconds: float = Field(5.0, gt=0, le=600)


class WarmupSpec(_Strict):
    """Training every trial of the study starts from: run once, cached by its config, so a
    second study (or a rerun) with the same warm-up reuses it. Model, rank, seed, prompt style,
    reward and dev tasks are the base trial's."""

    sft: SFTConfig = SFTConfig(steps=30, batch_size=8, adam={"learning_rate": 5e-4})
    rl: RLConfig = RLConfig(steps=0)
    checkpoint_every: int = Field(10, ge=1, le=100_000)
    cache_dir: str | None = None
    """Where finished warm-ups are kept (default $AUTORESEARCH_WARMUPS, else
    $AUTORESEARCH_CACHE/warmups, else ~/.cache/autoresearch/warmups). Under Kubernetes, a path
    on the results volume, so other study pods find it."""


class TrialCacheSpec(_Strict):
    """Reuse finished trials across studies: a trial whose config (name aside) already ran to
    the end on the same server is replayed from the cache instead of trained again."""

    dir: str | None = None
    """Where finished trials are kept (default $AUTORESEARCH_CACHE/trials, else
    ~/.cache/autoresearch/trials)."""
    replay_evidence: bool = False
    """Seed-bank and confirmation runs are evidence and always train fresh; true lets the cache
    replay them too (the report then marks each replayed one)."""


class PruningSpec(_Strict):
    """Stop losing trials early: trials score a fixed dev subset every `every` RL steps and
    Optuna's pruner compares them at equal steps; a trial is pruned only when the pruner says
    so and it is behind the best score at that step by more than `margin_z` standard errors."""

    kind: Literal["none", "successive_halving", "hyperband"] = "none"
    every: int = Field(2, ge=1, le=100_000)
    """RL steps between evaluations on the dev subset."""
    dev_tasks: int | None = Field(None, ge=1, le=100_000)
    """Size of that subset: the first tasks of the fixed dev set (default: all of them)."""
    min_resource: int = Field(2, ge=1, le=100_000)
    """RL steps a trial runs before it can be pruned."""
    reduction_factor: int = Field(3, ge=2, le=100)
    margin_z: float = Field(1.0, ge=0, le=10)
    """Noise margin: standard errors of the difference of two accuracies on the subset."""
    run_sd: float = Field(0.0, ge=0, le=0.5)
    """Run-to-run SD of a run's accuracy (a fraction: 0.029 is 2.9 points) that the margin
    includes until the study's seed bank has measured its own; then the bank's is used."""


class TracingSpec(_Strict):
    project: str | None = None
    """Weave project; default $WEAVE_PROJECT. Tracing also needs $WANDB_API_KEY."""


WARMUP_DIMENSION = "warmup"
"""The search-space dimension that picks which declared warm-up a trial forks from."""
PRIMARY_WARMUP = "default"
"""The name of the study's own `warmup` among its warm-up choices."""
WARMUP_ID = "warmup"
"""The journal id of the study's own warm-up trial; a declared choice's is `warmup-<name>`."""


class Study(_Strict):
    name: str = Field("study", min_length=1, max_length=40)
    goal: Literal["dev_accuracy"] = "dev_accuracy"
    """What the study maximises: execution accuracy on the fixed dev subset. Decisions read
    only the dev split; the test split is read once at the end, for runs no decision selected."""
    seed: int = Field(0, ge=0)
    """Seeds the offline proposer and draws the seeds of the seed bank and the confirmation
    re-runs (`confirmation.evidence_seeds`); exploration trials run with `base_trial.seed`."""
    output_dir: str | None = None
    """Where the journal, trial directories and report go (default runs/studies/<name>)."""
    server_url: str | None = None
    """Tinker-compatible server; default $TINKER_BASE_URL, else an embedded server."""
    embedded_model: str | None = None
    """Model of the embedded server (default: the packaged Gemma 3 270M)."""
    reward_workers: int | None = Field(None, ge=1, le=256)
    """Scoring processes shared by the local trials (default: one per CPU core)."""
    base_trial: TrialConfig = TrialConfig()
    warmup: WarmupSpec | None = None
    """A study-level warm-up every trial forks from (its `init_checkpoint`)."""
    warmup_choices: dict[str, WarmupSpec] = Field(default_factory=dict, max_length=8)
    """Other warm-ups, by name, that a trial may fork from instead: the search space's `warmup`
    dimension chooses among `default` (the warm-up above) and these names. Each is trained once
    at the start (or reused from the cache), like the warm-up above; all of them share the
    cache of the warm-up above (a choice's own `cache_dir` is not read)."""
    pruning: PruningSpec = PruningSpec()
    trial_cache: TrialCacheSpec | None = None
    """Off unless declared: with it, identical trials of earlier studies are replayed."""
    search_space: dict[str, Param] = Field(default_factory=lambda: dict(DEFAULT_SPACE))
    budget: Budget = Budget()
    proposer: ProposerSpec = ProposerSpec()
    executor: ExecutorSpec = ExecutorSpec()
    tracing: TracingSpec = TracingSpec()
    expected_time: ExpectedTime | None = None
    """Wall times measured for this study, printed before it starts for the machine it runs
    on (`expected_time.expected_time_lines`)."""

    @field_validator("name")
    @classmethod
    def _dns_safe(cls, value: str) -> str:
        if not re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", value):
            raise ValueError("name must be lowercase letters, digits and '-' (it names "
                             "directories and Kubernetes Jobs)")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> Study:
        self._check_warmup_choices()
        self.space()  # unknown fields or bad bounds fail here, not mid-study
        if self.warmup is not None:
            self.warmup_trial()
        if self.pruning.kind != "none" and self.pruning.every >= self.base_trial.rl.steps:
            raise ValueError(f"pruning.every={self.pruning.every} needs more RL steps than "
                             f"base_trial.rl.steps={self.base_trial.rl.steps} to compare at")
        if self.proposer.kind == "openai" and not self.proposer.model:
            raise ValueError("proposer.model is required for an OpenAI-compatible endpoint")
        return self

    def trial_base(self, init_checkpoint: str | None = None) -> TrialConfig:
        """The base trial as trials run it: with the pruning evaluations, and from the warm-up's
        checkpoint once it exists."""
        base = self.base_trial
        if self.pruning.kind != "none":
            base = base.with_changes({"eval.every": self.pruning.every,
                                      "eval.every_tasks": self.pruning.dev_tasks})
        if init_checkpoint is not None:
            base = base.with_changes({"init_checkpoint": init_checkpoint})
        return base

    def _check_warmup_choices(self) -> None:
        names = [PRIMARY_WARMUP, *self.warmup_choices]
        if self.warmup_choices and self.warmup is None:
            raise ValueError("warmup_choices needs a warm-up (`warmup:`) to be the default")
        for name in self.warmup_choices:
            # 12 characters at most: `<study>-warmup-<name>` stays a Kubernetes Job name
            if not re.fullmatch(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", name) \
                    or name == PRIMARY_WARMUP:
                raise ValueError(f"warm-up name {name!r}: up to 12 lowercase letters, digits "
                                 f"and '-', not {PRIMARY_WARMUP!r}")
            self.warmup_trial(name)
        param = self.search_space.get(WARMUP_DIMENSION)
        if param is not None:
            if self.warmup is None:
                raise ValueError(f"the search space's {WARMUP_DIMENSION!r} needs a warm-up")
            unknown = [c for c in param.choices or [] if c not in names]
            if unknown:
                raise ValueError(f"{WARMUP_DIMENSION}: {unknown} are not declared warm-ups "
                                 f"({', '.join(names)})")

    def space(self, init_checkpoint: str | None = None,
              warmups: Mapping[str, str] | None = None) -> SearchSpace:
        """The search space over the base trial; `warmups` (warm-up name -> checkpoint, once
        they exist) resolves the `warmup` dimension."""
        def fork_from(name: Any) -> dict[str, Any]:
            if warmups is None:  # names can be checked before the warm-ups exist, not used
                raise RuntimeError(f"warm-up {name!r} has no checkpoint yet: the study "
                                   "resolves warm-up choices only after its warm-ups ran")
            return {"init_checkpoint": warmups[name]}

        dimensions = ({WARMUP_DIMENSION: StudyDimension(PRIMARY_WARMUP, fork_from)}
                      if self.warmup is not None else {})
        return SearchSpace(self.search_space, self.trial_base(init_checkpoint), dimensions)

    def warmup_spec(self, name: str = PRIMARY_WARMUP) -> WarmupSpec:
        if self.warmup is None:
            raise ValueError("the study declares no warm-up")
        if name == PRIMARY_WARMUP:
            return self.warmup
        return self.warmup_choices[name]

    def warmup_names(self) -> list[str]:
        """Every declared warm-up, the shortest first: a longer one whose training begins with
        a shorter one's continues from it (`warmup.continues`) once that one exists."""
        if self.warmup is None:
            return []

        def steps(name: str) -> int:
            spec = self.warmup_spec(name)
            return spec.sft.steps + spec.rl.steps

        return sorted([PRIMARY_WARMUP, *self.warmup_choices], key=steps)

    def warmup_trial(self, name: str = PRIMARY_WARMUP) -> TrialConfig:
        """The warm-up (the default one, or the declared choice `name`) as a trial: the base
        trial's model, data and dev tasks, the warm-up's training; scored on dev before and
        after (no test split)."""
        w = self.warmup_spec(name)
        return self.base_trial.with_changes({
            "name": "warmup", "sft": w.sft.model_dump(mode="json"),
            "rl": w.rl.model_dump(mode="json"), "checkpoint_every": w.checkpoint_every,
            "eval.every": 0, "eval.every_tasks": None, "eval.test_tasks": 0,
            "eval.transfer_tasks": 0, "eval.baseline": False, "eval.start": True})

    def directory(self) -> Path:
        return Path(self.output_dir or Path("runs") / "studies" / self.name)

    def resolved_server_url(self) -> str | None:
        return self.server_url or os.environ.get("TINKER_BASE_URL") or None

    # -------------------------------------------------------------- i/o
    @classmethod
    def from_file(cls, path: str | Path) -> Study:
        data = yaml.safe_load(Path(path).read_text()) or {}
        return cls.model_validate(data)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", exclude_none=True), sort_keys=False)
