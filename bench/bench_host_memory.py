"""Freed host memory kept for reuse (`server.engine.host_memory`) against glibc's defaults.

The policy is process-wide and must be set before the first large allocation, so each side
runs in its own fresh process, alternating (`kept`, `default`, `kept`, `default`, ...): one
process = the engine on the embedded Gemma 3 270M doing the RL step's work three times
(sampling 8 prompts x 8 samples x 64 tokens, then forward_backward on those rollouts). Printed
per side: the median seconds of the last two repetitions of each phase, the process's kernel
(system) CPU seconds, its minor page faults and its peak RSS, and the ratios default / kept.

    python -m bench.bench_host_memory              # 2 processes per side, ~6 min
    python -m bench.bench_host_memory --rounds 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def workload() -> None:
    """One process's measurements, printed as one JSON line."""
    import resource
    import time

    from autoresearch.evaluation.evaluate import prompt_tokens
    from bench.bench_rl_step import rollout_data, sample_jobs
    from server.engine import host_memory
    from server.engine.engine import Engine, ForwardBackwardJob
    from server.engine.lora import LoraSpec
    from server.engine.model_loading import load_base_model
    from sqltasks import load_corpus

    engine = Engine(load_base_model(None, "cpu", None))
    prompts = [prompt_tokens(engine.tokenizer, t, "base") for t in load_corpus("train")[:8]]
    state = engine.create_run(LoraSpec(rank=16), seed=0)
    sample_s, train_s = [], []
    for _ in range(3):
        started = time.perf_counter()
        results = engine.sample(sample_jobs(state.adapter.frozen_copy(), prompts, 8, 64, 1))
        sample_s.append(time.perf_counter() - started)
        data = rollout_data(prompts, results, seed=0)
        started = time.perf_counter()
        engine.forward_backward([ForwardBackwardJob(state, data, "importance_sampling", {},
                                                    False)])
        train_s.append(time.perf_counter() - started)
        state.optimizer.zero_grad(set_to_none=True)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({
        "kept": host_memory.keep_freed_memory(),
        "sample_s": statistics.median(sample_s[1:]),
        "train_s": statistics.median(train_s[1:]),
        "sys_s": usage.ru_stime,
        "minor_faults": usage.ru_minflt,
        "peak_rss_mib": usage.ru_maxrss / 1024,
    }))


def run_side(kept: bool) -> dict:
    env = dict(os.environ, AUTORESEARCH_KEEP_FREED_MEMORY="1" if kept else "0")
    out = subprocess.run([sys.executable, __file__, "--workload"], cwd=ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workload", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.workload:
        workload()
        return
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}; "
          f"{args.rounds} process(es) per side, alternating")
    sides: dict[bool, list[dict]] = {True: [], False: []}
    for _ in range(args.rounds):
        for kept in (True, False):
            result = run_side(kept)
            assert result["kept"] == kept, result
            sides[kept].append(result)
            print(f"  {'kept' if kept else 'default':8s} {result}", flush=True)
    keys = ("sample_s", "train_s", "sys_s", "minor_faults", "peak_rss_mib")
    print("\n| measure | kept | glibc default | default / kept |\n|---|---|---|---|")
    for key in keys:
        kept = statistics.median(r[key] for r in sides[True])
        default = statistics.median(r[key] for r in sides[False])
        print(f"| {key} | {kept:,.2f} | {default:,.2f} | {default / kept:.2f}x |")
    print(f"\nload average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
