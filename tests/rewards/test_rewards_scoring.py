"""Scoring through the worker pool: components, verdicts, copies of the database, batching."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import rewards
from rewards import (
    RewardConfig,
    RewardPool,
    RewardWeights,
    SandboxLimits,
    ScoringCodeChanged,
    Task,
    codeversion,
)

SETUP_A = """
CREATE TABLE shops (id INTEGER, name VARCHAR, region VARCHAR, area DECIMAL(10,2));
INSERT INTO shops VALUES (1, 'Ava', 'north', 10.50), (2, 'Bo', 'south', 20.25),
  (3, 'Cy', 'north', 30.00), (4, 'Di', 'east', 5.75);
"""
SETUP_B = """
CREATE TABLE shops (id INTEGER, name VARCHAR, region VARCHAR, area DECIMAL(10,2));
INSERT INTO shops VALUES (1, 'Ed', 'north', 99.00), (2, 'Fi', 'north', 1.00),
  (3, 'Gu', 'west', 12.00);
"""
GOLD = "SELECT name FROM shops WHERE region = 'north' AND area > 5"


@pytest.fixture(scope="module")
def pool():
    with RewardPool(workers=2, limits=SandboxLimits(timeout_s=1.0)) as pool:
        yield pool


@pytest.fixture(scope="module")
def task():
    return Task(setup_sql=SETUP_A, question="Northern shops over 5?", gold_sql=GOLD,
                extra_setups=(SETUP_B,))


def test_a_task_is_built_from_three_strings():
    plain = Task(setup_sql=SETUP_A, question="q", gold_sql="SELECT 1")
    assert plain.setups == (SETUP_A,)
    assert plain.id.startswith("task-")


def test_the_gold_itself_is_correct_with_every_component_full(pool, task):
    result = pool.score(f"```sql\n{GOLD}\n```", task)
    assert result.correct and result.outcome == "ok"
    assert result.total == pytest.approx(1.1)
    assert result.instances == result.matched == 2
    # Schema linking is computed only when weighted; weighted, it is full too.
    weighted = pool.score(f"```sql\n{GOLD}\n```", task,
                          RewardConfig(weights=RewardWeights(schema_linking=1.0)))
    assert weighted.components.as_dict() == dict.fromkeys(result.components.as_dict(), 1.0)
    assert {k: v for k, v in result.components.as_dict().items() if k != "schema_linking"} == \
        {k: v for k, v in weighted.components.as_dict().items() if k != "schema_linking"}


def test_a_lucky_match_on_one_copy_is_not_correct(pool, task):
    lucky = "SELECT name FROM shops WHERE id IN (1, 3)"
    result = pool.score(lucky, task)
    assert result.matched == 1 and not result.correct
    assert result.total == pytest.approx(0.1)
    only_first = RewardConfig.model_validate({"match": {"all_instances": False}})
    assert pool.score(lucky, task, only_first).correct


def test_wrong_but_running_sql_earns_partial_credit_only_when_weighted(pool, task):
    wrong = "SELECT name FROM shops WHERE region = 'north'"  # right on copy A, not on B
    dense = RewardConfig(weights=RewardWeights(executes=0.1, result=1.0, rows=0.3, columns=0.2))
    plain, weighted = pool.score(wrong, task), pool.score(wrong, task, dense)
    assert not plain.correct and plain.total == pytest.approx(0.1)
    parts = weighted.components
    assert parts.columns == pytest.approx(0.5)
    assert parts.rows == pytest.approx((1.0 + 2 / 3) / 2)
    assert weighted.total == pytest.approx(0.1 + 0.3 * parts.rows + 0.2 * parts.columns)


def test_errors_are_reported_with_their_text(pool, task):
    result = pool.score("SELECT nme FROM shops", task)
    assert result.outcome == "error" and "nme" in result.error
    assert result.components.parses == 1.0 and result.components.executes == 0.0
    assert pool.score("SELECT FROM WHERE", task).outcome == "syntax"
    assert pool.score("SELECT * FROM stores", task).outcome == "unknown_table"
    assert pool.score("no idea", task).outcome == "no_sql"


def test_column_order_and_float_tolerance_follow_the_config(pool):
    t = Task(setup_sql=SETUP_A, question="q", gold_sql="SELECT name, area FROM shops")
    assert pool.score("SELECT area, name FROM shops", t).correct
    strict = RewardConfig.model_validate({"match": {"column_mode": "strict"}})
    assert not pool.score("SELECT area, name FROM shops", t, strict).correct
    assert pool.score("SELECT name, area::DOUBLE + 1e-9 FROM shops", t).correct


def test_row_order_matters_only_when_the_gold_orders(pool):
    t = Task(setup_sql=SETUP_A, question="q", gold_sql="SELECT name FROM shops ORDER BY area DESC")
    assert pool.score("SELECT name FROM shops ORDER BY area DESC", t).correct
    assert not pool.score("SELECT name FROM shops ORDER BY area", t).correct
    unordered = Task(setup_sql=SETUP_A, question="q", gold_sql="SELECT name FROM shops")
    assert pool.score("SELECT name FROM shops ORDER BY area", unordered).correct


def test_a_broken_gold_is_reported_not_blamed_on_the_prediction(pool):
    t = Task(setup_sql=SETUP_A, question="q", gold_sql="SELECT missing FROM shops")
    result = pool.score("SELECT 1", t)
    assert result.outcome == "gold_error" and result.total == 0.0


def test_score_many_keeps_input_order_and_async_gives_the_same(pool, task):
    predictions = [GOLD, "SELECT 1", "SELECT name FROM shops", GOLD] * 5
    pairs = [(p, task) for p in predictions]
    results = pool.score_many(pairs)
    assert [r.correct for r in results] == [p == GOLD for p in predictions]
    again = asyncio.run(pool.ascore_many(pairs))
    assert [r.total for r in again] == [r.total for r in results]


def test_the_one_call_score_function_uses_the_sandbox(task):
    assert rewards.score(GOLD, task).correct
    assert rewards.score("DROP TABLE shops", task).total == 0.0


def _cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_killed_worker_is_replaced_and_its_prediction_scores_zero(task):
    # A 22-way cross join of three rows (3^22 rows) cannot finish within the timeout on any
    # machine; the worker is killed once it has provably spent CPU inside that query (an idle
    # worker spends none), so neither a fast nor a slow machine changes what is tested.
    with RewardPool(workers=1, limits=SandboxLimits(timeout_s=60.0)) as pool:
        slow = "SELECT count(*) FROM " + ", ".join(f"shops t{i}" for i in range(22))
        assert pool.score(GOLD, task).correct  # the worker is up and idle
        pid = pool.worker_pids()[0]
        idle = _cpu_seconds(pid)
        future = pool.submit(slow, task)
        deadline = time.monotonic() + 60
        while _cpu_seconds(pid) - idle < 0.5:
            assert not future.done(), future.result()
            assert time.monotonic() < deadline, "the worker never started on the query"
            time.sleep(0.02)
        os.kill(pid, signal.SIGKILL)
        result = future.result(timeout=30)
        assert result.outcome == "crashed" and result.total == 0.0
        assert pool.score(GOLD, task).correct
        assert pool.worker_pids()[0] != pid
        assert pool.stats()[0].restarts == 1


def test_a_worker_that_loads_changed_scoring_code_stops_its_jobs_with_a_clear_error(
    task, monkeypatch
):
    """An upgrade under a running pool: its replacement workers would run other code. Their
    jobs fail with an error that says so, instead of scoring zero as if the model had failed."""
    with RewardPool(workers=1) as pool:
        assert pool.score(GOLD, task).correct
        monkeypatch.setattr(codeversion, "LOADED", "other-code")  # as if the files had changed
        os.kill(pool.worker_pids()[0], signal.SIGKILL)
        future = pool.submit(GOLD, task)
        with pytest.raises(ScoringCodeChanged, match="changed after this process loaded it"):
            future.result(timeout=60)
        with pytest.raises(ScoringCodeChanged):  # and so on, until the process restarts
            pool.score(GOLD, task)
    with pytest.raises(RuntimeError, match="changed after this process loaded it"):
        RewardPool(workers=1)
    monkeypatch.undo()
    with RewardPool(workers=1) as pool:  # the same code again: scoring as before
        assert pool.score(GOLD, task).correct


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_close_stops_every_worker():
    pool = RewardPool(workers=2)
    pids = pool.worker_pids()
    assert all(_alive(pid) for pid in pids)
    pool.close()
    assert not any(_alive(pid) for pid in pids)
    with pytest.raises(RuntimeError):
        pool.submit("SELECT 1", Task(setup_sql=SETUP_A, question="q", gold_sql="SELECT 1"))


def test_workers_die_with_a_caller_that_is_killed():
    root = Path(__file__).resolve().parents[2]
    script = textwrap.dedent(
        f"""
        import sys, time
        sys.path.insert(0, {str(root)!r})
        from rewards import RewardPool
        pool = RewardPool(workers=2)
        print(*pool.worker_pids(), flush=True)
        time.sleep(60)
        """
    )
    caller = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    pids = [int(p) for p in caller.stdout.readline().split()]
    assert len(pids) == 2 and all(_alive(p) for p in pids)
    caller.kill()
    caller.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in pids)


def test_the_answer_is_read_on_the_prompts_database_alone_and_ignores_row_order(pool, task):
    first = pool.score("SELECT name FROM shops WHERE region = 'north' ORDER BY name", task)
    reordered = pool.score("SELECT name FROM shops WHERE region = 'north' ORDER BY name DESC",
                           task)
    other = pool.score("SELECT name FROM shops WHERE region = 'south'", task)
    assert first.answer is not None and first.answer == reordered.answer
    assert other.answer not in (None, first.answer)
    assert (first.answer_rows, other.answer_rows) == (2, 1)
    # Right on the prompt's copy (A) only: its answer there is the gold's, the verdict is not.
    lucky = pool.score("SELECT name FROM shops WHERE name IN ('Ava', 'Cy')", task)
    gold = pool.score(GOLD, task)
    assert not lucky.correct and lucky.answer == gold.answer
    failed = pool.score("SELECT nope FROM shops", task)
    assert failed.answer is None and failed.answer_rows == 0
