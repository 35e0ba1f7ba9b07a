"""Worst-case time and memory of the sandbox on the hostile catalogue (`rewards.hostile`),
against benign queries scored by the same pool in the same run.

First the baseline: `--benign` ordinary predictions (the gold query and a near miss) through
the pool, their median and worst wall time and the worker's peak memory. Then every attack, one
at a time; per attack class it prints the slowest wall time seen by the caller, that time as a
ratio to the benign median and as a share of the kill deadline, the outcome, and the workers'
peak resident memory against the benign peak. The run fails if an attack scores above zero or
leaves a file behind.

    python -m bench.bench_sandbox [--timeout 2.0] [--benign 40]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from rewards import RewardPool, SandboxLimits, Task
from rewards.hostile import attacks

SETUP = (
    "CREATE TABLE shops (id INTEGER, name VARCHAR, area DOUBLE);"
    "INSERT INTO shops VALUES (1, 'Ava', 10.5), (2, 'Bo', 20.25), (3, 'Cy', 30.0), (4, 'Di', 5.7);"
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=2.0)
    parser.add_argument("--benign", type=int, default=40, help="benign predictions, baseline")
    args = parser.parse_args()
    limits = SandboxLimits(timeout_s=args.timeout)
    task = Task(setup_sql=SETUP, question="q", gold_sql="SELECT name FROM shops WHERE area > 10",
                extra_setups=(SETUP,))
    worst: dict[str, tuple[float, str]] = defaultdict(lambda: (0.0, ""))
    with tempfile.TemporaryDirectory() as scratch, RewardPool(workers=1, limits=limits) as pool:
        (Path(scratch) / "secret.csv").write_text("token\nsecret\n")
        benign_sql = [task.gold_sql, "SELECT name FROM shops WHERE area >= 10 ORDER BY name"]
        benign, benign_peak = [], 0.0
        for i in range(args.benign):
            started = time.perf_counter()
            result = pool.score(benign_sql[i % 2], task)
            benign.append(time.perf_counter() - started)
            benign_peak = max(benign_peak, result.meta.get("peak_rss_mb", 0.0))
        nonzero, peak = 0, 0.0
        for kind, name, sql in attacks(Path(scratch), "shops"):
            pool.ready()  # time the sandbox, not the start of a replacement worker
            started = time.perf_counter()
            result = pool.score(sql, task)
            elapsed = time.perf_counter() - started
            nonzero += result.total != 0.0
            peak = max(peak, result.meta.get("peak_rss_mb", 0.0))
            if elapsed >= worst[kind][0]:
                worst[kind] = (elapsed, f"{name}: {result.outcome}, {result.error or ''}"[:90])
        leftovers = sorted(p.name for p in Path(scratch).iterdir() if p.name != "secret.csv")
        stats = pool.stats()
    kill_after = 2 * limits.timeout_s + limits.kill_grace_s
    median = statistics.median(benign)
    print(f"command: python -m bench.bench_sandbox --timeout {args.timeout} --benign "
          f"{args.benign}; loadavg={' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"limits: timeout {limits.timeout_s}s per statement, kill after {kill_after}s, "
          f"RLIMIT_AS {limits.address_space_mb} MiB, "
          f"DuckDB memory_limit {limits.memory_limit_mb} MiB")
    print(f"baseline, {len(benign)} benign predictions: median {median * 1000:.1f} ms, worst "
          f"{max(benign) * 1000:.1f} ms, worker peak rss {benign_peak:.0f} MiB")
    print(f"{'attack class':20s} {'worst s':>8s} {'x benign':>9s} {'of deadline':>11s}")
    for kind, (elapsed, what) in sorted(worst.items(), key=lambda kv: -kv[1][0]):
        print(f"{kind:20s} {elapsed:8.2f} {elapsed / median:8.1f}x {elapsed / kill_after:10.0%}"
              f"  ({what})")
    print(f"attacks scoring above zero: {nonzero}; files written into scratch: {leftovers}")
    print(f"highest worker peak rss reported by a scored attack: {peak:.0f} MiB, "
          f"x{peak / max(benign_peak, 1e-9):.2f} the benign peak (killed workers report none; "
          f"their cap is RLIMIT_AS)")
    for worker in stats:
        print(f"final worker peak rss {worker.peak_rss_mb:.0f} MiB, restarts {worker.restarts}")
    if nonzero or leftovers:
        raise SystemExit("an attack scored above zero or left a file behind")


if __name__ == "__main__":
    main()
