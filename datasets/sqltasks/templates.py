"""Question templates by difficulty tier, each with paraphrases, a gold query and near misses.

A template is written once against column *roles* ({P}, {c_amt}, ...) and instantiated for every
schema variant. `params` draws the literals from the first database copy (values that exist,
thresholds that sit on a row), so a result is rarely empty. The near misses are plausible wrong
queries (flipped comparison, wrong aggregate, missing filter, inverted anti-join, reversed
order); the generator keeps a task only if each near miss gives a different result on at least
one copy. `check`, when present, must return true on every copy (for example: no tie at a
LIMIT cut-off).
"""

from __future__ import annotations

import random
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqltasks.database import Instance

TIERS = ("filter", "aggregate", "group_having", "join", "subquery", "window")
Params = dict[str, Any]


@dataclass(frozen=True)
class Template:
    key: str
    tier: str
    questions: tuple[str, ...]
    gold: str
    near: tuple[str, ...]
    params: Callable[[Instance, random.Random], Params] | None = None
    check: str | None = None


def _values(rows: tuple[dict[str, Any], ...], role: str) -> list[Any]:
    return sorted({r[role] for r in rows})


def _rows(inst: Instance, role: str) -> tuple[dict[str, Any], ...]:
    return inst.parents if role.startswith("p_") else inst.children


def _category(role: str) -> Callable[[Instance, random.Random], Params]:
    def pick(inst: Instance, rng: random.Random) -> Params:
        return {"v": rng.choice(_values(_rows(inst, role), role))}
    return pick


def _middle(values: list[Any], rng: random.Random) -> Any:
    """A value that exists and sits in the middle half, so both sides of it are populated."""
    lo, hi = len(values) // 4, max(len(values) // 4 + 1, (3 * len(values)) // 4)
    return values[rng.randrange(lo, hi)]


def _threshold(role: str) -> Callable[[Instance, random.Random], Params]:
    def pick(inst: Instance, rng: random.Random) -> Params:
        value = _middle(_values(_rows(inst, role), role), rng)
        return {"t": f"{value:.2f}" if isinstance(value, float) else value}
    return pick


def _category_and_threshold(cat: str, num: str) -> Callable[[Instance, random.Random], Params]:
    def pick(inst: Instance, rng: random.Random) -> Params:
        return {**_category(cat)(inst, rng), **_threshold(num)(inst, rng)}
    return pick


def _date(inst: Instance, rng: random.Random) -> Params:
    return {"d": _middle(_values(inst.children, "c_date"), rng).isoformat()}


def _count_threshold(role: str) -> Callable[[Instance, random.Random], Params]:
    def pick(inst: Instance, rng: random.Random) -> Params:
        counts = sorted(set(Counter(r[role] for r in _rows(inst, role)).values()))
        return {"k": rng.choice(counts[:-1] or counts)}
    return pick


def _average_threshold(group: str, value: str) -> Callable[[Instance, random.Random], Params]:
    def pick(inst: Instance, rng: random.Random) -> Params:
        rows = _rows(inst, group)
        groups: dict[Any, list[float]] = {}
        for r in rows:
            groups.setdefault(r[group], []).append(float(r[value]))
        means = sorted(statistics.fmean(v) for v in groups.values())
        i = rng.randrange(len(means) - 1) if len(means) > 1 else 0
        upper = means[i + 1] if len(means) > 1 else means[0] + 1
        return {"t": f"{(means[i] + upper) / 2:.2f}"}
    return pick


def _top_k(inst: Instance, rng: random.Random) -> Params:
    k = rng.choice((3, 4, 5))
    return {"k": k, "k1": k - 1}


def _category_top_k(inst: Instance, rng: random.Random) -> Params:
    return {**_category("c_cat")(inst, rng), **_top_k(inst, rng)}


