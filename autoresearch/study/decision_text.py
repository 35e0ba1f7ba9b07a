"""What a keep/discard decision concluded, in words: the one place the terminal, the journal and
the report take a decision's wording from.

A bare "discarded (-0.125 [-0.260, +0.010])" reads as "worse"; what the rule concluded there is
that the candidate is *not better beyond noise*. The wording follows the interval: above zero is
better beyond noise, below zero is worse beyond noise, and an interval that holds zero is "not
better beyond noise" (no claim that it is worse).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def interval_text(decision: Mapping[str, Any]) -> str:
    """"+0.042 [-0.010, +0.094], 24 pairs" from a decision (journal row or trial decision)."""
    value = decision.get("value", decision.get("difference"))
    if value is None:
        return ""
    low, high, n = decision.get("low"), decision.get("high"), decision.get("n")
    text = f"{value:+.3f}"
    if low is not None and high is not None:
        text += f" [{low:+.3f}, {high:+.3f}]"
    if n:
        text += f", {n} pairs"
    return text


def decision_text(decision: Mapping[str, Any]) -> str:
    """One sentence for a decision: the verdict, what it means, the evidence.

    Reads the keys the study journals (`verdict`, `rule`, `against`/`incumbent`, `value`/
    `difference`, `low`, `high`, `n`, `seeds`, `note`), so a decision from any version of the
    keep rule can be worded here.
    """
    verdict = decision.get("verdict")
    rule = decision.get("rule")
    note = (decision.get("note") or "").strip()
    against = decision.get("against") or decision.get("incumbent") or "the best"
    if rule == "reference":
        return f"kept as the reference ({note})" if note else "kept as the reference"
    seeds = decision.get("seeds") or 1
    pooled = f" over {seeds} seeds" if seeds > 1 else ""
    evidence = interval_text(decision)
    high = decision.get("high")
    if rule == "first look" and verdict != "kept":
        # One run of the candidate against the incumbent's runs, over tasks: its interval
        # leaves the run's own luck out, so it says nothing "beyond noise" about the config.
        mean = f"the mean of {seeds} runs of {against}'s config" if seeds > 1 else against
        ahead = "behind" if high is not None and high < 0 else "not ahead of"
        text = (f"discarded: its one run was {ahead} {mean} on the first look, not enough to "
                "confirm it (the interval is over tasks for that one run)")
    elif verdict == "kept":
        text = f"kept: better than {against} beyond noise{pooled}"
    elif high is not None and high < 0:
        text = f"discarded: worse than {against} beyond noise{pooled}"
    elif rule == "pooled seeds":
        text = f"discarded: the re-runs did not confirm it better than {against} beyond noise"
    elif rule == "confirmation":
        text = (f"discarded: the fresh re-runs did not confirm it better than {against} "
                f"beyond noise{pooled}")
    else:
        text = f"discarded: not better than {against} beyond noise{pooled}"
    if evidence:
        text += f" (difference {evidence})"
    if decision.get("p_value") is not None and decision.get("alpha") is not None:
        text += f"; one-sided p={decision['p_value']:.3g} vs alpha {decision['alpha']:.3g}"
    if note and "budget" in note:
        text += f"; {note.removesuffix(': discarded')}"
    return text
