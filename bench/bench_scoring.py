"""Scoring throughput, one variable at a time: the scorer, the database cache, warm caches,
and parallel workers, each against the row before it, in one run.

The naive baseline is what a reward function written in a hurry does: for every prediction and
every database copy, open a fresh in-memory DuckDB in this process, run the setup script, the
gold and the prediction, and compare. Then the same predictions go through one sandboxed worker
that keeps no database between tasks (`cached_databases=1`; it does keep one long-lived DuckDB
and the gold results, as every worker does), one that caches databases too (cold, then warm
on a second pass), and `--workers` of them warm (parallelism). Every row scores the same
predictions (gold queries, near misses and junk, as an RL batch would hold) with the same
comparator; the run fails if any row's verdicts differ from the naive scorer's. Prints
predictions/s, each ratio, and the memory of each worker.

    python -m bench.bench_scoring [--tasks 32] [--per-task 8] [--workers N]
"""

from __future__ import annotations

import argparse
import os
import random
import time

import duckdb

from rewards import RewardPool, SandboxLimits, Task, execution_match, extract_sql
from rewards.sqlinfo import has_top_level_order_by
from sqltasks import load_corpus


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


def timed_pool(pairs: list[tuple[str, Task]], workers: int, limits: SandboxLimits,
               passes: int) -> tuple[list[float], list[list[bool]], list]:
    """Predictions/s of each pass over `pairs` through one pool (caches carry over from one
    pass to the next), the verdicts of each pass, and the workers' stats at the end."""
    rates, verdicts = [], []
    with RewardPool(workers=workers, limits=limits) as pool:
        for _ in range(passes):
            started = time.perf_counter()
            results = pool.score_many(pairs)
            rates.append(len(pairs) / (time.perf_counter() - started))
            verdicts.append([r.correct for r in results])
        return rates, verdicts, pool.stats()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=32)
    parser.add_argument("--per-task", type=int, default=8)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()

    tasks = random.Random(1).sample(load_corpus("train"), args.tasks)
    pairs = predictions(tasks, args.per_task)
    print(f"command: python -m bench.bench_scoring --tasks {args.tasks} --per-task "
          f"{args.per_task} --workers {args.workers}")
    print(f"{len(pairs)} predictions over {len(tasks)} tasks, {len(tasks[0].setups)} database "
          f"copies each; every row scores the same predictions; cpus={os.cpu_count()} "
          f"loadavg={' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    started = time.perf_counter()
    naive = [naive_score(p, t) for p, t in pairs]
    naive_rate = len(pairs) / (time.perf_counter() - started)
    uncached = SandboxLimits(cached_databases=1)
    (sandbox_rate,), (sandboxed,), _ = timed_pool(pairs, 1, uncached, passes=1)
    (cold_rate, warm_rate), (cold, warm), _ = timed_pool(pairs, 1, SandboxLimits(), passes=2)
    (_, parallel_rate), (_, parallel), stats = timed_pool(pairs, args.workers, SandboxLimits(),
                                                          passes=2)

    rows = [
        ("naive: fresh database per prediction, this process", naive_rate, None),
        ("sandboxed worker, database rebuilt per task (1 worker)", sandbox_rate, naive_rate),
        ("sandboxed worker, database cache, cold (1 worker)", cold_rate, sandbox_rate),
        ("sandboxed worker, database cache, warm (1 worker)", warm_rate, cold_rate),
        (f"sandboxed workers, warm ({args.workers} workers)", parallel_rate, warm_rate),
    ]
    print(f"{'':56s} {'predictions/s':>13s} {'vs row above':>12s} {'vs naive':>9s}")
    for label, rate, previous in rows:
        step = f"{rate / previous:11.2f}x" if previous else f"{'':12s}"
        print(f"{label:56s} {rate:13.1f} {step} {rate / naive_rate:8.2f}x")
    print("each row changes one thing from the row above it: the scorer (a sandboxed worker "
          "process with one long-lived DuckDB and its gold results cached, rebuilding a task's "
          "databases whenever the task changes), the database cache, warm caches, then "
          "parallel workers")
    for worker in stats:
        print(f"worker {worker.pid}: rss {worker.rss_mb:.0f} MiB, "
              f"peak {worker.peak_rss_mb:.0f} MiB, scored {worker.scored}, "
              f"restarts {worker.restarts}")
    disagreements = {name: sum(a != b for a, b in zip(naive, verdicts, strict=True))
                     for name, verdicts in (("sandboxed", sandboxed), ("cold", cold),
                                            ("warm", warm), ("parallel", parallel))}
    print(f"{sum(naive)}/{len(naive)} correct; verdicts differing from the naive scorer: "
          f"{disagreements}")
    if any(disagreements.values()):
        raise SystemExit("the scorers disagree: the speed figures compare different work")


if __name__ == "__main__":
    main()
