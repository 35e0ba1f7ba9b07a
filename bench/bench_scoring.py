"""Scoring throughput: the worker pool against a naive per-prediction database, in one run.

The naive baseline is what a reward function written in a hurry does: for every prediction and
every database copy, open a fresh in-memory DuckDB, run the setup script, the gold and the
prediction, and compare. The pool keeps databases and gold results cached in long-lived workers
and scores in parallel. Both use the same comparator and the same predictions (gold queries,
near misses and junk, as an RL batch would hold). Prints predictions/s, the ratio and the
memory of each worker.

    python bench/bench_scoring.py [--tasks 64] [--naive 60] [--workers N]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

import duckdb

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "datasets")]

from rewards import RewardPool, Task, execution_match, extract_sql  # noqa: E402
from rewards.sqlinfo import has_top_level_order_by  # noqa: E402
from sqltasks import load_corpus  # noqa: E402


def predictions(tasks: list[Task], per_task: int, seed: int = 0) -> list[tuple[str, Task]]:
    """A GRPO-like batch: several samples per task, mixing right, nearly right and junk."""
    rng = random.Random(seed)
    pairs = []
    for task in tasks:
        options = [task.gold_sql, *task.meta["near_misses"], "SELECT 1", "SELECT * FROM nowhere"]
        pairs += [(f"```sql\n{rng.choice(options)}\n```", task) for _ in range(per_task)]
    rng.shuffle(pairs)
    return pairs


def naive_score(prediction: str, task: Task) -> bool:
    sql = extract_sql(prediction)
    if sql is None:
        return False
    ordered = has_top_level_order_by(task.gold_sql)
    for setup in task.setups:
        connection = duckdb.connect(":memory:")
        try:
            connection.execute(setup)
            gold = connection.execute(task.gold_sql).fetchall()
            try:
                rows = connection.execute(sql).fetchmany(1001)
            except duckdb.Error:
                return False
            if not execution_match(rows, gold, ordered=ordered, column_mode="perm"):
                return False
        finally:
            connection.close()
    return True


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--per-task", type=int, default=8)
    parser.add_argument("--naive", type=int, default=60, help="predictions for the baseline")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    tasks = random.Random(1).sample(load_corpus("train"), args.tasks)
    pairs = predictions(tasks, args.per_task)
    print(f"{len(pairs)} predictions over {len(tasks)} tasks, "
          f"{len(tasks[0].setups)} database copies each, {args.workers} workers")

    started = time.perf_counter()
    naive = [naive_score(p, t) for p, t in pairs[: args.naive]]
    naive_rate = len(naive) / (time.perf_counter() - started)

    with RewardPool(workers=args.workers) as pool:
        started = time.perf_counter()
        cold = pool.score_many(pairs)
        cold_rate = len(pairs) / (time.perf_counter() - started)
        started = time.perf_counter()
        warm = pool.score_many(pairs)
        warm_rate = len(pairs) / (time.perf_counter() - started)
        stats = pool.stats()

    agree = sum(r.correct == n for r, n in zip(cold, naive, strict=False))
    assert [r.correct for r in cold] == [r.correct for r in warm]
    print(f"naive baseline    : {naive_rate:8.1f} predictions/s  ({len(naive)} predictions)")
    for label, rate in (("pool, cold caches", cold_rate), ("pool, warm caches", warm_rate)):
        print(f"{label} : {rate:8.1f} predictions/s  ratio {rate / naive_rate:5.1f}x")
    print(f"verdicts agree with the baseline on {agree}/{len(naive)}; "
          f"{sum(r.correct for r in cold)}/{len(cold)} correct")
    for worker in stats:
        print(f"worker {worker.pid}: rss {worker.rss_mb:.0f} MiB, "
              f"peak {worker.peak_rss_mb:.0f} MiB, scored {worker.scored}, "
              f"restarts {worker.restarts}")


if __name__ == "__main__":
    main()
