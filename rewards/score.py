"""Turn one prediction for one task into a reward: components, total and verdict.

`Scorer` runs inside a worker process next to a `Sandbox`: it keeps gold results cached, runs
the prediction on every copy of the task's database, and combines what it saw with the weights
of a `RewardConfig`. Components all lie in [0, 1]; the total is their weighted sum, except that
a prediction the sandbox refuses or has to stop (unsafe statement, timeout, memory, huge
result, crashed worker) totals zero whatever the weights.
"""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field

from rewards import compare
from rewards.components import Components
from rewards.config import RewardConfig
from rewards.extract import extract
from rewards.sandbox import UNSAFE, Database, Outcome, QueryResult, Sandbox, SandboxBroken
from rewards.schema_linking import schema_credit
from rewards.snap import snap_to_schema
from rewards.snap_values import snap_values
from rewards.sqlinfo import has_top_level_order_by
from rewards.task import Task

NO_SQL = "no_sql"
GOLD_ERROR = "gold_error"
CRASHED = "crashed"
MAX_VALUES = 2000
"""A column with more distinct strings than this is not looked through by `snap_values`."""


@dataclass(frozen=True)
class ScoreResult:
    """The reward for one prediction and what it is made of."""

    total: float
    components: Components
    correct: bool
    outcome: str
    """`ok`, or why the prediction failed: syntax, unknown_table, refused, error, timeout,
    memory, too_large, no_sql, gold_error, crashed."""
    error: str | None = None
    sql: str | None = None
    task_id: str = ""
    instances: int = 0
    matched: int = 0
    elapsed_s: float = 0.0
    meta: dict[str, float] = field(default_factory=dict)
    """Measurements about the scoring itself, e.g. the worker's `peak_rss_mb`."""
    answer: str | None = None
    """What the prediction answered on the database the prompt shows (the first copy): a
    digest of its rows (`compare.answer_digest`), or None when it did not run there. Read
    without the gold, so choosing among a question's candidates by it is fair."""
    answer_rows: int = 0
    """How many rows that answer has."""
    snapped_from: str | None = None
    """With `RewardConfig.snap_names` or `snap_values`, the query as the model wrote it when
    `sql` is its repair (names snapped onto the schema, values onto the data); None when it ran
    as written."""

    @classmethod
    def zero(cls, outcome: str, error: str, task_id: str = "", sql: str | None = None):
        return cls(0.0, Components(), False, outcome, error, sql, task_id)


def length_credit(sql: str, gold_sql: str, budget: float) -> float:
    """1 up to `budget` times the gold's length, then linearly down to 0 at twice that."""
    ratio = len(_normalise(sql)) / max(1, len(_normalise(gold_sql)))
    if ratio <= budget:
        return 1.0
    return max(0.0, 1.0 - (ratio - budget) / budget)


def _normalise(sql: str) -> str:
    return re.sub(r"\s+", " ", sql).strip()


