"""Score a checkpoint, or the base model, on any task source: what `autoresearch eval` runs.

The same prompt, decoding (greedy, or the vote with name and value snapping) and scoring as a
trial's evaluation, on the generated corpora, the hand-written transfer split, or the user's
own source, so a number printed here and one in a trial's record mean the same thing.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tinker

from autoresearch.evaluation.evaluate import evaluate
from autoresearch.rl.config import TrialConfig
from autoresearch.rl.tasks import source_summary, split_tasks
from rewards import RewardPool, Task
from sqltasks import load_corpus
from sqltasks.holdout.split import load_holdout

WORST_SHOWN = 5


@dataclass(frozen=True)
class EvalRequest:
    """What to score: `config` gives the tasks, prompt, decoding and base model; `checkpoint`
    the weights (None: the base model)."""

    config: TrialConfig
    split: str = "dev"
    checkpoint: str | None = None
    limit: int | None = None
    """Score a seeded sample of this many tasks (None: all of the split)."""
    served_model: bool = False
    """Score whatever base model the server serves (the config's `base_model` is a default,
    not a choice)."""


def request_tasks(request: EvalRequest) -> list[Task]:
    config = request.config
    if request.split == "transfer":
        tasks = load_corpus("transfer")
    elif request.split == "holdout":
        tasks = list(load_holdout())
    else:
        tasks = split_tasks(config, request.split)
    if request.limit is not None and request.limit < len(tasks):
        tasks = random.Random(f"eval:{config.seed}").sample(tasks, k=request.limit)
    return tasks


def _tokenizer(config: TrialConfig, server_url: str, api_key: str) -> Any:
    from transformers import AutoTokenizer

    if config.tokenizer:
        return AutoTokenizer.from_pretrained(config.tokenizer)
    from server.entrypoints.install_tokenizer import install_tokenizer

    _, snapshot = install_tokenizer(server_url, api_key)  # the server's own, works offline
    return AutoTokenizer.from_pretrained(str(snapshot))


def score(request: EvalRequest, server_url: str, api_key: str) -> dict[str, Any]:
    """Evaluate and return what `autoresearch eval` writes as JSON."""
    config = request.config
    tasks = request_tasks(request)
    if not tasks:
        raise ValueError(f"the {request.split} split has no tasks to score")
    started = time.time()
    service = tinker.ServiceClient(base_url=server_url, api_key=api_key)
    try:
        if request.served_model and not request.checkpoint:
            rest = tinker.RestClient(base_url=server_url, api_key=api_key)
            served = rest.get_server_capabilities().result().supported_models[0].model_name
            config = config.model_copy(update={"base_model": served})
        sampler = (service.create_sampling_client(model_path=request.checkpoint).result()
                   if request.checkpoint else
                   service.create_sampling_client(base_model=config.base_model).result())
        tokenizer = _tokenizer(config, server_url, api_key)
        with RewardPool(config=config.reward) as pool:
            result = evaluate(
                sampler, tokenizer, tasks, request.split, pool, config.reward,
                config.prompt_style, config.eval.max_tokens, view=config.prompt.schema_view(),
                vote=config.eval.vote, vote_temperature=config.eval.vote_temperature,
                seed=config.seed, snap_names=config.eval.snap_names,
                snap_values=config.eval.snap_values, keep_samples=len(tasks))
    finally:
        service.close("success").result(timeout=10)
    summary = result.summary()
    summary["samples"] = sorted(summary["samples"],
                                key=lambda s: (s["correct"], s.get("reward", 0.0)))
    return {
        "model": request.checkpoint or config.base_model,
        "tasks_from": _described(config, request.split),
        "loaded": (source_summary(config) if request.split not in ("transfer", "holdout")
                   else None),
        "wall_seconds": round(time.time() - started, 1),
        **summary,
    }


def _described(config: TrialConfig, split: str) -> str:
    if split == "transfer":
        return "the hand-written transfer split"
    if split == "holdout":
        return "the frozen held-out split"
    if config.tasks is None:
        return f"the {config.corpus} corpus (seed {config.corpus_seed})"
    return f"{config.tasks.source} source {config.tasks.path}"


def report_lines(answer: dict[str, Any], worst: int = WORST_SHOWN) -> list[str]:
    """What a user reads: accuracy with its interval, per tier, executing rate, the worst."""
    acc = answer["accuracy"]
    lines = [f"{answer['model']} on the {answer['split']} split of {answer['tasks_from']}"]
    if answer.get("loaded"):
        lines.append(f"  tasks: {answer['loaded']['summary']}")
    lines.append(f"  accuracy {acc['value']:.3f}  95% CI [{acc['low']:.3f}, {acc['high']:.3f}]"
                 f"  ({round(acc['value'] * acc['n'])} of {acc['n']})")
    decoding = answer.get("decoding") or {}
    if decoding.get("mode") == "vote":
        lines.append(f"  decoding: vote of {decoding['candidates']}; greedy alone "
                     f"{decoding['greedy_correct']} of {acc['n']}")
        if "any_answer_vote_correct" in decoding:
            lines.append(f"  the vote without its preference for non-empty answers: "
                         f"{decoding['any_answer_vote_correct']} of {acc['n']}")
    if "written_correct" in decoding:
        lines.append(f"  as written (no snapping): {decoding['written_correct']} of {acc['n']}")
    lines.append(f"  executing {answer['execute_rate']:.3f}   parsing {answer['parse_rate']:.3f}"
                 f"   mean reward {answer['mean_reward']:.3f}")
    for tier, est in answer["per_tier"].items():
        lines.append(f"    {tier:<13} {est['value']:.3f} [{est['low']:.3f}, {est['high']:.3f}]"
                     f"  n={est['n']}")
    failures = [s for s in answer["samples"] if not s["correct"]][:worst]
    if failures:
        lines.append(f"  worst {len(failures)} failures:")
    for sample in failures:
        error = f" ({sample['error'][:80]})" if sample.get("error") else ""
        lines.append(f"    [{sample['task']}] {sample['question'][:90]}")
        written = " ".join((sample["sql"] or "").split())[:140]
        lines.append(f"      -> {sample['outcome']}{error}: {written}")
    return lines


def write_answer(answer: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(answer, indent=1, default=str), encoding="utf-8")
    return path
