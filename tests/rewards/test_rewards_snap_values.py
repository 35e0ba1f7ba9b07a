"""Snapping a query's strings onto the data: a value the column lacks becomes its one twin up to
case and spacing, everything else is left as written, and the repair runs only when asked."""

from __future__ import annotations

from functools import partial

import pytest

from rewards import RewardConfig, RewardPool, Task
from rewards.sandbox import Sandbox
from rewards.score import Scorer
from rewards.snap_values import fold, snap_values

SCHEMA = {
    "tickets": frozenset({"ticketid", "subject", "status", "priority", "customerid"}),
    "customers": frozenset({"customerid", "fullname", "status"}),
}
VALUES = {
    ("tickets", "status"): ("open", "pending", "solved", "closed"),
    ("tickets", "priority"): ("low", "high", "urgent", "in_progress"),
    ("tickets", "subject"): ("Refund", "refund", "Login fails"),
    ("customers", "fullname"): ("Sana Qureshi", "Diego Ferreira"),
    ("customers", "status"): ("Active", "Churned"),
}


def lookup(table: str, column: str) -> tuple[str, ...] | None:
    return VALUES.get((table, column))


def test_fold_drops_case_spaces_hyphens_and_underscores_only():
    assert fold("In Progress") == fold("in_progress") == fold("IN-PROGRESS") == "inprogress"
    assert fold("José") == "josé"  # letters beyond ASCII stay
    assert fold("closed") != fold("solved")


@pytest.mark.parametrize("written, snapped", [
    ("SELECT TicketId FROM Tickets WHERE Priority = 'Urgent'",
     "SELECT TicketId FROM Tickets WHERE Priority = 'urgent'"),
    ("SELECT TicketId FROM Tickets WHERE 'OPEN' = Status",
     "SELECT TicketId FROM Tickets WHERE 'open' = Status"),
    ("SELECT TicketId FROM Tickets WHERE Status <> 'Closed'",
     "SELECT TicketId FROM Tickets WHERE Status <> 'closed'"),
    ("SELECT TicketId FROM Tickets WHERE Status IN ('Solved', 'closed', 'Pending')",
     "SELECT TicketId FROM Tickets WHERE Status IN ('solved', 'closed', 'pending')"),
    ("SELECT TicketId FROM Tickets WHERE Priority = 'In Progress'",
     "SELECT TicketId FROM Tickets WHERE Priority = 'in_progress'"),
    # Qualified through an alias, and an unqualified column only one table read has.
    ("SELECT t.TicketId FROM Tickets t JOIN Customers c ON t.CustomerId = c.CustomerId "
     "WHERE c.Status = 'active' AND FullName = 'sana qureshi'",
     "SELECT t.TicketId FROM Tickets AS t JOIN Customers AS c ON t.CustomerId = c.CustomerId "
     "WHERE c.Status = 'Active' AND FullName = 'Sana Qureshi'"),
    # Inside a subquery as well.
    ("SELECT FullName FROM Customers WHERE CustomerId IN "
     "(SELECT CustomerId FROM Tickets WHERE Priority = 'HIGH')",
     "SELECT FullName FROM Customers WHERE CustomerId IN "
     "(SELECT CustomerId FROM Tickets WHERE Priority = 'high')"),
])
def test_strings_the_column_lacks_become_their_twin_in_the_data(written, snapped):
    assert snap_values(written, SCHEMA, lookup) == snapped
    assert snap_values(snapped, SCHEMA, lookup) is None  # a repaired query stays as it is


@pytest.mark.parametrize("sql", [
    "SELECT TicketId FROM Tickets WHERE Status = 'open'",  # the value exists
    "SELECT TicketId FROM Tickets WHERE Status = 'reopened'",  # no twin: an honest miss
    "SELECT TicketId FROM Tickets WHERE Subject = 'REFUND'",  # two twins: cannot tell
    "SELECT t.TicketId FROM Tickets t JOIN Customers c ON t.CustomerId = c.CustomerId "
    "WHERE Status = 'OPEN'",  # two tables read have a Status column
    "SELECT TicketId FROM Tickets WHERE CustomerId = '7'",  # no strings in that column
    "SELECT TicketId FROM Tickets WHERE Subject LIKE '%refund%'",  # only =, <> and IN
    "SELECT TicketId FROM Tickets WHERE Mood = 'Open'",  # not a column of the schema
    "WITH x AS (SELECT Status AS s FROM Tickets) SELECT * FROM x WHERE s = 'OPEN'",
    "SELECT FROM WHERE",
])
def test_everything_else_is_left_as_written(sql):
    assert snap_values(sql, SCHEMA, lookup) is None


SETUP = """CREATE TABLE Tickets (TicketId INTEGER PRIMARY KEY, Priority VARCHAR, Opened DATE);
INSERT INTO Tickets VALUES (1, 'urgent', DATE '2024-01-02'), (2, 'low', DATE '2024-02-03'),
  (3, 'urgent', DATE '2024-03-04');"""
GOLD = "SELECT TicketId FROM Tickets WHERE Priority = 'urgent'"


def test_scoring_snaps_values_only_when_asked_and_keeps_what_the_model_wrote():
    task = Task(setup_sql=SETUP, question="Which tickets are urgent?", gold_sql=GOLD)
    written = "SELECT TicketId FROM Ticket WHERE Priority = 'Urgent'"
    with RewardPool(workers=1) as pool:
        plain = pool.score(written, task, RewardConfig(extract=False, snap_values=True))
        both = pool.score(written, task, RewardConfig(extract=False, snap_names=True,
                                                      snap_values=True))
        unasked = pool.score("SELECT TicketId FROM Tickets WHERE Priority = 'Urgent'", task,
                             RewardConfig(extract=False))
        dates = pool.score("SELECT TicketId FROM Tickets WHERE Opened = '2024-01-02'", task,
                           RewardConfig(extract=False, snap_values=True))
    assert plain.outcome == "unknown_table" and plain.snapped_from is None  # names left alone
    assert both.correct and both.snapped_from == written
    assert both.sql == "SELECT TicketId FROM tickets WHERE Priority = 'urgent'"
    assert unasked.outcome == "ok" and not unasked.correct and unasked.snapped_from is None
    assert dates.snapped_from is None  # a DATE column holds no strings to snap onto


def test_no_gold_query_of_the_transfer_split_or_the_corpus_dev_split_is_touched():
    """A repair that rewrote right queries would cost what it claims to win."""
    from sqltasks import load_corpus

    tasks = [*load_corpus("transfer"), *load_corpus("dev", corpus="multitable")]
    scorer = Scorer(Sandbox())  # the lookups scoring makes, in this process
    for task in tasks:
        database = scorer.sandbox.load(task.setup_sql)
        values = partial(scorer.text_values, database)
        assert snap_values(task.gold_sql, database.columns, values) is None, task.gold_sql
    assert len(tasks) > 400
