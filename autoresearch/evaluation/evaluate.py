"""Held-out evaluation: greedy decoding on a split, scored by execution match.

With `vote` > 0 each question also gets that many sampled queries, and the answer is the one
`voting.vote` picks from the greedy and sampled queries by what they return on the question's
database (execution-based self-consistency); the greedy figures and the share of questions any
candidate got right (a ceiling that reads the gold, never used to choose) are kept beside it.
With `snap_names` every query runs with the names its database lacks snapped onto the closest
ones it has (`rewards.snap`), with `snap_values` with the strings it compares a column with
snapped onto the column's values (`rewards.snap_values`); the greedy queries' figures as written
are kept beside those.

Reports execution accuracy with a 95% Wilson interval, accuracy per difficulty tier, parse and
execution rates, and the mean reward with its components. The per-task verdicts are kept so two
evaluations on the same tasks can be compared with a paired interval, and a few samples
(failures first, with their outcome and error) so a researcher can see what went wrong.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import tinker
from tinker import types

from autoresearch.evaluation.stats import Estimate, wilson
from autoresearch.evaluation.voting import vote as choose_by_vote
from rewards import RewardConfig, RewardPool, ScoreResult, Task
from sqltasks import STOP_SEQUENCES, SchemaView, render_prompt


@dataclass
class EvalResult:
    split: str
    accuracy: Estimate
    per_tier: dict[str, Estimate]
    parse_rate: float
    execute_rate: float
    mean_reward: float
    components: dict[str, float]
    verdicts: dict[str, bool] = field(default_factory=dict)
    samples: list[dict[str, Any]] = field(default_factory=list)
    decoding: dict[str, Any] = field(default_factory=lambda: {"mode": "greedy"})
    """How answers were chosen; for voting, also the greedy answers' figures."""

    def summary(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "accuracy": self.accuracy.as_dict(),
            "per_tier": {tier: est.as_dict() for tier, est in self.per_tier.items()},
            "parse_rate": self.parse_rate,
            "execute_rate": self.execute_rate,
            "mean_reward": self.mean_reward,
            "components": self.components,
            "verdicts": self.verdicts,
            "samples": self.samples,
            "decoding": self.decoding,
        }


def prompt_tokens(tokenizer: Any, task: Task, style: str,
                  view: SchemaView | None = None) -> list[int]:
    return list(tokenizer.encode(render_prompt(task, style, view=view)))


def sample_completions(
    sampler: tinker.SamplingClient,
    tokenizer: Any,
    tasks: Sequence[Task],
    style: str,
    max_tokens: int,
    num_samples: int = 1,
    temperature: float = 0.0,
    seed: int = 0,
    view: SchemaView | None = None,
) -> list[list[Any]]:
    """Submit every prompt at once (the server batches them), then collect in order.

    Every prompt is rendered and tokenized before the first is sent: requests that arrive
    within milliseconds of each other decode in one batch (and share their schema's prefill),
    while rendering between submissions would spread them past the server's batching window."""
    params = types.SamplingParams(
        max_tokens=max_tokens, temperature=temperature, seed=seed, stop=list(STOP_SEQUENCES[style])
    )
    prompts = [types.ModelInput.from_ints(prompt_tokens(tokenizer, task, style, view))
               for task in tasks]
    futures = [sampler.sample(prompt, num_samples=num_samples, sampling_params=params)
               for prompt in prompts]
    return [list(f.result().sequences) for f in futures]


def summarise(
    split: str,
    tasks: Sequence[Task],
    results: Sequence[ScoreResult],
    completions: Sequence[str] = (),
    keep_samples: int = 8,
) -> EvalResult:
    correct = [r.correct for r in results]
    by_tier: dict[str, list[bool]] = defaultdict(list)
    for task, ok in zip(tasks, correct):
        by_tier[task.tier or "all"].append(ok)
    n = max(1, len(results))
    components: dict[str, float] = defaultdict(float)
    for r in results:
        for name, value in r.components.as_dict().items():
            components[name] += value / n
    # Failures first: they are what a researcher reads before changing the reward.
    triples = list(zip(tasks, results, completions))
    triples = [x for x in triples if not x[1].correct] + [x for x in triples if x[1].correct]
    samples = [
        {
            "task": t.id,
            "tier": t.tier,
            "question": t.question,
            "completion": c,
            "sql": r.sql,
            "written": r.snapped_from,
            "correct": r.correct,
            "reward": round(r.total, 4),
            "outcome": r.outcome if r.correct or r.outcome != "ok" else "wrong_result",
            "error": (r.error or "")[:300] or None,
        }
        for t, r, c in triples[:keep_samples]
    ]
    return EvalResult(
        split=split,
        accuracy=wilson(sum(correct), len(correct)),
        per_tier={tier: wilson(sum(v), len(v)) for tier, v in sorted(by_tier.items())},
        parse_rate=sum(r.components.parses > 0 for r in results) / n,
        execute_rate=sum(r.components.executes > 0 for r in results) / n,
        mean_reward=sum(r.total for r in results) / n,
        components=dict(components),
        verdicts={t.id: ok for t, ok in zip(tasks, correct)},
        samples=samples,
    )


