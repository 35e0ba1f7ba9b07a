"""What each RL choice adds: arms of the demo's GRPO trial, each on the same seeds, against the
warm-up they fork from and against the earlier recipe, with runs as the unit.

Every arm forks from the demo's cached warm-up (`autoresearch/configs/demo_study.yaml`) and is
scored on its 48 fixed dev tasks. Arms (changes to the demo's base trial):

    shipped      the demo as shipped: dynamic sampling, signal-weighted prompts, the result's
                 reward alone
    old          the demo before them: one draw of uniform prompts
    partial      shipped with partial credit (overlap 0.3, executes 0.05, schema_linking 0.05)
    no-dynamic   shipped without dynamic sampling
    uniform      shipped with uniform prompts
    zscore       shipped with advantages divided by the group's standard deviation
    token-mean   shipped with the token-mean loss

For each arm: dev accuracy per seed; the mean minus the warm-up with a 95% t-interval over its
runs (each run's difference from the warm-up on the same tasks is one observation); the same
against `old`, paired by seed; and what its steps learned from (groups trained on of groups
drawn, steps that trained on nothing, samples drawn) and cost (trial seconds, summed).

    python -m bench.bench_rl_ablation --out runs/rl-ablation --arms shipped,old,partial --seeds 3
    python -m bench.bench_rl_ablation --out runs/rl-ablation-8 --arms shipped,old --steps 8

Resumable: rerun with the same `--out` (finished trials are read back).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TINKER_TELEMETRY", "0")

from autoresearch.evaluation.stats import paired_t
from autoresearch.rl.record import TrialRecord
from autoresearch.study.journal import Journal
from autoresearch.study.runner import run_study
from bench.bench_demo_rl import variants_study

ARMS: dict[str, dict[str, Any]] = {
    "shipped": {},
    "old": {"rl.dynamic_sampling": False, "rl.prompt_selection": "uniform"},
    "partial": {"reward.weights.overlap": 0.3, "reward.weights.executes": 0.05,
                "reward.weights.schema_linking": 0.05},
    "no-dynamic": {"rl.dynamic_sampling": False},
    "uniform": {"rl.prompt_selection": "uniform"},
    "zscore": {"rl.advantage": "zscore"},
    "token-mean": {"rl.loss_aggregation": "token_mean"},
}


def _interval(values: list[float]) -> str:
    est = paired_t(values)
    return f"{est.value:+.3f} [{est.low:+.3f}, {est.high:+.3f}]"


def accuracy(verdicts: dict[str, bool], tasks: list[str]) -> float:
    return sum(bool(verdicts[k]) for k in tasks) / len(tasks)


def summarise(directory: Path, arms: list[str], seeds: int) -> None:
    """The tables, from the study's journal and its trials' records."""
    trials = Journal(directory, read_only=True).trials()
    warmup = next(t for t in trials if t["role"] == "warmup")
    start = warmup["dev"]["verdicts"]
    tasks = sorted(start)
    base_acc = accuracy(start, tasks)
    by_arm: dict[str, dict[int, dict[str, Any]]] = {a: {} for a in arms}
    for t in trials:
        if t["role"] == "warmup" or not t.get("dev"):
            continue
        changes = dict(t["changes"] or {})
        seed = int(changes.pop("seed", 0))
        arm = next((a for a in arms if ARMS[a] == changes), None)
        if arm is not None:
            by_arm[arm][seed] = t
    print(f"\nwarm-up: dev {base_acc:.3f} on {len(tasks)} tasks")
    print("| arm | dev per seed | mean | vs warm-up (runs, 95% t) | vs old (paired by seed) "
          "| groups trained / drawn | empty steps | samples | trial s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for arm in arms:
        runs = by_arm[arm]
        if not runs:
            continue
        acc = {s: accuracy(t["dev"]["verdicts"], tasks) for s, t in sorted(runs.items())}
        old = by_arm.get("old", {})
        paired = [acc[s] - accuracy(old[s]["dev"]["verdicts"], tasks)
                  for s in acc if s in old] if arm != "old" else []
        used = drawn = empty = samples = 0
        seconds = 0.0
        for t in runs.values():
            for step in TrialRecord(directory / "trials" / t["id"]).of_type("step"):
                if step.get("phase") != "rl":
                    continue
                used += step["groups_used"]
                drawn += step.get("groups_drawn", step["groups_used"] + step["groups_dropped"])
                empty += step["groups_used"] == 0
                samples += step.get("samples_drawn", 0)
            seconds += t.get("wall_seconds") or 0.0
        print(f"| {arm} | {' '.join(f'{a:.3f}' for a in acc.values())} | "
              f"{sum(acc.values()) / len(acc):.3f} | "
              f"{_interval([a - base_acc for a in acc.values()])} | "
              f"{_interval(paired) if len(paired) > 1 else '-'} | {used} / {drawn} | {empty} | "
              f"{samples} | {seconds:.0f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--arms", default="shipped,old,partial,no-dynamic,uniform",
                        help=f"some of {', '.join(ARMS)}")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None, help="RL steps (default: the demo's)")
    parser.add_argument("--base", type=json.loads, default={},
                        help="JSON overrides of the demo's base trial, for every arm")
    parser.add_argument("--parallel", type=int, default=4)
    args = parser.parse_args()
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = set(arms) - set(ARMS)
    if unknown:
        raise SystemExit(f"unknown arms {sorted(unknown)}; expected some of {list(ARMS)}")
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("autoresearch.study.runner").setLevel(logging.INFO)
    print(f"command: python -m bench.bench_rl_ablation {' '.join(sys.argv[1:])}; loadavg "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    started = time.time()
    base = dict(args.base)
    if args.steps:
        base["rl.steps"] = args.steps
    # The demo's base trial (the `shipped` arm on seed 0) is the study's baseline; every other
    # arm-seed pair is one proposal.
    if "shipped" not in arms:
        raise SystemExit("the `shipped` arm is the study's baseline: include it")
    variants = [{**ARMS[arm], "seed": seed} for arm in arms for seed in range(args.seeds)
                if (arm, seed) != ("shipped", 0)]
    study, proposer = variants_study(base, variants, args.parallel)
    run_study(study, args.out, proposer=proposer)
    summarise(args.out, arms, args.seeds)
    print(f"\n{time.time() - started:.0f} s; loadavg "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
