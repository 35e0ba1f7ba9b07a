"""Every attack class scores zero with a failure outcome and leaves no file behind.

An attack that would run forever ends because the pool kills its worker past the deadline
(outcome `timeout`); a hang is caught by the per-test timeout below. How long attacks take,
against the deadline, is measured in `bench/bench_sandbox.py`, not asserted here, so a loaded
machine cannot fail the test."""

import os
from pathlib import Path

import pytest

from rewards import RewardConfig, RewardPool, RewardWeights, SandboxLimits, Task
from rewards.hostile import attacks

SETUP = """
CREATE TABLE shops (id INTEGER, name VARCHAR, area DOUBLE);
INSERT INTO shops VALUES (1, 'Ava', 10.5), (2, 'Bo', 20.25), (3, 'Cy', 30.0), (4, 'Di', 5.75);
"""
GOLD = "SELECT name FROM shops WHERE area > 10"
LIMITS = SandboxLimits(timeout_s=1.0, kill_grace_s=1.0, address_space_mb=1536, max_rows=1000)
FAILURES = {"syntax", "unknown_table", "refused", "error", "timeout", "memory", "too_large",
            "no_sql", "crashed"}
pytestmark = pytest.mark.timeout(300)  # a hang guard only: the kill deadline is about 3 s
GENEROUS = RewardConfig(
    weights=RewardWeights(format=1, parses=1, executes=1, result=1, columns=1, rows=1, length=1)
)
SCRATCH = Path(os.environ.get("TMPDIR", "/tmp")) / f"sandbox-attacks-{os.getpid()}"
TASK = Task(setup_sql=SETUP, question="Shops over 10?", gold_sql=GOLD, extra_setups=(SETUP,))
ATTACKS = attacks(SCRATCH, "shops")


@pytest.fixture(scope="module")
def pool():
    SCRATCH.mkdir(parents=True, exist_ok=True)
    (SCRATCH / "secret.csv").write_text("token\nsecret-value\n")
    with RewardPool(workers=2, limits=LIMITS) as pool:
        yield pool
    for path in SCRATCH.iterdir():
        path.unlink()
    SCRATCH.rmdir()


@pytest.mark.parametrize(("kind", "name", "sql"), ATTACKS, ids=[f"{k}: {n}" for k, n, _ in ATTACKS])
def test_attack_scores_zero_without_files(pool, kind, name, sql):
    cwd_before = set(os.listdir("."))
    assert pool.ready(timeout=120)  # a worker replaced after the previous attack is up again
    result = pool.score(sql, TASK, GENEROUS)
    assert result.total == 0.0 and not result.correct, result
    assert result.outcome in FAILURES, result
    assert sorted(p.name for p in SCRATCH.iterdir()) == ["secret.csv"]
    assert set(os.listdir(".")) == cwd_before
    assert "secret-value" not in (result.error or "")


def test_attacks_in_one_batch_leave_the_data_intact_and_memory_capped(pool):
    results = pool.score_many([(sql, TASK) for _, _, sql in ATTACKS] + [(GOLD, TASK)])
    assert all(r.total == 0.0 for r in results[:-1])
    assert results[-1].correct
    for worker in pool.stats():
        assert worker.peak_rss_mb < LIMITS.address_space_mb
