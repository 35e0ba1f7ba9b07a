"""An engine on a thread of its own, as every server runs it: where its model is loaded, and
when the host-memory policy is applied.

Two things decide how fast an engine thread trains on the CPU:

- **OpenMP teams.** Every thread that runs a torch kernel in parallel keeps a libgomp team of
  its own; once the teams' threads outnumber the cores, libgomp's workers stop spinning between
  parallel regions and sleep on a futex after each one. A model loaded on the main thread and
  trained on an engine thread makes two teams. `server.engine.engine_thread` now loads the model
  on the thread whose loop then drives it.
- **Malloc arenas.** `server.engine.host_memory` keeps freed blocks in one arena for reuse; a
  thread that allocated before the policy came keeps an arena of its own, where every block over
  64 MiB is mapped and unmapped. `server.entrypoints` applies the policy on import.

Each way runs in a fresh interpreter (both effects are process-wide): load Gemma 3 270M, then
the transfer recipe's SFT step (`bench_sft_step`) on the engine thread, a warm-up step then two
timed ones. Prints the median seconds, the voluntary context switches per step, the kernel's
share, page faults and the malloc arenas, and the ratio against the way before this change;
`--rounds` alternates the ways to spread drift in the machine's load.

    python -m bench.bench_engine_thread              # 1 round, ~6 min on 2 cores
    python -m bench.bench_engine_thread --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, resource, statistics, sys, threading
way = sys.argv[1]
if way != "policy on load, model loaded on main":
    import server.entrypoints  # noqa: F401  (the policy, before anything else starts)
sys.path.insert(0, sys.argv[2])
from bench.bench_sft_step import WAYS, run_way, sft_batches
from server.engine.engine import Engine
from server.engine.engine_thread import EngineThread, on_own_thread
from server.engine.host_memory import allocator_arenas
from server.engine.lora import LoraSpec
from server.engine.model_loading import load_base_model

def build():
    return Engine(load_base_model(None, "cpu", None))

if way.endswith("on the engine thread"):
    engine = on_own_thread(build)
    thread = engine.thread
else:
    engine = build()
    thread = EngineThread()
batches = sft_batches(engine, 3, 8, 2, 1600, 0)
result = {"seconds": [], "switches": []}

def work():
    state = engine.create_run(LoraSpec(rank=16), seed=0)  # as the server does: on its thread
    run_way(engine, state, batches[0][:2], WAYS[1])  # probes and first-touch allocations
    before = resource.getrusage(resource.RUSAGE_SELF)
    for data in batches[1:]:
        steps_before = resource.getrusage(resource.RUSAGE_SELF)
        seconds, _, _ = run_way(engine, state, data, WAYS[1])
        steps_after = resource.getrusage(resource.RUSAGE_SELF)
        result["seconds"].append(seconds)
        result["switches"].append(steps_after.ru_nvcsw - steps_before.ru_nvcsw)
    after = resource.getrusage(resource.RUSAGE_SELF)
    result["faults"] = after.ru_minflt - before.ru_minflt
    result["kernel_share"] = (after.ru_stime - before.ru_stime) / max(
        1e-9, after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)

thread.call(work)
result["arenas"] = allocator_arenas()
result["seconds"] = statistics.median(result["seconds"])
result["switches"] = statistics.median(result["switches"])
print(json.dumps(result))
"""
WAYS = ("policy on load, model loaded on main", "policy on import, model loaded on main",
        "policy on import, model loaded on the engine thread")
BEFORE = WAYS[1]


def run(way: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "datasets")])}
    done = subprocess.run([sys.executable, "-c", CHILD, way, str(ROOT)], env=env,
                          capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    results: dict[str, list[dict]] = {way: [] for way in WAYS}
    for r in range(args.rounds):
        for way in WAYS if r % 2 == 0 else WAYS[::-1]:
            results[way].append(run(way))
            print(f"  round {r} {way:52s} {results[way][-1]}", flush=True)
    base = statistics.median(x["seconds"] for x in results[BEFORE])
    print("\n| way | SFT step on the engine thread, s | voluntary switches a step | "
          "kernel share | minor faults | malloc arenas | vs model loaded on main |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for way in WAYS:
        rows = results[way]
        s = statistics.median(x["seconds"] for x in rows)
        print(f"| {way} | {s:.1f} | {statistics.median(x['switches'] for x in rows):,.0f} | "
              f"{statistics.median(x['kernel_share'] for x in rows):.0%} | "
              f"{statistics.median(x['faults'] for x in rows):,.0f} | "
              f"{max(x['arenas'] for x in rows)} | {base / s:.2f}x |")
    print(f"\nload average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