def evaluate(
    sampler: tinker.SamplingClient,
    tokenizer: Any,
    tasks: Sequence[Task],
    split: str,
    pool: RewardPool,
    reward: RewardConfig,
    style: str = "base",
    max_tokens: int = 96,
    view: SchemaView | None = None,
    vote: int = 0,
    vote_temperature: float = 0.8,
    seed: int = 0,
    snap_names: bool = False,
    snap_values: bool = False,
    keep_samples: int = 8,
) -> EvalResult:
    """Greedy decoding on `tasks`, scored in the sandbox; with `vote` > 0, the answer each
    question's greedy and `vote` sampled queries agree on; with `snap_names` (`snap_values`),
    every query run with the names (strings) its database lacks snapped onto it (see the
    module docstring)."""
    def decoded(sequences: list[list[Any]]) -> list[list[str]]:
        return [[tokenizer.decode(s.tokens) for s in seqs] for seqs in sequences]

    candidates = decoded(sample_completions(sampler, tokenizer, tasks, style, max_tokens,
                                            view=view))
    if vote:
        sampled = decoded(sample_completions(sampler, tokenizer, tasks, style, max_tokens,
                                             num_samples=vote, temperature=vote_temperature,
                                             seed=seed, view=view))
        candidates = [greedy[:1] + more for greedy, more in zip(candidates, sampled)]
    snapping = {"snap_names": snap_names, "snap_values": snap_values}
    scoring = reward.model_copy(update=snapping) if any(snapping.values()) else reward
    flat = pool.score_many([(c, t) for t, cs in zip(tasks, candidates) for c in cs], scoring)
    scored, start = [], 0
    for cs in candidates:
        scored.append(flat[start:start + len(cs)])
        start += len(cs)
    picks = [choose_by_vote(results) for results in scored] if vote else [0] * len(tasks)
    result = summarise(split, tasks, [r[i] for r, i in zip(scored, picks)],
                       [c[i] for c, i in zip(candidates, picks)], keep_samples)
    n = max(1, len(tasks))
    if vote:
        result.decoding = {
            "mode": "vote",
            "candidates": vote + 1,
            "temperature": vote_temperature,
            "seed": seed,
            "greedy_correct": sum(r[0].correct for r in scored),
            "greedy_execute_rate": sum(r[0].components.executes > 0 for r in scored) / n,
            "greedy_verdicts": {t.id: r[0].correct for t, r in zip(tasks, scored)},
            "chose_greedy": sum(i == 0 for i in picks),
            "any_correct": sum(any(x.correct for x in r) for r in scored),
        }
        # The same vote without its preference for non-empty answers (which pays where every
        # gold answers something, as on the corpora and the transfer split).
        plain = [r[choose_by_vote(r, prefer_non_empty=False)] for r in scored]
        result.decoding.update({
            "any_answer_vote_correct": sum(r.correct for r in plain),
            "any_answer_vote_execute_rate": sum(r.components.executes > 0 for r in plain) / n,
        })
    if any(snapping.values()):
        as_written = reward.model_copy(update={"snap_names": False, "snap_values": False})
        written = pool.score_many([(c[0], t) for t, c in zip(tasks, candidates)], as_written)
        result.decoding.update({
            **{k: True for k, v in snapping.items() if v},
            "snapped": sum(r[i].snapped_from is not None for r, i in zip(scored, picks)),
            "written_correct": sum(r.correct for r in written),
            "written_execute_rate": sum(r.components.executes > 0 for r in written) / n,
            "written_verdicts": {t.id: r.correct for t, r in zip(tasks, written)},
        })
    return result
