"""An engine on a thread of its own, as an embedded server runs it: the host-memory policy
applied on import (now) against applied when the model loads (before).

`server.engine.host_memory` keeps freed blocks in one malloc arena for reuse. glibc gives a
thread that allocates while no arena is free an arena of its own, and a thread arena maps and
unmaps every block over 64 MiB however the process is tuned. So the policy only holds for an
engine thread if it comes before other threads allocate: `server.entrypoints` now applies it on
import, where it used to come with the model's loading, after torch, transformers and their
threads had started.

Each way runs in a fresh interpreter (the policy is process-wide): load Gemma 3 270M, then one
SFT step of the transfer recipe (`bench_sft_step`) on a worker thread, after a warm-up step
there. Prints seconds, the kernel's share, page faults and the process's malloc arenas, and the
ratio against the old way; `--rounds` alternates the two to spread drift in the machine's load.

    python bench/bench_engine_thread.py              # 1 round, ~3 min on 2 cores
    python bench/bench_engine_thread.py --rounds 2
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
import json, resource, sys, threading
if sys.argv[1] == "on import":
    import server.entrypoints  # noqa: F401  (the policy, before anything else starts)
sys.path.insert(0, sys.argv[2])
from bench_sft_step import WAYS, run_way, sft_batches
from server.engine.engine import Engine
from server.engine.host_memory import allocator_arenas
from server.engine.lora import LoraSpec
from server.engine.model_loading import load_base_model

engine = Engine(load_base_model(None, "cpu", None))
state = engine.create_run(LoraSpec(rank=16), seed=0)
batches = sft_batches(engine, 2, 8, 2, 1600, 0)
result = {}

def work():
    run_way(engine, state, batches[0][:2], WAYS[1])  # probes and first-touch allocations
    before = resource.getrusage(resource.RUSAGE_SELF)
    seconds, _, _ = run_way(engine, state, batches[1], WAYS[1])
    after = resource.getrusage(resource.RUSAGE_SELF)
    result.update(seconds=seconds, faults=after.ru_minflt - before.ru_minflt)

start = resource.getrusage(resource.RUSAGE_SELF)
thread = threading.Thread(target=work)
thread.start()
thread.join()
end = resource.getrusage(resource.RUSAGE_SELF)
result["arenas"] = allocator_arenas()
result["kernel_share"] = (end.ru_stime - start.ru_stime) / max(
    1e-9, end.ru_utime - start.ru_utime + end.ru_stime - start.ru_stime)
print(json.dumps(result))
"""
WAYS = ("on model load (before)", "on import (now)")


def run(way: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "datasets")])}
    mode = "on import" if way == WAYS[1] else "on load"
    done = subprocess.run([sys.executable, "-c", CHILD, mode, str(ROOT / "bench")], env=env,
                          capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {way: [] for way in WAYS}
    for r in range(args.rounds):
        for way in WAYS:
            results[way].append(run(way))
            print(f"  round {r} {way:24s} {results[way][-1]}", flush=True)
    base = statistics.median(x["seconds"] for x in results[WAYS[0]])
    print("\n| policy applied | SFT step on a worker thread, s | kernel share | minor faults "
          "| malloc arenas | vs before |")
    print("| --- | --- | --- | --- | --- | --- |")
    for way in WAYS:
        rows = results[way]
        s = statistics.median(x["seconds"] for x in rows)
        print(f"| {way} | {s:.1f} | {statistics.median(x['kernel_share'] for x in rows):.0%} | "
              f"{statistics.median(x['faults'] for x in rows):,.0f} | "
              f"{max(x['arenas'] for x in rows)} | {base / s:.2f}x |")
    print(f"\nload average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
