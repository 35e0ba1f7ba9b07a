"""Every attack class scores zero, within the time bound, and leaves no file behind."""

import os
import time
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
BOUND_S = 2 * LIMITS.timeout_s + LIMITS.kill_grace_s + 1.5  # the pool's kill deadline, plus IPC
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
def test_attack_scores_zero_in_bounded_time_without_files(pool, kind, name, sql):
    cwd_before = set(os.listdir("."))
    assert pool.ready(timeout=120)  # a worker replaced after the previous attack is up again
    started = time.monotonic()
    result = pool.score(sql, TASK, GENEROUS)
    elapsed = time.monotonic() - started
    assert result.total == 0.0 and not result.correct, result
    assert elapsed < BOUND_S
    assert sorted(p.name for p in SCRATCH.iterdir()) == ["secret.csv"]
    assert set(os.listdir(".")) == cwd_before
    assert "secret-value" not in (result.error or "")


def test_attacks_in_one_batch_leave_the_data_intact_and_memory_capped(pool):
    results = pool.score_many([(sql, TASK) for _, _, sql in ATTACKS] + [(GOLD, TASK)])
    assert all(r.total == 0.0 for r in results[:-1])
    assert results[-1].correct
    for worker in pool.stats():
        assert worker.peak_rss_mb < LIMITS.address_space_mb
