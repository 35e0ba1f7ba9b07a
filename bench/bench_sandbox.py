"""Worst-case time and memory of the sandbox on the hostile catalogue (`rewards.hostile`).

Scores every attack through a pool, one at a time, and prints per attack class the slowest
wall time seen by the caller, the outcome, and the workers' peak resident memory.

    python bench/bench_sandbox.py [--timeout 2.0]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "datasets")]

from rewards import RewardPool, SandboxLimits, Task  # noqa: E402
from rewards.hostile import attacks  # noqa: E402

SETUP = (
    "CREATE TABLE shops (id INTEGER, name VARCHAR, area DOUBLE);"
    "INSERT INTO shops VALUES (1, 'Ava', 10.5), (2, 'Bo', 20.25), (3, 'Cy', 30.0), (4, 'Di', 5.7);"
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--timeout", type=float, default=2.0)
    args = parser.parse_args()
    limits = SandboxLimits(timeout_s=args.timeout)
    task = Task(setup_sql=SETUP, question="q", gold_sql="SELECT name FROM shops WHERE area > 10",
                extra_setups=(SETUP,))
    worst: dict[str, tuple[float, str]] = defaultdict(lambda: (0.0, ""))
    with tempfile.TemporaryDirectory() as scratch, RewardPool(workers=1, limits=limits) as pool:
        (Path(scratch) / "secret.csv").write_text("token\nsecret\n")
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
        leftovers = sorted(p.name for p in Path(scratch).iterdir())
        stats = pool.stats()
    kill_after = 2 * limits.timeout_s + limits.kill_grace_s
    print(f"limits: timeout {limits.timeout_s}s per statement, kill after {kill_after}s, "
          f"RLIMIT_AS {limits.address_space_mb} MiB, "
          f"DuckDB memory_limit {limits.memory_limit_mb} MiB")
    for kind, (elapsed, what) in sorted(worst.items(), key=lambda kv: -kv[1][0]):
        print(f"{kind:20s} worst {elapsed:6.2f}s  ({what})")
    print(f"attacks scoring above zero: {nonzero}; files left in scratch: {leftovers}")
    print(f"highest worker peak rss reported by a scored attack: {peak:.0f} MiB "
          f"(killed workers report none; their cap is RLIMIT_AS)")
    for worker in stats:
        print(f"final worker peak rss {worker.peak_rss_mb:.0f} MiB, restarts {worker.restarts}")


if __name__ == "__main__":
    main()
