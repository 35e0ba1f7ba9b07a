"""Naming styles real databases use, so that a model must read the schema instead of guessing.

A style turns an entity's words into a table name, a primary key and column names:
snake_case plural or singular tables, PascalCase with `ID` suffixes, camelCase columns,
abbreviated legacy names (`emp_hire_dt`), and quoted names with spaces (`"Hire Date"`).
`quote` adds double quotes exactly where DuckDB needs them.
"""

from __future__ import annotations

import re

STYLES = ("snake_plural", "snake_singular", "pascal", "camel", "abbreviated", "quoted")

RESERVED = frozenset((
    "all", "analyse", "analyze", "and", "any", "array", "as", "asc", "asymmetric", "both",
    "case", "cast", "check", "collate", "column", "constraint", "create", "default",
    "deferrable", "desc", "describe", "distinct", "do", "else", "end", "except", "false",
    "fetch", "for", "foreign", "from", "group", "having", "in", "initially", "intersect",
    "into", "lambda", "lateral", "leading", "limit", "not", "null", "offset", "on", "only",
    "or", "order", "pivot", "pivot_longer", "pivot_wider", "placing", "primary", "qualify",
    "references", "returning", "select", "show", "some", "summarize", "symmetric", "table",
    "then", "to", "trailing", "true", "union", "unique", "unpivot", "using", "variadic",
    "when", "where", "window", "with",
))
"""DuckDB's reserved keywords (`duckdb_keywords()`, category `reserved`)."""

_ABBREVIATIONS = {
    "amount": "amt", "appointment": "appt", "category": "cat", "customer": "cust",
    "date": "dt", "department": "dept", "description": "desc", "doctor": "dr",
    "employee": "emp", "inspection": "insp", "invoice": "inv", "manager": "mgr",
    "member": "mbr", "number": "no", "patient": "pat", "percent": "pct", "price": "prc",
    "product": "prod", "purchase": "purch", "quantity": "qty", "registration": "reg",
    "reservation": "resv", "salary": "sal", "shipment": "shpt", "supervisor": "supv",
    "supplier": "supp", "total": "tot", "warehouse": "whse", "name": "nm", "count": "cnt",
}
_SIMPLE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def quote(identifier: str) -> str:
    """The identifier as DuckDB reads it: bare when it can be, else in double quotes."""
    if _SIMPLE.match(identifier) and identifier.lower() not in RESERVED:
        return identifier
    return '"' + identifier.replace('"', '""') + '"'


def _words(text: str) -> list[str]:
    return [w for w in text.split("_") if w]


def _abbreviate(word: str) -> str:
    if word in _ABBREVIATIONS:
        return _ABBREVIATIONS[word]
    return word if len(word) <= 5 else word[:4]


def _pascal(words: list[str]) -> str:
    return "".join(w[:1].upper() + w[1:] for w in words)


def table_name(style: str, singular: str, plural: str) -> str:
    if style == "snake_plural":
        return plural
    if style == "snake_singular":
        return singular
    if style == "pascal":
        return _pascal(_words(plural))
    if style == "camel":
        return _pascal(_words(singular))
    if style == "abbreviated":
        return "tbl_" + "_".join(_abbreviate(w) for w in _words(singular))
    if style == "quoted":
        return " ".join(w.capitalize() for w in _words(plural))
    raise ValueError(f"unknown naming style {style!r}")


def key_name(style: str, singular: str) -> str:
    """The primary key column of an entity's table."""
    if style == "snake_plural":
        return "id"
    if style == "snake_singular":
        return f"{singular}_id"
    if style == "pascal":
        return _pascal(_words(singular)) + "ID"
    if style == "camel":
        return "id"
    if style == "abbreviated":
        return "_".join(_abbreviate(w) for w in _words(singular)) + "_no"
    if style == "quoted":
        return "ID"
    raise ValueError(f"unknown naming style {style!r}")


def column_name(style: str, words: str, reference: bool = False) -> str:
    """An attribute's column, or a foreign key's (`reference`: the role's words plus Id)."""
    parts = _words(words) + (["id"] if reference else [])
    if style in ("snake_plural", "snake_singular"):
        return "_".join(parts)
    if style == "pascal":
        name = _pascal(parts)
        return name[:-2] + "ID" if reference else name
    if style == "camel":
        name = _pascal(parts)
        return name[:1].lower() + name[1:]
    if style == "abbreviated":
        return "_".join(_abbreviate(w) if w != "id" else "no" for w in parts)
    if style == "quoted":
        text = " ".join(w.capitalize() for w in parts)
        return text[:-2] + "ID" if reference else text
    raise ValueError(f"unknown naming style {style!r}")