TEMPLATES: tuple[Template, ...] = (
    # --- filter: one table, WHERE only
    Template(
        "filter_count", "filter",
        ("How many {Ps} have {p_cat_} '{v}'?",
         "Count the {Ps} whose {p_cat_} is '{v}'.",
         "What is the number of {Ps} with a {p_cat_} of '{v}'?"),
        "SELECT COUNT(*) FROM {P} WHERE {p_cat} = '{v}'",
        ("SELECT COUNT(*) FROM {P} WHERE {p_cat} <> '{v}'", "SELECT COUNT(*) FROM {P}"),
        _category("p_cat"),
    ),
    Template(
        "filter_greater", "filter",
        ("List the {p_name_} of every {P1} whose {p_num_} is greater than {t}.",
         "Which {Ps} have a {p_num_} above {t}? Give their {p_name_}.",
         "Show the {p_name_} of {Ps} with {p_num_} strictly more than {t}."),
        "SELECT {p_name} FROM {P} WHERE {p_num} > {t}",
        ("SELECT {p_name} FROM {P} WHERE {p_num} >= {t}",
         "SELECT {p_name} FROM {P} WHERE {p_num} < {t}"),
        _threshold("p_num"),
    ),
    Template(
        "filter_two_conditions", "filter",
        ("Which {Cs} have {c_cat_} '{v}' and a {c_amt_} below {t}? List their {c_name_}.",
         "Give the {c_name_} of {Cs} with {c_cat_} '{v}' whose {c_amt_} is less than {t}."),
        "SELECT {c_name} FROM {C} WHERE {c_cat} = '{v}' AND {c_amt} < {t}",
        ("SELECT {c_name} FROM {C} WHERE {c_cat} = '{v}' OR {c_amt} < {t}",
         "SELECT {c_name} FROM {C} WHERE {c_cat} = '{v}' AND {c_amt} > {t}",
         "SELECT {c_name} FROM {C} WHERE {c_cat} = '{v}'"),
        _category_and_threshold("c_cat", "c_amt"),
    ),
    # --- aggregate: one aggregate over a filtered table
    Template(
        "aggregate_average", "aggregate",
        ("What is the average {c_amt_} of {Cs} with {c_cat_} '{v}'? Round to 2 decimals.",
         "Give the mean {c_amt_}, rounded to two decimal places, over {Cs} whose {c_cat_} is "
         "'{v}'."),
        "SELECT ROUND(AVG({c_amt}), 2) FROM {C} WHERE {c_cat} = '{v}'",
        ("SELECT ROUND(AVG({c_amt}), 2) FROM {C}",
         "SELECT ROUND(SUM({c_amt}), 2) FROM {C} WHERE {c_cat} = '{v}'",
         "SELECT ROUND(MAX({c_amt}), 2) FROM {C} WHERE {c_cat} = '{v}'"),
        _category("c_cat"),
    ),
    Template(
        "aggregate_max", "aggregate",
        ("What is the highest {p_num_} among {Ps} with {p_cat_} '{v}'?",
         "Among {Ps} whose {p_cat_} is '{v}', what is the largest {p_num_}?"),
        "SELECT MAX({p_num}) FROM {P} WHERE {p_cat} = '{v}'",
        ("SELECT MIN({p_num}) FROM {P} WHERE {p_cat} = '{v}'",
         "SELECT MAX({p_num}) FROM {P}"),
        _category("p_cat"),
        "SELECT COUNT(*) >= 2 FROM {P} WHERE {p_cat} = '{v}'",
    ),
    Template(
        "aggregate_sum_since", "aggregate",
        ("What is the total {c_num_} of {Cs} with a {c_date_} on or after {d}?",
         "Add up the {c_num_} of all {Cs} whose {c_date_} is {d} or later."),
        "SELECT SUM({c_num}) FROM {C} WHERE {c_date} >= DATE '{d}'",
        ("SELECT SUM({c_num}) FROM {C} WHERE {c_date} < DATE '{d}'",
         "SELECT COUNT(*) FROM {C} WHERE {c_date} >= DATE '{d}'",
         "SELECT SUM({c_num}) FROM {C}"),
        _date,
    ),
    # --- group_having: GROUP BY, with or without HAVING
    Template(
        "group_count", "group_having",
        ("For each {p_cat_}, how many {Ps} are there?",
         "Count the {Ps} per {p_cat_}; show the {p_cat_} and the count.",
         "Give every {p_cat_} together with its number of {Ps}."),
        "SELECT {p_cat}, COUNT(*) FROM {P} GROUP BY {p_cat}",
        ("SELECT {p_cat}, SUM({p_num}) FROM {P} GROUP BY {p_cat}",
         "SELECT {p_cat}, COUNT(DISTINCT {p_cat}) FROM {P} GROUP BY {p_cat}"),
    ),
    Template(
        "group_having_count", "group_having",
        ("Which {c_cat_} values occur in more than {k} {Cs}?",
         "List each {c_cat_} that appears on over {k} {Cs}."),
        "SELECT {c_cat} FROM {C} GROUP BY {c_cat} HAVING COUNT(*) > {k}",
        ("SELECT {c_cat} FROM {C} GROUP BY {c_cat} HAVING COUNT(*) >= {k}",
         "SELECT {c_cat} FROM {C} GROUP BY {c_cat} HAVING COUNT(*) < {k}",
         "SELECT {c_cat} FROM {C} GROUP BY {c_cat}"),
        _count_threshold("c_cat"),
    ),
    Template(
        "group_having_average", "group_having",
        ("List each {p_cat_} whose {Ps} have an average {p_amt_} above {t}, with that average "
         "rounded to 2 decimals.",
         "For which {p_cat_} values does the mean {p_amt_} of the {Ps} exceed {t}? Show the "
         "{p_cat_} and the mean rounded to two decimals."),
        "SELECT {p_cat}, ROUND(AVG({p_amt}), 2) FROM {P} GROUP BY {p_cat} "
        "HAVING AVG({p_amt}) > {t}",
        ("SELECT {p_cat}, ROUND(AVG({p_amt}), 2) FROM {P} GROUP BY {p_cat} "
         "HAVING AVG({p_amt}) < {t}",
         "SELECT {p_cat}, ROUND(AVG({p_amt}), 2) FROM {P} GROUP BY {p_cat}",
         "SELECT {p_cat}, ROUND(SUM({p_amt}), 2) FROM {P} GROUP BY {p_cat} "
         "HAVING AVG({p_amt}) > {t}"),
        _average_threshold("p_cat", "p_amt"),
    ),
    # --- join: parent and child together
    Template(
        "join_filter", "join",
        ("Which {Ps} have at least one {C1} with {c_cat_} '{v}'? List their {p_name_}.",
         "Give the {p_name_} of every {P1} that has a {C1} whose {c_cat_} is '{v}'; list each "
         "{P1} once."),
        "SELECT DISTINCT p.{p_name} FROM {P} p JOIN {C} c ON c.{fk} = p.id WHERE c.{c_cat} = '{v}'",
        ("SELECT DISTINCT p.{p_name} FROM {P} p JOIN {C} c ON c.{fk} = p.id "
         "WHERE c.{c_cat} <> '{v}'",
         "SELECT DISTINCT p.{p_name} FROM {P} p JOIN {C} c ON c.{fk} = p.id"),
        _category("c_cat"),
    ),
    Template(
        "join_count", "join",
        ("For each {P1} that has {Cs}, give its {p_name_} and how many {Cs} it has.",
         "List the {p_name_} of every {P1} with at least one {C1}, and its number of {Cs}."),
        "SELECT p.{p_name}, COUNT(*) FROM {P} p JOIN {C} c ON c.{fk} = p.id "
        "GROUP BY p.id, p.{p_name}",
        ("SELECT p.{p_name}, COUNT(*) FROM {P} p LEFT JOIN {C} c ON c.{fk} = p.id "
         "GROUP BY p.id, p.{p_name}",
         "SELECT p.{p_name}, COUNT(DISTINCT c.{c_cat}) FROM {P} p JOIN {C} c ON c.{fk} = p.id "
         "GROUP BY p.id, p.{p_name}"),
    ),
    Template(
        "join_sum", "join",
        ("What is the total {c_amt_} of {Cs} that belong to {Ps} with {p_cat_} '{v}'?",
         "Sum the {c_amt_} over all {Cs} whose {P1} has {p_cat_} '{v}'."),
        "SELECT SUM(c.{c_amt}) FROM {C} c JOIN {P} p ON c.{fk} = p.id WHERE p.{p_cat} = '{v}'",
        ("SELECT SUM(c.{c_amt}) FROM {C} c JOIN {P} p ON c.{fk} = p.id WHERE p.{p_cat} <> '{v}'",
         "SELECT AVG(c.{c_amt}) FROM {C} c JOIN {P} p ON c.{fk} = p.id WHERE p.{p_cat} = '{v}'"),
        _category("p_cat"),
    ),
    # --- subquery: scalar subqueries and anti-joins
    Template(
        "subquery_anti_join", "subquery",
        ("Which {Ps} have no {Cs} at all? List their {p_name_}.",
         "Give the {p_name_} of every {P1} without any {C1}."),
        "SELECT {p_name} FROM {P} WHERE id NOT IN (SELECT {fk} FROM {C})",
        ("SELECT {p_name} FROM {P} WHERE id IN (SELECT {fk} FROM {C})",
         "SELECT {p_name} FROM {P}"),
    ),
    Template(
        "subquery_above_average", "subquery",
        ("List the {c_name_} of {Cs} whose {c_amt_} is above the average {c_amt_} of all {Cs}.",
         "Which {Cs} have a higher {c_amt_} than the overall average? Give their {c_name_}."),
        "SELECT {c_name} FROM {C} WHERE {c_amt} > (SELECT AVG({c_amt}) FROM {C})",
        ("SELECT {c_name} FROM {C} WHERE {c_amt} < (SELECT AVG({c_amt}) FROM {C})",
         "SELECT {c_name} FROM {C} WHERE {c_amt} > (SELECT MIN({c_amt}) FROM {C})"),
    ),
    Template(
        "subquery_owner_of_max", "subquery",
        ("Which {P1} does the {C1} with the highest {c_num_} belong to? Give its {p_name_}.",
         "Give the {p_name_} of the {P1} owning the {C1} with the largest {c_num_}."),
        "SELECT {p_name} FROM {P} WHERE id IN "
        "(SELECT {fk} FROM {C} WHERE {c_num} = (SELECT MAX({c_num}) FROM {C}))",
        ("SELECT {p_name} FROM {P} WHERE id IN "
         "(SELECT {fk} FROM {C} WHERE {c_num} = (SELECT MIN({c_num}) FROM {C}))",),
        None,
        "SELECT COUNT(*) = 1 FROM {C} WHERE {c_num} = (SELECT MAX({c_num}) FROM {C})",
    ),
    Template(
        "subquery_in_category", "subquery",
        ("List the {c_name_} of {Cs} belonging to a {P1} whose {p_cat_} is '{v}'.",
         "Which {Cs} are owned by {Ps} with {p_cat_} '{v}'? Give their {c_name_}."),
        "SELECT {c_name} FROM {C} WHERE {fk} IN (SELECT id FROM {P} WHERE {p_cat} = '{v}')",
        ("SELECT {c_name} FROM {C} WHERE {fk} NOT IN (SELECT id FROM {P} WHERE {p_cat} = '{v}')",
         "SELECT {c_name} FROM {C}"),
        _category("p_cat"),
    ),
    # --- window: ranking, top-k, running totals
    Template(
        "window_top_per_group", "window",
        ("For each {p_cat_}, which {P1} has the highest {p_num_}? Show the {p_cat_} and the "
         "{p_name_}, including ties.",
         "Give, per {p_cat_}, the {p_name_} of the {P1} with the largest {p_num_} (keep ties)."),
        "SELECT {p_cat}, {p_name} FROM {P} "
        "QUALIFY RANK() OVER (PARTITION BY {p_cat} ORDER BY {p_num} DESC) = 1",
        ("SELECT {p_cat}, {p_name} FROM {P} "
         "QUALIFY RANK() OVER (PARTITION BY {p_cat} ORDER BY {p_num} ASC) = 1",
         "SELECT {p_cat}, {p_name} FROM {P} QUALIFY RANK() OVER (ORDER BY {p_num} DESC) = 1"),
    ),
    Template(
        "window_top_k", "window",
        ("List the {k} {Cs} with the largest {c_amt_}, largest first, with their {c_amt_}.",
         "Show the {c_name_} and {c_amt_} of the top {k} {Cs} by {c_amt_}, in descending order."),
        "SELECT {c_name}, {c_amt} FROM {C} ORDER BY {c_amt} DESC LIMIT {k}",
        ("SELECT {c_name}, {c_amt} FROM {C} ORDER BY {c_amt} ASC LIMIT {k}",
         "SELECT {c_name}, {c_amt} FROM {C} ORDER BY {c_amt} DESC LIMIT {k1}"),
        _top_k,
        "SELECT (SELECT COUNT(*) FROM {C} WHERE {c_amt} >= "
        "(SELECT {c_amt} FROM {C} ORDER BY {c_amt} DESC LIMIT 1 OFFSET {k1})) = {k}",
    ),
    Template(
        "window_running_total", "window",
        ("For the {Cs} with {c_cat_} '{v}', in order of {c_date_}, show the {c_name_}, the "
         "{c_date_} and the running total of {c_num_}.",
         "List {Cs} whose {c_cat_} is '{v}' by {c_date_} (earliest first) with their {c_name_}, "
         "{c_date_} and cumulative {c_num_}."),
        "SELECT {c_name}, {c_date}, SUM({c_num}) OVER (ORDER BY {c_date}) FROM {C} "
        "WHERE {c_cat} = '{v}' ORDER BY {c_date}",
        ("SELECT {c_name}, {c_date}, SUM({c_num}) OVER () FROM {C} "
         "WHERE {c_cat} = '{v}' ORDER BY {c_date}",
         "SELECT {c_name}, {c_date}, SUM({c_num}) OVER (ORDER BY {c_date}) FROM {C} "
         "WHERE {c_cat} = '{v}' ORDER BY {c_date} DESC"),
        _category("c_cat"),
    ),
    Template(
        "window_rank", "window",
        ("Rank the {Ps} by {p_amt_} within each {p_cat_}, highest first; ties share a rank. Show "
         "the {p_cat_}, the {p_name_} and the rank.",
         "Within every {p_cat_}, give each {P1}'s {p_name_} and its rank by {p_amt_} "
         "(1 = highest, equal values tie)."),
        "SELECT {p_cat}, {p_name}, RANK() OVER (PARTITION BY {p_cat} ORDER BY {p_amt} DESC) "
        "FROM {P}",
        ("SELECT {p_cat}, {p_name}, RANK() OVER (PARTITION BY {p_cat} ORDER BY {p_amt} ASC) "
         "FROM {P}",
         "SELECT {p_cat}, {p_name}, RANK() OVER (ORDER BY {p_amt} DESC) FROM {P}"),
    ),
    Template(
        "window_top_k_in_category", "window",
        ("Among {Cs} with {c_cat_} '{v}', list the {k} with the smallest {c_num_} and their "
         "{c_num_}, smallest first.",
         "Show the {c_name_} and {c_num_} of the {k} {Cs} in {c_cat_} '{v}' with the lowest "
         "{c_num_}, in ascending order."),
        "SELECT {c_name}, {c_num} FROM {C} WHERE {c_cat} = '{v}' ORDER BY {c_num} ASC LIMIT {k}",
        ("SELECT {c_name}, {c_num} FROM {C} WHERE {c_cat} = '{v}' ORDER BY {c_num} DESC LIMIT {k}",
         "SELECT {c_name}, {c_num} FROM {C} ORDER BY {c_num} ASC LIMIT {k}"),
        _category_top_k,
        "SELECT (SELECT COUNT(*) FROM {C} WHERE {c_cat} = '{v}' AND {c_num} <= "
        "(SELECT {c_num} FROM {C} WHERE {c_cat} = '{v}' ORDER BY {c_num} LIMIT 1 OFFSET {k1}))"
        " = {k}",
    ),
)
