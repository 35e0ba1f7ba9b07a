"""The transfer recipe's first training steps, end to end, under each side, in fresh processes.

Engine benchmarks time one call on an engine in a bare process; a trial runs its steps through
the SDK against an in-process server, beside the client's threads, DuckDB and the reward pool,
and things that only happen there (a second OpenMP team, allocator state) decide its speed. This
runs `bench_transfer_learning.py --train-only` with the recipe's settings, the same seed and so
the same batches on every side, each in its own process, and reads each step's time from the
trial's record. A side is one of:

- `now`: this working tree;
- `--before REV`: the same command from a checkout of that git revision (a temporary worktree);
- `--env 'NAME:VAR=VALUE[;VAR=VALUE]'`: this working tree under that environment, e.g.
  `'mapped >= 32 MiB:AUTORESEARCH_MMAP_ABOVE_MB=32'` or, with the library installed,
  `'tcmalloc:LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4'`.

Printed per side: the SFT steps' milliseconds a token after the first step (which pays the
probes and first-touch allocations), the median step, the RL step, the process's voluntary
context switches, kernel CPU seconds, minor page faults and peak RSS, and each side's
milliseconds a token against the first's (above 1: slower than now). Sides alternate over
rounds so that drift in the machine's load falls on each.

    python -m bench.bench_recipe_steps --before 8783ad9 --rounds 2       # ~10 min on 2 cores
    python -m bench.bench_recipe_steps --env 'mapped >= 32 MiB:AUTORESEARCH_MMAP_ABOVE_MB=32'
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

from autoresearch.rl.record import TrialRecord, step_seconds  # noqa: E402

RECIPE = ["--sample-rows", "2", "--max-schema-chars", "1600", "--group", "8",
          "--reward-weight", "executes=0", "--reward-weight", "schema_linking=0.5"]
POLICY_VARIABLES = ("LD_PRELOAD", "AUTORESEARCH_MMAP_ABOVE_MB", "AUTORESEARCH_KEEP_FREED_MEMORY")


@dataclass
class Side:
    name: str
    tree: Path
    env: dict[str, str]


def sides_of(args: argparse.Namespace, scratch: Path) -> list[Side]:
    """The working tree first, then each revision's worktree, then each environment."""
    base = {k: v for k, v in os.environ.items() if k not in POLICY_VARIABLES}
    sides = [Side("now", ROOT, base)]
    for revision in args.before:
        tree = scratch / f"tree-{revision}"
        subprocess.run(["git", "worktree", "add", "--detach", str(tree), revision], cwd=ROOT,
                       check=True, capture_output=True)
        sides.append(Side(f"at {revision}", tree, base))
    for spec in args.env:
        name, _, assignments = spec.partition(":")
        env = dict(base)
        for assignment in filter(None, assignments.split(";")):
            variable, _, value = assignment.partition("=")
            env[variable.strip()] = value.strip()
        sides.append(Side(name, ROOT, env))
    return sides


def run_side(side: Side, args: argparse.Namespace, out: Path) -> dict:
    """Train the recipe's first steps in a fresh process; that process's figures."""
    env = dict(side.env, PYTHONPATH=os.pathsep.join([str(side.tree), str(side.tree / "datasets")]))
    command = [sys.executable, str(side.tree / "bench" / "bench_transfer_learning.py"),
               "--train-only", "--seed", str(args.seed), "--sft-steps", str(args.sft_steps),
               "--rl-steps", str(args.rl_steps), *RECIPE, "--out", str(out)]
    log = out.with_suffix(".log")
    started = time.perf_counter()
    with log.open("w") as sink:
        child = subprocess.Popen(command, cwd=side.tree, env=env, stdout=sink, stderr=sink)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own switches, faults and peak
    wall = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{side.name}: the training failed; the end of {log}:\n"
                         + log.read_text()[-3000:])
    steps = TrialRecord(out / "transfer-learning").of_type("step")
    sft = [(step_seconds(s), s["tokens"]) for s in steps if s.get("phase") == "sft"]
    return {"sft": [s for s, _ in sft], "sft_tokens": [t for _, t in sft],
            "rl": [step_seconds(s) for s in steps if s.get("phase") == "rl"], "wall": wall,
            "switches": usage.ru_nvcsw, "sys": usage.ru_stime, "faults": usage.ru_minflt,
            "peak_rss_mib": usage.ru_maxrss / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--before", action="append", default=[], metavar="REV",
                        help="a git revision to run the same steps from (repeatable)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME:VAR=VALUE",
                        help="this tree under an environment (repeatable)")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--sft-steps", type=int, default=4)
    parser.add_argument("--rl-steps", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="bench-recipe-steps-"))
    sides = sides_of(args, scratch)
    print(f"{len(sides)} sides x {args.rounds} rounds, {args.sft_steps} SFT and {args.rl_steps} "
          f"RL steps of the transfer recipe each (seed {args.seed}); "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    results: dict[str, list[dict]] = {side.name: [] for side in sides}
    try:
        for round_ in range(args.rounds):
            for side in sides if round_ % 2 == 0 else sides[::-1]:
                got = run_side(side, args, scratch / f"run-{round_}-{sides.index(side)}")
                results[side.name].append(got)
                print(f"  round {round_} {side.name:20s} SFT "
                      f"{' '.join(f'{s:.1f}' for s in got['sft'])}  RL "
                      f"{' '.join(f'{s:.1f}' for s in got['rl'])}  wall {got['wall']:.0f} s",
                      flush=True)
    finally:
        for side in sides[1:1 + len(args.before)]:
            subprocess.run(["git", "worktree", "remove", "--force", str(side.tree)], cwd=ROOT,
                           capture_output=True)

    def per_token(name: str) -> float:
        runs = results[name]
        return (sum(s for r in runs for s in r["sft"][1:])
                / sum(t for r in runs for t in r["sft_tokens"][1:]))

    first = per_token(sides[0].name)
    print("\n| side | SFT ms a token | SFT step (median, s) | RL step (s) | voluntary switches "
          "| kernel CPU (s) | minor faults (M) | peak RSS (GiB) | ms a token vs now |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for side in sides:
        runs = results[side.name]
        step = statistics.median(s for r in runs for s in r["sft"][1:])
        rl = [s for r in runs for s in r["rl"]]
        print(f"| {side.name} | {per_token(side.name) * 1e3:.2f} | {step:.1f} | "
              f"{statistics.median(rl) if rl else float('nan'):.1f} | "
              f"{statistics.median(r['switches'] for r in runs):,.0f} | "
              f"{statistics.median(r['sys'] for r in runs):.0f} | "
              f"{statistics.median(r['faults'] for r in runs) / 1e6:.1f} | "
              f"{max(r['peak_rss_mib'] for r in runs) / 1024:.1f} | "
              f"{per_token(side.name) / first:.2f}x |")
    print(f"\nload average {os.getloadavg()[0]:.2f}; runs kept in {scratch}")


if __name__ == "__main__":
    main()
