"""Which training prompts a GRPO step samples: uniformly, or by the signal the run meets on them.

A group teaches only when its rewards differ. With a result-only reward and a policy that
solves few training prompts, most groups are all zeros (a prompt solved with chance p gives a
signal in a group of 8 with chance 1 - p^8 - (1 - p)^8: 0.28 at p = 0.04). `PromptPicker`
keeps, per training task, what the run's own samples said about it, and draws prompts in
proportion to the chance that they carry a signal (online difficulty filtering, as ODF, GRESO
and Polaris do it):

    not yet drawn          the share of informative groups its tier has given so far
                           (Beta(1, 1) prior: tiers that never pass fall back, easier tiers
                           where something passes come first)
    last group informative 0.5 + 2 p (1 - p), p its pass rate then: highest near p = 0.5
    last group constant    `revisit` (all wrong or all right: seldom worth drawing again)

Everything it knows comes from the step entries of the trial's record (`observe`), so a
resumed trial rebuilds it from the steps it kept and draws exactly what it would have drawn.
Draws are seeded by (seed, step, round); the same run draws the same prompts.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from rewards import Task

Selection = Literal["uniform", "signal"]


def stable_seed(*parts: object) -> int:
    """A seed that depends only on its parts (not on Python's per-process hash salt)."""
    digest = hashlib.sha256(repr(parts).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def stable_rng(*parts: object) -> random.Random:
    return random.Random(stable_seed(*parts))


@dataclass(frozen=True)
class GroupOutcome:
    """What one sampled group said about its task (one entry of a step's `groups` list)."""

    task_id: str
    correct: int
    """Samples whose result matched the gold's."""
    samples: int
    informative: bool
    """Its rewards differed (it carried a signal)."""

    def as_list(self) -> list[Any]:
        return [self.task_id, self.correct, self.samples, self.informative]

    @classmethod
    def from_list(cls, item: Sequence[Any]) -> GroupOutcome:
        return cls(str(item[0]), int(item[1]), int(item[2]), bool(item[3]))


class PromptPicker:
    """Draws each step's training prompts; `observe` feeds it the groups a step sampled."""

    def __init__(self, tasks: Sequence[Task], selection: Selection, seed: int,
                 revisit: float = 0.1) -> None:
        if not tasks:
            raise ValueError("no training tasks to draw prompts from")
        self.tasks = list(tasks)
        self.selection = selection
        self.seed = seed
        self.revisit = revisit
        self._last: dict[str, GroupOutcome] = {}
        self._tier_seen: dict[str, int] = {}
        self._tier_informative: dict[str, int] = {}
        self._tier_of = {t.id: t.tier for t in self.tasks}

    # ------------------------------------------------------------ learning
    def observe(self, outcomes: Iterable[GroupOutcome]) -> None:
        for outcome in outcomes:
            self._last[outcome.task_id] = outcome
            tier = self._tier_of.get(outcome.task_id, "")
            self._tier_seen[tier] = self._tier_seen.get(tier, 0) + 1
            self._tier_informative[tier] = (self._tier_informative.get(tier, 0)
                                            + int(outcome.informative))

    def observe_record(self, steps: Iterable[dict[str, Any]]) -> None:
        """Rebuild from the RL step entries of a trial's record, in order."""
        for entry in steps:
            self.observe(GroupOutcome.from_list(g) for g in entry.get("groups") or [])

    def weight(self, task: Task) -> float:
        """The chance-of-signal weight `task` is drawn with (see the module docstring)."""
        last = self._last.get(task.id)
        if last is None:
            seen = self._tier_seen.get(task.tier, 0)
            return (self._tier_informative.get(task.tier, 0) + 1) / (seen + 2)
        if not last.informative:
            return self.revisit
        p = last.correct / max(1, last.samples)
        return 0.5 + 2 * p * (1 - p)

    def informative_share(self) -> float | None:
        """The share of groups so far that carried a signal (None before any)."""
        seen = sum(self._tier_seen.values())
        return sum(self._tier_informative.values()) / seen if seen else None

    # ------------------------------------------------------------ drawing
    def draw(self, step: int, round_: int, k: int, exclude: set[str] = frozenset()) -> list[Task]:
        """`k` distinct tasks not in `exclude`, seeded by (seed, step, round)."""
        pool = [t for t in self.tasks if t.id not in exclude]
        k = min(k, len(pool))
        rng = stable_rng(self.seed, "rl", step) if round_ == 0 else stable_rng(
            self.seed, "rl", step, round_)
        if self.selection == "uniform":
            return rng.sample(pool, k=k)
        # Weighted sampling without replacement (Efraimidis-Spirakis keys u^(1/w)).
        keyed = sorted(((rng.random() ** (1.0 / self.weight(t)), i) for i, t in enumerate(pool)),
                       reverse=True)
        return [pool[i] for _, i in keyed[:k]]
