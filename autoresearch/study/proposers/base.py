"""What every proposer sees and returns, so the study journals them all the same way.

A proposer reads a `Context` (the search space, the journal's trials, curve summaries) and
returns a `ProposalBatch`: up to `n` proposals, each a set of changes to the base trial with a
written rationale, plus how the batch came about (which proposer, outcome, attempts, errors),
which the journal stores verbatim in its `proposals` table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from autoresearch.study.space import Changes, SearchSpace, config_key

Outcome = Literal["sampled", "valid", "repaired", "retried", "fallback"]
"""`sampled`: an offline proposer; `valid`: the LLM's first answer validated; `repaired`: a later
answer validated after invalid ones; `retried`: a later answer validated after failed requests;
`fallback`: the LLM never gave a valid answer and the offline proposer proposed instead."""


@dataclass(frozen=True)
class Proposal:
    changes: Changes
    rationale: str


@dataclass
class ProposalBatch:
    proposer: str
    outcome: Outcome
    proposals: list[Proposal]
    attempts: int = 1
    errors: list[str] = field(default_factory=list)
    response: str | None = None
    """The LLM's last raw answer, kept for the journal."""


@dataclass
class Context:
    space: SearchSpace
    trials: list[dict[str, Any]]
    """Journal rows of every trial so far (all roles and statuses)."""
    best: dict[str, Any] | None = None
    curves: dict[str, str] = field(default_factory=dict)
    """Trial id -> one-line summary of its training curves."""
    goal: str = "dev_accuracy"

    def explored(self) -> list[dict[str, Any]]:
        """Trials that tried a configuration (not re-runs of one with another seed)."""
        return [t for t in self.trials if t["role"] in ("baseline", "explore")]

    def known_keys(self) -> set[str]:
        return {t["config_key"] for t in self.trials}

    def is_new(self, changes: Changes) -> bool:
        return config_key(self.space.apply(changes)) not in self.known_keys()


class Proposer(Protocol):
    name: str

    def propose(self, context: Context, n: int) -> ProposalBatch:
        """Up to `n` new trials; fewer when the space has no new configuration left."""
        ...
