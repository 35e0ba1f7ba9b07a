"""The static gate in front of the sandbox: which SQL text may run at all.

It parses the prediction with sqlglot and admits exactly one query (SELECT, set operation or
FROM-first) whose tables are all bare names from the task's schema or its own CTEs. It refuses
table functions, file paths, qualified and system names, and the scalar functions that build
huge values from nothing. The gate only narrows what runs; the worker's hard memory cap and kill
timeout remain the last line of defence.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache

import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError


class Verdict(enum.StrEnum):
    OK = "ok"
    """Admitted: the query may run."""
    SYNTAX = "syntax"
    """Does not parse; an honest mistake, not an attack."""
    UNKNOWN_TABLE = "unknown_table"
    """Names a plain table the schema lacks; not run (a hallucinated name or a probe)."""
    REFUSED = "refused"
    """Not a single read-only query over the schema; scores zero whatever the weights."""


@dataclass(frozen=True)
class GateResult:
    verdict: Verdict
    reason: str = ""


_QUERY_ROOTS = (exp.Select, exp.SetOperation)
_PLAIN_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DENIED_CLASSES = (
    exp.Repeat,
    exp.GenerateSeries,
    exp.Pad,
    exp.Unnest,
    exp.Explode,
)
_DENIED_NAMES = frozenset(
    {
        "repeat", "range", "generate_series", "lpad", "rpad", "printf", "format", "getenv",
        "glob", "query", "query_table", "list_resize", "array_resize", "unnest", "read_text",
        "read_blob", "read_csv", "read_csv_auto", "read_json", "read_json_auto", "read_parquet",
        "parquet_scan", "sniff_csv", "current_setting", "setseed", "nextval", "currval",
        "pg_sleep", "sleep", "bar", "list_grade_up", "string_split_regex",
    }
)
_DENIED_NODES = (
    exp.Command,
    exp.Pragma,
    exp.Set,
    exp.Copy,
    exp.Attach,
    exp.Detach,
    exp.Insert,
    exp.Update,
    exp.Delete,
    exp.Drop,
    exp.Create,
    exp.Alter,
    exp.Describe,
    exp.Summarize,
    exp.Pivot,
    exp.Use,
    exp.Merge,
    exp.Into,
)


def _function_name(node: exp.Func) -> str:
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    return node.sql_name().lower()


def check(sql: str, tables: Iterable[str], max_chars: int = 8000) -> GateResult:
    """Decide whether `sql` may run against a database holding `tables`."""
    return _check(sql, frozenset(t.lower() for t in tables), max_chars)


@lru_cache(maxsize=4096)
def _check(sql: str, tables: frozenset[str], max_chars: int) -> GateResult:
    if len(sql) > max_chars:
        return GateResult(Verdict.REFUSED, f"query longer than {max_chars} characters")
    try:
        statements = [s for s in sqlglot.parse(sql, read="duckdb") if s is not None]
    except SqlglotError as error:
        return GateResult(Verdict.SYNTAX, str(error).splitlines()[0][:300])
    except RecursionError:
        return GateResult(Verdict.REFUSED, "query nested too deeply")
    if len(statements) != 1:
        return GateResult(Verdict.REFUSED, f"expected one statement, found {len(statements)}")
    root = statements[0]
    while isinstance(root, exp.Subquery | exp.Paren):
        root = root.this
    if not isinstance(root, _QUERY_ROOTS):
        return GateResult(Verdict.REFUSED, f"only queries may run, not {type(root).__name__}")
    allowed = set(tables)
    ctes = {cte.alias_or_name.lower() for cte in root.find_all(exp.CTE)}
    for node in root.walk():
        if isinstance(node, _DENIED_NODES):
            return GateResult(Verdict.REFUSED, f"{type(node).__name__} is not allowed")
        if isinstance(node, exp.Table):
            verdict = _check_table(node, allowed | ctes)
            if verdict.verdict is not Verdict.OK:
                return verdict
        elif isinstance(node, exp.Func) and (
            isinstance(node, _DENIED_CLASSES) or _function_name(node) in _DENIED_NAMES
        ):
            return GateResult(Verdict.REFUSED, f"function {_function_name(node)} is not allowed")
    return GateResult(Verdict.OK)


def _check_table(node: exp.Table, allowed: set[str]) -> GateResult:
    if not isinstance(node.this, exp.Identifier):
        return GateResult(Verdict.REFUSED, "table functions are not allowed")
    if node.args.get("db") or node.args.get("catalog"):
        return GateResult(Verdict.REFUSED, f"qualified name {node.sql('duckdb')} is not allowed")
    name = str(node.name)
    if name.lower() in allowed:
        return GateResult(Verdict.OK)
    if _PLAIN_NAME.match(name):
        return GateResult(Verdict.UNKNOWN_TABLE, f"table {name} does not exist")
    return GateResult(Verdict.REFUSED, f"{name!r} is not a table of this database")
