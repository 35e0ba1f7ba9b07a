"""TrialConfig: everything one RL trial depends on, typed, bounded and serialisable.

This is the surface the research agent edits. The harness around it (evaluation, the record,
the splits) is fixed. Budgets are counted in steps and tokens, never wall time, so trials run on
shared hardware stay comparable; wall time is recorded as cost.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rewards import RewardConfig
from sqltasks import SchemaView


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AdamConfig(_Strict):
    learning_rate: float = Field(1e-4, gt=0, le=1e-1)
    beta1: float = Field(0.9, ge=0, lt=1)
    beta2: float = Field(0.95, ge=0, lt=1)
    eps: float = Field(1e-8, gt=0, le=1e-3)
    weight_decay: float = Field(0.0, ge=0, le=1)
    grad_clip_norm: float = Field(1.0, ge=0, le=1e4)
    """0 disables clipping; clipping applies to this trial's own gradients only."""


class SFTConfig(_Strict):
    """Optional supervised warm-up on gold queries of the train split."""

    steps: int = Field(0, ge=0, le=10_000)
    batch_size: int = Field(8, ge=1, le=512)
    examples: int = Field(256, ge=1, le=100_000)
    """How many train tasks the warm-up draws its batches from."""
    adam: AdamConfig = AdamConfig(learning_rate=2e-4)


LossName = Literal["importance_sampling", "ppo", "cispo"]


class RLConfig(_Strict):
    steps: int = Field(20, ge=0, le=100_000)
    prompts_per_step: int = Field(8, ge=1, le=1024)
    group_size: int = Field(8, ge=1, le=256)
    temperature: float = Field(1.0, ge=0, le=2)
    top_p: float = Field(1.0, gt=0, le=1)
    max_tokens: int = Field(96, ge=1, le=4096)
    adam: AdamConfig = AdamConfig(learning_rate=5e-5)
    loss_fn: LossName = "importance_sampling"
    clip_low: float | None = Field(None, ge=0, le=10)
    """Lower ratio bound for ppo/cispo (Tinker's defaults apply when unset)."""
    clip_high: float | None = Field(None, ge=0, le=100)
    advantage: Literal["mean", "zscore"] = "mean"
    """Group baseline: mean-centred, or z-scored by the group's standard deviation."""
    drop_constant_groups: bool = True
    """Groups whose samples all got the same reward carry no signal; skip them."""
    dynamic_sampling: bool = False
    """Draw more prompts until the step holds `prompts_per_step` groups whose rewards differ
    (DAPO's dynamic sampling), within `max_groups_drawn`; the step's record says what it drew,
    kept and dropped, and whether the cap ended it. Off: one draw, constant groups dropped."""
    max_groups_drawn: int | None = Field(None, ge=1, le=65_536)
    """Cap on the groups one step may draw with `dynamic_sampling` (None: 4 x
    `prompts_per_step`): what a step may spend on sampling when few prompts carry a signal."""
    prompt_selection: Literal["uniform", "signal"] = "uniform"
    """`signal`: draw prompts by the chance they carry a signal, estimated online from the
    run's own groups (`autoresearch.rl.prompt_picker`): pass rates between 0 and 1 first,
    prompts last seen all wrong or all right seldom, tiers that never pass late."""
    revisit: float = Field(0.1, gt=0, le=1)
    """With `signal` selection: the weight of a prompt whose last group was constant, against
    about 1 for one whose last group carried a signal."""
    loss_aggregation: Literal["sum", "token_mean", "sequence_mean"] = "sum"
    """How token losses combine: `sum` over all tokens (Dr. GRPO, tinker-cookbook), `token_mean`
    over the step's completion tokens (DAPO), `sequence_mean` of each completion's mean
    (the original GRPO, which favours short right and long wrong answers)."""
    kl_coef: float = Field(0.0, ge=0, le=10)
    """Penalty on log(pi/pi_base) per sampled token, folded into the advantages."""
    max_train_tokens: int | None = Field(None, ge=1)
    """Token budget: stop RL once this many sampled+prompt tokens were trained on."""

    @model_validator(mode="after")
    def _consistent(self) -> RLConfig:
        if self.steps and self.group_size < 2:
            raise ValueError("group_size must be at least 2: advantages are relative to a group")
        if self.loss_fn == "importance_sampling" and (self.clip_low or self.clip_high):
            raise ValueError("clip_low/clip_high only apply to the ppo and cispo losses")
        if (
            self.clip_low is not None
            and self.clip_high is not None
            and self.clip_low >= self.clip_high
        ):
            raise ValueError("clip_low must be below clip_high")
        if self.max_groups_drawn is not None and self.max_groups_drawn < self.prompts_per_step:
            raise ValueError("max_groups_drawn must be at least prompts_per_step")
        if self.temperature == 0 and self.steps:
            raise ValueError("temperature 0 gives identical samples in a group: no RL signal")
        return self

    def groups_cap(self) -> int:
        """The most groups one step draws."""
        if not self.dynamic_sampling:
            return self.prompts_per_step
        return self.max_groups_drawn or 4 * self.prompts_per_step

    def loss_fn_config(self) -> dict[str, float] | None:
        config = {}
        if self.clip_low is not None:
            config["clip_low_threshold"] = self.clip_low
        if self.clip_high is not None:
            config["clip_high_threshold"] = self.clip_high
        return config or None