def _quoted(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


class GoldError(RuntimeError):
    """The task's own gold query fails: a broken task, not a bad prediction."""


class Scorer:
    """Scores predictions against tasks inside one sandbox, caching gold results."""

    def __init__(self, sandbox: Sandbox, cached_golds: int = 8192) -> None:
        self.sandbox = sandbox
        self._golds: OrderedDict[tuple[str, str], QueryResult] = OrderedDict()
        self._values: OrderedDict[tuple[str, str, str], tuple[str, ...] | None] = OrderedDict()
        self._capacity = cached_golds

    def prepare(self, task: Task, all_instances: bool) -> list[tuple[Database, QueryResult]]:
        """Load the task's databases and their gold results (trusted work, cached)."""
        setups = task.setups if all_instances else task.setups[:1]
        prepared: list[tuple[Database, QueryResult]] = []
        for setup in setups:
            database = self.sandbox.load(setup, frozenset(d.key for d, _ in prepared))
            key = (database.key, task.gold_sql)
            gold = self._golds.get(key)
            if gold is None:
                gold = self.sandbox.run(database, task.gold_sql)
                if gold.outcome is not Outcome.OK:
                    raise GoldError(f"gold query failed ({gold.outcome}): {gold.error}")
                self._golds[key] = gold
                while len(self._golds) > self._capacity:
                    self._golds.popitem(last=False)
            else:
                self._golds.move_to_end(key)
            prepared.append((database, gold))
        return prepared

    def text_values(self, database: Database, table: str, column: str) -> tuple[str, ...] | None:
        """The distinct strings `table.column` holds on `database` (trusted names from its own
        schema, cached), or None when it holds other types or more than `MAX_VALUES`."""
        key = (database.key, table, column)
        if key not in self._values:
            name, field_ = _quoted(table), _quoted(column)
            query = (f"SELECT DISTINCT {field_} FROM {name} WHERE {field_} IS NOT NULL "
                     f"LIMIT {MAX_VALUES + 1}")
            result = self.sandbox.run(database, query)
            held = [row[0] for row in result.rows] if result.outcome is Outcome.OK else []
            usable = 0 < len(held) <= MAX_VALUES and all(isinstance(v, str) for v in held)
            self._values[key] = tuple(held) if usable else None
            while len(self._values) > self._capacity:
                self._values.popitem(last=False)
        return self._values[key]

    def score(
        self,
        task: Task,
        prediction: str,
        config: RewardConfig,
        on_untrusted: Callable[[], None] | None = None,
    ) -> ScoreResult:
        """Score `prediction` (a completion, or SQL when `config.extract` is off)."""
        started = time.monotonic()
        if config.extract:
            found = extract(prediction)
            sql, well_formed = found.sql, found.well_formed
        else:
            sql = prediction.strip().rstrip(";").strip() or None
            well_formed = sql is not None
        if sql is None:
            return ScoreResult.zero(NO_SQL, "no SQL found in the completion", task.id)
        try:
            prepared = self.prepare(task, config.match.all_instances)
        except SandboxBroken:
            raise
        except Exception as error:  # a broken task (failing gold or setup) is not a crash
            return ScoreResult.zero(GOLD_ERROR, str(error)[:500], task.id, sql)
        if on_untrusted is not None:
            on_untrusted()
        written = sql
        if config.snap_names and prepared:
            sql = snap_to_schema(sql, prepared[0][0].columns) or sql
        if config.snap_values and prepared:
            database = prepared[0][0]
            sql = snap_values(sql, database.columns,
                              lambda t, c: self.text_values(database, t, c)) or sql
        snapped_from = written if sql != written else None
        budget_end = time.monotonic() + self.sandbox.limits.timeout_s
        ordered = config.match.respect_order and has_top_level_order_by(task.gold_sql)
        results: list[QueryResult] = []
        matched = 0
        failure: QueryResult | None = None
        for database, gold in prepared:
            if time.monotonic() > budget_end:  # no copy starts after the budget is spent
                failure = QueryResult(Outcome.TIMEOUT, error="time budget spent on earlier copies")
                break
            result = self.sandbox.run(database, sql)
            if result.outcome is not Outcome.OK:
                failure = result
                break
            results.append(result)
            if compare.execution_match(
                result.rows,
                gold.rows,
                ordered=ordered,
                column_mode=config.match.column_mode,
                rel_tol=config.match.rel_tol,
                abs_tol=config.match.abs_tol,
            ):
                matched += 1
        elapsed = time.monotonic() - started
        outcome = failure.outcome if failure else Outcome.OK
        if outcome in UNSAFE:
            return ScoreResult(
                0.0, Components(), False, str(outcome), failure.error, sql, task.id,
                len(prepared), 0, elapsed, snapped_from=snapped_from,
            )
        correct = failure is None and matched == len(prepared)
        executes = failure is None
        if correct:
            columns = rows = overlap = 1.0
        elif executes:
            pairs = [(r.rows, gold.rows) for r, (_, gold) in zip(results, prepared, strict=True)]
            columns = sum(compare.column_overlap(p, g) for p, g in pairs) / len(pairs)
            rows = sum(compare.row_overlap(p, g) for p, g in pairs) / len(pairs)
            overlap = sum(compare.result_overlap(p, g) for p, g in pairs) / len(pairs)
        else:
            columns = rows = overlap = 0.0
        components = Components(
            format=float(well_formed),
            parses=float(outcome is not Outcome.SYNTAX),
            executes=float(executes),
            result=float(correct),
            columns=columns,
            rows=rows,
            overlap=overlap,
            length=length_credit(sql, task.gold_sql, config.length_budget) if executes else 0.0,
            schema_linking=(schema_credit(sql, task.gold_sql, prepared[0][0].columns)
                    if config.weights.schema_linking > 0 and prepared else 0.0),
        )
        first = results[0] if results else None
        return ScoreResult(
            components.total(config.weights), components, correct, str(outcome),
            failure.error if failure else None, sql, task.id, len(prepared), matched, elapsed,
            answer=compare.answer_digest(first.rows) if first is not None else None,
            answer_rows=len(first.rows) if first is not None else 0,
            snapped_from=snapped_from,
        )
