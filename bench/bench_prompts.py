"""The transfer recipe's SFT prompts: sample rows read once per database against once per table.

A prompt of the multi-table corpus shows each table's CREATE statement and its first rows
(`sqltasks.prompt.schema_text`). Those rows used to be read from a database built afresh for
every table, cached by (database, table); now one build of a database gives every table's rows,
cached by database (`sqltasks.prompt.sample_rows`). This benchmark renders the prompts of the
first SFT steps of a trial (8 training tasks a step, the recipe's view: 2 sample rows, schema cut
at 1600 characters) both ways, each from cold caches, in one process, and prints seconds per step
and the ratio. The rendered prompts must be equal, or it says so and fails.

    python -m bench.bench_prompts              # 60 steps per way, about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from functools import lru_cache

from rewards import Task
from sqltasks import SchemaView, load_corpus, render_prompt
from sqltasks import prompt as prompts


def _clear_caches() -> None:
    for cached in (prompts.schema_lines, prompts._table_of, prompts._database_samples):
        cached.cache_clear()


def _per_table() -> Callable[[str, str, int], tuple[str, ...]]:
    """The earlier rule: a database built for each table, cached by (database, table, rows)."""
    return lru_cache(maxsize=512)(prompts.table_samples)


def render_steps(train: list[Task], steps: int, batch: int, view: SchemaView,
                 per_table: bool) -> tuple[list[float], list[str]]:
    """Seconds per step and the prompts, for `steps` batches drawn as a trial draws them."""
    _clear_caches()
    original = prompts.sample_rows
    if per_table:
        prompts.sample_rows = _per_table()
    try:
        seconds, texts = [], []
        for step in range(steps):
            tasks = random.Random(f"sft-{step}").sample(train, k=batch)
            started = time.perf_counter()
            texts += [render_prompt(task, "base", view=view) for task in tasks]
            seconds.append(time.perf_counter() - started)
        return seconds, texts
    finally:
        prompts.sample_rows = original


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--batch", type=int, default=8)
    args = parser.parse_args()
    train = load_corpus("train", 0, corpus="multitable")
    view = SchemaView(sample_rows=2, max_chars=1600)
    databases = len({t.setup_sql for t in train})
    print(f"{len(train)} training tasks on {databases} databases; {args.steps} steps of "
          f"{args.batch} prompts per way")
    results = {}
    for name, per_table in (("once per table (before)", True), ("once per database", False)):
        results[name] = render_steps(train, args.steps, args.batch, view, per_table)
    (base, base_texts), (new, new_texts) = results.values()
    print("| way | total s | s/step mean | s/step median | vs before |")
    print("|---|---|---|---|---|")
    for name, (seconds, _) in results.items():
        print(f"| {name} | {sum(seconds):.2f} | {statistics.mean(seconds):.3f} | "
              f"{statistics.median(seconds):.3f} | {sum(base) / sum(seconds):.2f}x |")
    same = base_texts == new_texts
    print(f"prompts equal both ways: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