class EvalConfig(_Strict):
    every: int = Field(10, ge=0, le=100_000)
    """Evaluate on the dev split every this many RL steps (0: only at the end)."""
    dev_tasks: int = Field(64, ge=0, le=100_000)
    """The fixed dev subset every trial is scored on (0: no dev evaluation)."""
    test_tasks: int = Field(200, ge=0, le=100_000)
    """Test tasks a standalone trial scores at its end. In a study, trials read dev only and
    this sizes the study's single final test check (best against the base config)."""
    transfer_tasks: int = Field(0, ge=0, le=100_000)
    """Tasks of the hand-written transfer split (databases no corpus has) scored wherever test
    is (at the end, and before and after SFT with `baseline`); 0: none."""
    max_tokens: int = Field(96, ge=1, le=4096)
    baseline: bool = False
    """Also evaluate the untrained model on the test split (for reporting gains)."""
    start: bool = False
    """Also evaluate on the dev split before any training: the starting point (the base model,
    or the `init_checkpoint`), paired task by task with the final dev score."""
    every_tasks: int | None = Field(None, ge=1, le=100_000)
    """Evaluations during training use only the first this many of the fixed dev tasks (a
    cheaper, still fixed, subset: what pruning reads); default: all of them."""
    vote: int = Field(0, ge=0, le=64)
    """Sampled queries per question beside the greedy one; the answer is the result most of
    them return on the question's database (execution-based self-consistency, see
    `evaluation.voting`). 0: greedy alone. Costs about this many times the sampling."""
    vote_temperature: float = Field(0.8, gt=0.0, le=2.0)
    snap_names: bool = False
    """Run each answer with the table and column names its database lacks replaced by the
    closest ones it has (`rewards.snap`), an inference-time repair; training rewards never
    snap. The figures without it stay in the eval entry beside the snapped ones."""
    snap_values: bool = False
    """Also run each answer with a string it compares a column with replaced by the value that
    column holds which differs only in case or spacing (`rewards.snap_values`)."""


class PromptConfig(_Strict):
    """How much of each database the prompt shows (see `sqltasks.prompt.SchemaView`)."""

    sample_rows: int = Field(0, ge=0, le=20)
    """Rows shown under each table's CREATE statement."""
    max_schema_chars: int | None = Field(None, ge=200, le=100_000)
    """Cap on the schema text: past it, the tables least related to the question are left
    out. None: the whole schema, as before."""

    def schema_view(self) -> SchemaView | None:
        """The view prompts are rendered with (None: the whole schema, no rows)."""
        if not self.sample_rows and self.max_schema_chars is None:
            return None
        return SchemaView(sample_rows=self.sample_rows, max_chars=self.max_schema_chars)


class TasksConfig(_Strict):
    """Tasks the user brings instead of a generated corpus (`sqltasks.TaskSource`): their own
    databases and questions, or Spider/BIRD in their published layouts. Paths are read from the
    working directory."""

    source: Literal["database", "spider", "bird"] = "database"
    path: str = Field(min_length=1)
    """The questions file (JSONL or CSV) of a `database` source; the benchmark's root
    directory for `spider` and `bird`."""
    databases: list[str] = []
    """A `database` source's DuckDB, SQLite or SQL-script files (names: file names without
    their suffix; a question names its database when there are several)."""
    dialect: Literal["auto", "duckdb", "sqlite"] = "auto"
    """The gold queries' dialect; `auto`: SQLite's on a SQLite file, else DuckDB's. SQLite
    golds are translated to DuckDB (the failures reported)."""
    split_seed: int = Field(0, ge=0)
    dev_fraction: float = Field(0.2, ge=0, le=1)
    test_fraction: float = Field(0.2, ge=0, le=1)
    """Shares of the questions without a `split` field drawn into dev and test (for Spider and
    BIRD, dev is drawn from the train databases; their dev set is the test split)."""
    split_by: Literal["question", "database"] = "question"
    max_rows: int = Field(100_000, ge=1, le=10_000_000)
    train_on: Literal["source", "corpus"] = "source"
    """Train on the source's train split, or on the generated `corpus` and be scored on the
    source's dev and test splits: the transfer setting."""

    @model_validator(mode="after")
    def _consistent(self) -> TasksConfig:
        if self.source == "database" and not self.databases:
            raise ValueError("a database source names its database files in `databases`")
        if self.source != "database" and self.databases:
            raise ValueError(f"a {self.source} source finds its databases under `path`")
        share = self.dev_fraction + self.test_fraction
        if share > 1 or (share >= 1 and self.train_on == "source"):
            raise ValueError("dev_fraction + test_fraction must leave questions to train on "
                             "(or add up to at most 1 with train_on: corpus)")
        return self


