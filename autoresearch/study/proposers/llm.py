"""The LLM researcher: reads the journal, writes hypotheses, returns validated trial configs.

One researcher, two transports (`backends`: Gemini through `google-genai`, or any
OpenAI-compatible endpoint such as vLLM or Ollama through `openai`). Each request asks for
structured output (a JSON schema built from the search space) and has a timeout. The answer is
parsed and validated here, never trusted: every change must lie in the declared space and the
resulting `TrialConfig` must validate. An invalid answer is sent back with the problems for
repair; a failed request is retried; after `max_attempts` requests the offline proposer
proposes instead. The batch records which of these happened.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, Protocol

from autoresearch.study.decisions import RULE
from autoresearch.study.proposers.base import Context, Outcome, Proposal, ProposalBatch, Proposer

Message = dict[str, str]
"""{"role": "system" | "user" | "assistant", "content": text}"""


class Backend(Protocol):
    name: str

    def complete(self, messages: list[Message], schema: dict[str, Any]) -> str:
        """The model's answer to `messages`, asked to follow `schema` (raises on failure)."""
        ...


class InvalidAnswer(ValueError):
    pass


SYSTEM = """\
You are an experienced machine-learning researcher running a study of reinforcement-learning
post-training: a LoRA adapter on a Gemma model learns text-to-SQL with GRPO, and every generated
query is executed against a DuckDB database and rewarded when its result matches the gold query.
The study maximises execution accuracy on a fixed dev set. Each trial changes a few fields of a
base configuration, within a declared search space.

Propose the next trials. For each one, write a short, falsifiable hypothesis (what you change,
why, and what you expect to see in the metrics), then the changes: a JSON object mapping
search-space field names to values. Fields you leave out keep their base values. Stay within the
bounds, never repeat a configuration already tried, and learn from the failures listed.

Keep rule of this study: {rule}
Differences smaller than the confidence intervals are noise, not findings.

Answer with JSON only: {{"trials": [{{"hypothesis": "...", "changes": {{...}}}}, ...]}}
"""


def response_schema(context: Context) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "trials": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "hypothesis": {"type": "string"},
                        "changes": context.space.json_schema(),
                    },
                    "required": ["hypothesis", "changes"],
                },
            }
        },
        "required": ["trials"],
    }


def _score(row: dict[str, Any]) -> str:
    if row.get("dev_accuracy") is None:
        return "no score"
    return (f"dev accuracy {row['dev_accuracy']:.3f} [{row['dev_low']:.3f}, "
            f"{row['dev_high']:.3f}] (n={row['dev_n']})")


def _line(row: dict[str, Any], curves: dict[str, str]) -> str:
    changes = json.dumps(row.get("changes") or {}, sort_keys=True)
    parts = [f"{row['id']} [{row['status']}] changes {changes}: {_score(row)}"]
    if row.get("rationale"):
        parts.append(f"hypothesis: {row['rationale'][:300]}")
    if row["id"] in curves:
        parts.append(f"curves: {curves[row['id']]}")
    if row.get("decision"):
        d = row["decision"]
        parts.append(f"decision: {d.get('verdict')} (difference vs best {d.get('value', 0):+.3f} "
                     f"[{d.get('low', 0):+.3f}, {d.get('high', 0):+.3f}])")
    if row.get("error"):
        parts.append(f"error: {row['error'][-300:]}")
    return "\n    ".join(parts)


