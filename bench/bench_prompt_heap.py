"""SFT steps whose prompts are built beside the engine: sample rows read from a DuckDB database
opened per task database (before) against the process's one scratch database (now).

DuckDB trims the C heap (glibc `malloc_trim`) whenever a database instance starts or is
destroyed and when one of its worker threads idles after a query, which hands back the freed
memory the engine keeps warm between steps (`server.engine.host_memory`). A trial builds its
prompts in the process that hosts an embedded engine, and until its prompt cache holds every
training database (112 in the multi-table corpus, 8 tasks a step) most steps met a database not
seen before. `sqltasks.scratch` now builds every database in a schema of one single-threaded
database kept open.

One loaded model; each step, both ways in turn on the same 8 tasks (the transfer recipe's
prompts: CREATE TABLE statements, 2 sample rows a table, 1600 characters), each with its prompt
caches emptied so that it builds all 8 databases as an early step of a trial does: build the
prompts, then `forward_backward(cross_entropy)`. Prints per way the median seconds of building
and of the forward_backward, the minor page faults of the step and the ratio before / now, and
whether both ways built the same prompts.

    python -m bench.bench_prompt_heap              # 3 steps per way, ~7 min on 2 cores
    python -m bench.bench_prompt_heap --steps 1
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from collections.abc import Callable
from functools import lru_cache

import duckdb
import numpy as np

from bench.bench_sft_step import sft_datum
from server.engine.engine import Engine, ForwardBackwardJob
from server.engine.lora import LoraSpec
from server.engine.model_loading import load_base_model
from server.protocol.codec import Datum
from sqltasks import SchemaView, load_corpus, prompt

WAYS = ("a database opened per task database (before)", "one scratch database (now)")


def opened_per_database(setup_sql: str, k: int) -> dict[str, tuple[str, ...]]:
    """How `prompt._database_samples` read a database's rows before: in a database of its own,
    opened and closed for it."""
    tables = [prompt._table_of(line)[0] for line in prompt.schema_lines(setup_sql).splitlines()]
    with duckdb.connect(":memory:") as connection:
        connection.execute(setup_sql)
        return {t: prompt._first_rows(connection, t, k) for t in tables if t}


def build(engine: Engine, tasks: list, view: SchemaView,
          samples: Callable[[str, int], dict[str, tuple[str, ...]]]) -> list[Datum]:
    """The tasks' SFT datums (prompt positions weigh 0, the gold query's 1), with the sample
    rows read by `samples` into an empty cache."""
    saved = prompt._database_samples
    prompt._database_samples = lru_cache(maxsize=512)(samples)  # once per database, as cached
    try:
        return [sft_datum(engine, task, view) for task in tasks]
    finally:
        prompt._database_samples = saved


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    started = time.time()
    engine = Engine(load_base_model(None, "cpu", None))
    print(f"model {engine.model_name} on cpu/{engine.dtype}; load average "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    state = engine.create_run(LoraSpec(rank=16), seed=args.seed)
    view = SchemaView(sample_rows=2, max_chars=1600)
    train = load_corpus("train", 0, corpus="multitable")
    rng = np.random.default_rng(args.seed)
    steps = [[train[int(i)] for i in rng.choice(len(train), size=8, replace=False)]
             for _ in range(args.steps + 1)]
    samplers = {WAYS[0]: opened_per_database, WAYS[1]: prompt._database_samples.__wrapped__}
    seconds = {way: {"build": [], "train": [], "faults": []} for way in WAYS}
    same = True
    for index, tasks in enumerate(steps):  # step 0 warms the engine and is not counted
        built = {}
        for way in WAYS:
            first = faults()
            t0 = time.perf_counter()
            data = build(engine, tasks, view, samplers[way])
            t1 = time.perf_counter()
            engine.forward_backward([ForwardBackwardJob(state, data, "cross_entropy", {}, False)])
            t2 = time.perf_counter()
            state.optimizer.zero_grad(set_to_none=True)
            stepped = faults() - first
            built[way] = [d.tokens.tolist() for d in data]
            if index:
                seconds[way]["build"].append(t1 - t0)
                seconds[way]["train"].append(t2 - t1)
                seconds[way]["faults"].append(stepped)
            print(f"  step {index} {way:45s} build {t1 - t0:5.2f} s  forward_backward "
                  f"{t2 - t1:6.1f} s  minor faults {stepped:,}", flush=True)
        same &= built[WAYS[0]] == built[WAYS[1]]

    print(f"\n{args.steps} steps per way (after one uncounted), 8 tasks each, medians\n")
    print("| way | build s | forward_backward s | step s | minor faults | step vs now |")
    print("| --- | --- | --- | --- | --- | --- |")
    now = statistics.median(b + t for b, t in zip(seconds[WAYS[1]]["build"],
                                                  seconds[WAYS[1]]["train"], strict=True))
    for way in WAYS:
        s = seconds[way]
        step = statistics.median(b + t for b, t in zip(s["build"], s["train"], strict=True))
        print(f"| {way} | {statistics.median(s['build']):.2f} | "
              f"{statistics.median(s['train']):.1f} | {step:.1f} | "
              f"{statistics.median(s['faults']):,.0f} | {step / now:.2f}x |")
    print(f"\nboth ways built the same prompts: {'yes' if same else 'NO'}")
    print(f"wall {time.time() - started:.0f} s; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
