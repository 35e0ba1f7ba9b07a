"""Proposers: where the next trials come from, all behind one interface (`Proposer`).

`OptunaProposer` (TPE or random search, offline, the default) and `LLMResearcher` (Gemini or any
OpenAI-compatible endpoint, falling back to the offline proposer). `make_proposer` builds the
one a study declares.

May import `autoresearch.study.spec`, `space` and `decisions`, and `autoresearch.rl`; not the
runner, executors or control.
"""

from __future__ import annotations

from autoresearch.study.proposers.base import Context, Proposal, ProposalBatch, Proposer
from autoresearch.study.proposers.llm import LLMResearcher
from autoresearch.study.proposers.offline import OptunaProposer
from autoresearch.study.spec import ProposerSpec

__all__ = [
    "Context",
    "LLMResearcher",
    "OptunaProposer",
    "Proposal",
    "ProposalBatch",
    "Proposer",
    "make_proposer",
]


def make_proposer(spec: ProposerSpec, seed: int = 0) -> Proposer:
    if spec.kind in ("optuna", "random"):
        return OptunaProposer("tpe" if spec.kind == "optuna" else "random", seed,
                              spec.startup_trials)
    from autoresearch.study.proposers.backends import GeminiBackend, OpenAIBackend

    fallback = OptunaProposer("tpe" if spec.fallback == "optuna" else "random", seed,
                              spec.startup_trials)
    if spec.kind == "gemini":
        backend = GeminiBackend(spec.model, spec.base_url, spec.api_key_env, spec.timeout_s,
                                spec.temperature)
    else:
        backend = OpenAIBackend(spec.model or "", spec.base_url, spec.api_key_env, spec.timeout_s,
                                spec.temperature)
    return LLMResearcher(backend, fallback, spec.max_attempts)