def _clip(text: str | None, limit: int) -> str:
    text = " ".join((text or "").split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def describe_dev(row: dict[str, Any], failures: int = 3) -> str:
    """What one trial's dev evaluation says beyond its accuracy: accuracy per tier, the reward
    components' means, and a few failing completions with their outcome (bounded in size)."""
    dev = row.get("dev") or {}
    lines = [f"{row['id']} ({_score(row)}):"]
    tiers = dev.get("per_tier") or {}
    if tiers:
        lines.append("  per tier: " + ", ".join(
            f"{tier} {est['value']:.2f} (n={est['n']})" for tier, est in sorted(tiers.items())))
    components = dev.get("components") or {}
    if components:
        lines.append("  reward components (mean): " + ", ".join(
            f"{name} {value:.2f}" for name, value in sorted(components.items())))
    failing = [s for s in dev.get("samples") or [] if not s.get("correct")][:failures]
    for s in failing:
        error = f"; error: {_clip(s['error'], 120)}" if s.get("error") else ""
        lines.append(f"  failed {s.get('task')} [{s.get('tier') or '-'}] {s.get('outcome')}"
                     f"{error}\n    question: {_clip(s.get('question'), 160)}"
                     f"\n    wrote: {_clip(s.get('sql') or s.get('completion'), 200)}")
    return "\n".join(lines)


def describe_journal(context: Context, n: int, recent: int = 8, leaders: int = 5) -> str:
    """The researcher's view of the study: space, best trials, recent trials, failures, and
    what the best and the latest trials got wrong on dev."""
    explored = context.explored()
    scored = sorted((t for t in explored if t.get("dev_accuracy") is not None),
                    key=lambda t: -t["dev_accuracy"])
    failed = [t for t in explored if t["status"] in ("crashed", "discarded")]
    base = context.space.base_values()
    sections = [
        "Search space (field: allowed values; base value):\n" + "\n".join(
            f"  {path}: {text}; base {base[path]!r}"
            for path, text in context.space.describe().items()),
        f"Trials so far: {len(explored)} configurations explored.",
    ]
    if context.best is not None:
        sections.append("Current best:\n  " + _line(context.best, context.curves))
    if scored:
        sections.append("Leaderboard (dev):\n" + "\n".join(
            "  " + _line(t, context.curves) for t in scored[:leaders]))
    latest = explored[-recent:]
    if latest:
        sections.append("Most recent trials:\n" + "\n".join(
            "  " + _line(t, context.curves) for t in latest))
    if failed:
        sections.append("Recent failures (crashed or not better than the best):\n" + "\n".join(
            "  " + _line(t, context.curves) for t in failed[-recent:]))
    looked_at = [t for t in (context.best, latest[-1] if latest else None)
                 if t is not None and t.get("dev")]
    if looked_at:
        unique = list({t["id"]: t for t in looked_at}.values())
        sections.append("Dev evaluation details of the best and the latest trials (use them "
                        "before changing reward weights):\n" + "\n".join(
                            describe_dev(t) for t in unique))
    sections.append(f"Propose {n} new trial{'s' if n != 1 else ''}.")
    return "\n\n".join(sections)


def parse_answer(text: str, context: Context, n: int) -> list[Proposal]:
    """Proposals from a raw answer, or InvalidAnswer listing every problem found."""
    stripped = re.sub(r"^```(?:json)?\s*|\s*```$", "", (text or "").strip())
    try:
        data = json.loads(stripped)
    except ValueError as exc:
        raise InvalidAnswer(f"the answer is not JSON ({exc})") from exc
    items = data.get("trials") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise InvalidAnswer('the answer must be an object with a non-empty "trials" list')
    problems, proposals, seen = [], [], set()
    for i, item in enumerate(items[:n]):
        if not isinstance(item, dict):
            problems.append(f"trial {i}: not an object")
            continue
        hypothesis = item.get("hypothesis")
        if not isinstance(hypothesis, str) or not hypothesis.strip():
            problems.append(f"trial {i}: missing hypothesis")
            continue
        try:
            changes, config = context.space.validate(item.get("changes"))
        except ValueError as exc:
            problems.append(f"trial {i}: {exc}")
            continue
        if not context.is_new(changes) or config.fingerprint() in seen:
            problems.append(f"trial {i}: this configuration was already tried")
            continue
        seen.add(config.fingerprint())
        proposals.append(Proposal(changes, hypothesis.strip()))
    if problems:
        raise InvalidAnswer("; ".join(problems))
    return proposals


class LLMResearcher:
    """A proposer backed by an LLM, with bounded repair and an offline fallback."""

    def __init__(self, backend: Backend, fallback: Proposer, max_attempts: int = 3):
        self.backend = backend
        self.fallback = fallback
        self.max_attempts = max_attempts
        self.name = backend.name

    def propose(self, context: Context, n: int) -> ProposalBatch:
        schema = response_schema(context)
        messages: list[Message] = [
            {"role": "system", "content": SYSTEM.format(rule=RULE)},
            {"role": "user", "content": describe_journal(context, n)},
        ]
        errors: list[str] = []
        answer: str | None = None
        invalid_seen = False
        for attempt in range(1, self.max_attempts + 1):
            started = time.monotonic()
            try:
                answer = self.backend.complete(messages, schema)
            except Exception as exc:  # noqa: BLE001 - any transport failure is retried, then falls back
                errors.append(f"attempt {attempt}: request failed after "
                              f"{time.monotonic() - started:.1f}s: {type(exc).__name__}: "
                              f"{str(exc)[:300]}")
                continue
            try:
                proposals = parse_answer(answer, context, n)
            except InvalidAnswer as exc:
                invalid_seen = True
                errors.append(f"attempt {attempt}: invalid answer: {exc}")
                messages += [
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": f"That answer cannot be used: {exc}. Reply again "
                     "with the complete JSON object, fixing every problem listed."},
                ]
                continue
            outcome: Outcome = ("valid" if attempt == 1 else
                                "repaired" if invalid_seen else "retried")
            return ProposalBatch(self.name, outcome, proposals, attempt, errors, answer)
        batch = self.fallback.propose(context, n)
        return ProposalBatch(f"{self.fallback.name} (fallback from {self.name})", "fallback",
                             batch.proposals, self.max_attempts, errors, answer)