ADDED_LATER: dict[str, Any] = {
    "train_unembed": True,
    "tasks": None,
    "reward.snap_names": False,
    "eval.snap_names": False,
    "reward.snap_values": False,
    "eval.snap_values": False,
    "reward.weights.overlap": 0.0,
    "rl.dynamic_sampling": False,
    "rl.max_groups_drawn": None,
    "rl.prompt_selection": "uniform",
    "rl.revisit": 0.1,
    "rl.loss_aggregation": "sum",
}
"""Fields added after configs were first hashed, and their defaults (see `canonical`)."""


class TrialConfig(_Strict):
    name: str = "trial"
    base_model: str = "google/gemma-3-270m"
    lora_rank: int = Field(16, ge=1, le=512)
    train_unembed: bool = True
    """Also train a LoRA on the output head (the SDK's default). vLLM cannot serve such an
    adapter for Gemma, so on a vLLM-backed server its samples come from the torch sampler."""
    seed: int = Field(0, ge=0)
    prompt_style: Literal["base", "chat"] = "base"
    corpus_seed: int = Field(0, ge=0)
    corpus: Literal["twotable", "multitable"] = "twotable"
    """The generated corpus trials train and are scored on (`sqltasks.load_corpus`)."""
    tasks: TasksConfig | None = None
    """The user's own tasks (a database with questions, or Spider/BIRD): trials are scored on
    their dev and test splits, and train on their train split or on `corpus`."""
    prompt: PromptConfig = PromptConfig()
    sft: SFTConfig = SFTConfig()
    rl: RLConfig = RLConfig()
    reward: RewardConfig = Field(default_factory=RewardConfig)
    eval: EvalConfig = EvalConfig()
    checkpoint_every: int = Field(5, ge=1, le=100_000)
    tokenizer: str | None = None
    """Tokenizer id or path; default: what the server reports for the base model."""
    init_checkpoint: str | None = Field(None, pattern=r"^tinker://")
    """Start from these saved LoRA weights (a `tinker://` path; a fresh optimizer) instead of a
    new adapter, e.g. one shared SFT warm-up that every trial of an RL study builds on. Its base
    model and rank must match `base_model` and `lora_rank`."""

    @model_validator(mode="after")
    def _consistent(self) -> TrialConfig:
        if self.sft.steps == 0 and self.rl.steps == 0 and not self.init_checkpoint:
            raise ValueError("a trial needs SFT steps, RL steps, or both (or an init_checkpoint "
                             "to evaluate)")
        if self.eval.every and self.rl.steps and self.eval.every > self.rl.steps:
            raise ValueError(
                f"eval.every={self.eval.every} exceeds rl.steps={self.rl.steps}: "
                "no dev evaluation would happen during training"
            )
        return self

    # -------------------------------------------------------------- i/o
    def canonical(self) -> dict[str, Any]:
        """The config as hashed: fields added in later versions are left out while they hold
        their defaults, so a config that does not use them keeps the name, cache keys and
        random streams it had before they existed."""
        data = self.model_dump(mode="json")
        for path, default in ADDED_LATER.items():
            *parents, leaf = path.split(".")
            section = data
            for key in parents:
                section = section[key]
            if section[leaf] == default:
                del section[leaf]
        return data

    def fingerprint(self) -> str:
        """A short stable hash of the config (names a trial's artifacts)."""
        blob = json.dumps(self.canonical(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    @classmethod
    def from_file(cls, path: str | Path) -> TrialConfig:
        data = yaml.safe_load(Path(path).read_text()) or {}
        return cls.model_validate(data)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False)

    def with_changes(self, changes: dict) -> TrialConfig:
        """A validated copy with dotted-path changes (`{"rl.adam.learning_rate": 1e-4}`)."""
        data = self.model_dump(mode="json")
        for dotted, value in changes.items():
            node = data
            *parents, leaf = dotted.split(".")
            for key in parents:
                if key not in node or not isinstance(node[key], dict):
                    raise ValueError(f"unknown config field {dotted!r}")
                node = node[key]
            if leaf not in node:
                raise ValueError(f"unknown config field {dotted!r}")
            node[leaf] = value
        return TrialConfig.model_validate(data)
