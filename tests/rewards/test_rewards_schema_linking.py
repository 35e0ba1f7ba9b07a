"""The schema-linking component: invented names score nothing, the gold's tables and joins
score, wrong joins score half; through the pool it is computed only when weighted."""

from __future__ import annotations

import pytest

from rewards import RewardConfig, RewardPool, RewardWeights, SandboxLimits, Task
from rewards.schema_linking import existence, references, schema_credit

SCHEMA = {"customers": frozenset({"id", "name", "city"}),
          "orders": frozenset({"id", "customer_id", "amount", "placed_on"})}
GOLD = ("SELECT c.name, SUM(o.amount) FROM customers c JOIN orders o ON o.customer_id = c.id "
        "GROUP BY c.name")
SETUP = """
CREATE TABLE customers (id INTEGER PRIMARY KEY, name VARCHAR, city VARCHAR);
CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id),
  amount DECIMAL(10, 2), placed_on DATE);
INSERT INTO customers VALUES (1, 'Ava', 'Oslo'), (2, 'Bo', 'Lima');
INSERT INTO orders VALUES (1, 1, 10.00, '2024-01-02'), (2, 1, 5.50, '2024-02-03'),
  (3, 2, 7.25, '2024-03-04');
"""


@pytest.mark.parametrize(("sql", "credit"), [
    (GOLD, 1.0),
    ("SELECT name, SUM(amount) AS total FROM customers JOIN orders "
     "ON orders.customer_id = customers.id GROUP BY name ORDER BY total", 1.0),
    ("SELECT sales_revenue FROM sales", 0.0),
    ("SELECT c.name FROM customers c JOIN orders o ON o.id = c.id", 0.5),
    ("SELEC nonsense FROM", 0.0),
])
def test_credit_follows_the_schema_and_the_golds_joins(sql: str, credit: float):
    assert schema_credit(sql, GOLD, SCHEMA) == pytest.approx(credit)


def test_names_the_query_defines_are_not_checked_against_the_schema():
    refs = references("WITH t AS (SELECT customer_id, amount AS spent FROM orders) "
                      "SELECT t.spent FROM t")
    assert refs.tables == {"orders"} and existence(refs, SCHEMA) == 1.0
    invented = references("SELECT c.track_id_id FROM customers c")
    assert existence(invented, SCHEMA) == 0.5  # the table is real, the column is not


def test_the_pool_computes_it_only_when_weighted_and_grades_a_failing_query():
    task = Task(setup_sql=SETUP, question="Total spent per customer?", gold_sql=GOLD)
    weighted = RewardConfig(weights=RewardWeights(schema_linking=1.0), extract=False)
    wrong_column = ("SELECT c.name, SUM(o.total) FROM customers c JOIN orders o "
                    "ON o.customer_id = c.id GROUP BY c.name")
    with RewardPool(workers=1, limits=SandboxLimits(timeout_s=2.0)) as pool:
        right = pool.score(GOLD, task, weighted)
        failing = pool.score(wrong_column, task, weighted)
        unweighted = pool.score(GOLD, task, RewardConfig(extract=False))
    assert right.correct and right.components.schema_linking == 1.0
    assert failing.outcome == "error" and 0.5 < failing.components.schema_linking < 1.0
    assert unweighted.components.schema_linking == 0.0 and unweighted.total == pytest.approx(1.1)
