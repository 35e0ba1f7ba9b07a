"""Snapping a query's names onto the schema: guessed tables and columns become the closest real
ones, names the query defines itself are left alone, and the repair runs only when asked."""

from __future__ import annotations

import duckdb
import pytest

from rewards import RewardConfig, RewardPool, Task
from rewards.sandbox import Sandbox
from rewards.snap import closeness, closest, snap_to_schema

SCHEMA = {
    "customers": frozenset({"customerid", "fullname", "email", "isvip", "organizationid"}),
    "tickets": frozenset({"ticketid", "subject", "status", "openedat", "customerid"}),
    "vehicle": frozenset({"veh_id", "reg_no", "order"}),
}


def test_closeness_ignores_case_underscores_and_plurals_and_rewards_containment():
    assert closeness("Full_Name", "fullname") == 1.0
    assert closeness("Customer", "customers") == 0.95
    assert closeness("Name", "fullname") == pytest.approx(0.85)
    assert closeness("VIPs", "isvip") > 0.8
    assert closeness("price", "fullname") < 0.6
    assert closest("Phone", SCHEMA["tickets"]) is None


@pytest.mark.parametrize(("written", "snapped"), [
    ("SELECT Name, Email FROM Customer WHERE VIPs",
     "SELECT fullname, Email FROM customers WHERE isvip"),
    ("SELECT Customer.Name FROM Customer", "SELECT customers.fullname FROM customers"),
    ("SELECT c.Name FROM Customers c JOIN Ticket t ON t.CustomerId = c.Id",
     "SELECT c.fullname FROM Customers AS c JOIN tickets AS t ON t.CustomerId = c.customerid"),
    ("SELECT v.id, v.ordr FROM vehicles v", 'SELECT v.veh_id, v."order" FROM vehicle AS v'),
    ("SELECT EXTRACT(YEAR FROM OpenedOn) FROM Tickets",
     "SELECT EXTRACT(YEAR FROM openedat) FROM Tickets"),
    # A qualifier the query cannot use: the table's name after it took an alias, or a stray one.
    ("SELECT Tickets.Subject FROM Tickets t", "SELECT t.Subject FROM Tickets AS t"),
    ("SELECT x.Subject FROM Tickets t", "SELECT t.Subject FROM Tickets AS t"),
    # The right name on the wrong table of a join moves to the table that has it.
    ("SELECT t.FullName FROM Tickets t JOIN Customers c ON t.CustomerId = c.CustomerId",
     "SELECT c.FullName FROM Tickets AS t JOIN Customers AS c ON t.CustomerId = c.CustomerId"),
])
def test_guessed_names_become_the_closest_real_ones(written, snapped):
    assert snap_to_schema(written, SCHEMA) == snapped


@pytest.mark.parametrize("sql", [
    "SELECT FullName FROM Customers WHERE IsVip",  # already right: left as written
    "WITH recent AS (SELECT Subject AS s FROM Tickets) SELECT s FROM recent",
    "SELECT n FROM (SELECT COUNT(*) AS n FROM Tickets) AS counted",
    "SELECT Status, COUNT(*) AS total FROM Tickets GROUP BY Status ORDER BY total",
    "SELECT TicketId FROM Tickets WHERE Phone = 'phone'",  # nothing close enough
    "SELECT * FROM Tickets",
    "SELECT FROM WHERE (",  # does not parse
    "SELECT " + "(" * 3000 + "1" + ")" * 3000,  # nesting too deep for the parser
])
def test_names_that_exist_or_that_the_query_defines_are_left_alone(sql):
    assert snap_to_schema(sql, SCHEMA) is None


def test_snapped_queries_run_on_the_database_they_were_snapped_to():
    connection = duckdb.connect()
    connection.execute("CREATE TABLE Customers (CustomerId INTEGER, FullName VARCHAR, "
                       "Email VARCHAR, IsVip BOOLEAN, OrganizationId INTEGER)")
    connection.execute("INSERT INTO Customers VALUES (1, 'Ana', 'a@x', TRUE, 1), "
                       "(2, 'Bo', 'b@x', FALSE, 1)")
    snapped = snap_to_schema("SELECT Name FROM Customer WHERE VIP", SCHEMA)
    assert connection.execute(snapped).fetchall() == [("Ana",)]


SETUP = """CREATE TABLE Customers (CustomerId INTEGER PRIMARY KEY, FullName VARCHAR, IsVip BOOLEAN);
INSERT INTO Customers VALUES (1, 'Ana', TRUE), (2, 'Bo', FALSE), (3, 'Cy', TRUE);"""
GOLD = "SELECT FullName FROM Customers WHERE IsVip"


def test_scoring_snaps_only_when_asked_and_keeps_what_the_model_wrote():
    task = Task(setup_sql=SETUP, question="Which customers are VIPs?", gold_sql=GOLD)
    written = "SELECT Name FROM Customer WHERE VIPs"
    with RewardPool(workers=1) as pool:
        plain = pool.score(written, task, RewardConfig(extract=False))
        snapped = pool.score(written, task, RewardConfig(extract=False, snap_names=True))
        right = pool.score(GOLD, task, RewardConfig(extract=False, snap_names=True))
    assert not plain.correct and plain.outcome != "ok" and plain.snapped_from is None
    assert snapped.correct and snapped.snapped_from == written
    assert snapped.sql == "SELECT fullname FROM customers WHERE isvip"
    assert right.correct and right.snapped_from is None and right.sql == GOLD


def test_no_gold_query_of_the_transfer_split_or_the_corpus_dev_split_is_touched():
    """A repair that rewrote right queries would cost what it claims to win."""
    from sqltasks import load_corpus

    tasks = [*load_corpus("transfer"), *load_corpus("dev", corpus="multitable")]
    sandbox = Sandbox()  # the schema scoring snaps onto: `Database.columns`
    for task in tasks:
        schema = sandbox.load(task.setup_sql).columns
        assert snap_to_schema(task.gold_sql, schema) is None, task.gold_sql
    assert len(tasks) > 400
