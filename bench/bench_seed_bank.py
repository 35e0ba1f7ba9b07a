"""The keep rule on real runs: an A/A seed bank of the demo's base config, resampled into
pseudo-studies through the runner's own decision code.

1. The bank: the demo study's base config (its warm-up, its trial, its dev tasks) run under
   `--seeds` seeds, as one study whose proposer re-proposes the base config under a new seed
   each time (`run_study`, so it resumes from its journal). Printed: each run's dev accuracy
   and the measured run-to-run SD.
2. A/A pseudo-studies (`--pseudo` of them): a baseline and `--candidates` candidates that are
   all this one config, each (config, seed) the study asks for served by a different bank run
   drawn without replacement. Every keep is a false keep. The rule is the shipped one (per
   task and per run) beside the same code with the run-level test off.
3. Power: the same pseudo-studies with one candidate's runs spiked: a fixed random set of
   tasks, the same in each of its runs, turned right, sized so its mean dev accuracy rises by
   +5 or +10 points. Counted: studies that end with it as their best.

Rates come with Wilson 95% intervals. The budget is one confirmation of two seeds a side
(`confirm_seeds: 2`, `max_confirm_trials: 4`, `seed_bank: 3`), so a pseudo-study needs at most
1 + candidates + 2 + 4 distinct runs; `--candidates` is capped to fit the bank.

    python -m bench.bench_seed_bank [--seeds 12] [--pseudo 2000] [--candidates 3]
    python -m bench.bench_seed_bank --resume runs/bench-seed-bank/<stamp>
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TINKER_TELEMETRY", "0")

from autoresearch.evaluation.stats import wilson  # noqa: E402
from autoresearch.study.journal import Journal  # noqa: E402
from autoresearch.study.proposers import Context, Proposal, ProposalBatch  # noqa: E402
from autoresearch.study.runner import run_study  # noqa: E402
from autoresearch.study.spec import Study  # noqa: E402
from bench.bench_keep_rule import new_study  # noqa: E402

DEMO = ROOT / "autoresearch" / "configs" / "demo_study.yaml"
FIRST_SEED = 1000
BUDGET = {"confirm_seeds": 2, "max_confirm_trials": 4, "seed_bank": 3, "alpha": 0.05}


class SeedProposer:
    """The base config again, each time under the next unused seed."""

    name = "seed-bank"

    def propose(self, context: Context, n: int) -> ProposalBatch:
        done = len(context.explored())
        return ProposalBatch(self.name, "sampled", [
            Proposal({"seed": FIRST_SEED + done + k}, "the base config under another seed")
            for k in range(n)])


def bank_study(seeds: int) -> Study:
    demo = Study.from_file(DEMO).model_dump(mode="json")
    demo.update(name="seed-bank", pruning={"kind": "none"},
                search_space={"seed": {"choices": list(range(FIRST_SEED, FIRST_SEED + seeds))}},
                budget={"max_trials": seeds, "confirm_seeds": 0, "seed_bank": 0})
    return Study.model_validate(demo)


def candidates_for(runs: int, wanted: int) -> int:
    """Candidates a pseudo-study can have when each run it asks for is a distinct bank run: the
    baseline, two bank runs and a confirmation of two seeds a side take 1 + 2 + 4 of them."""
    return min(wanted, runs - 1 - 2 - 4)


def bank_runs(directory: Path) -> list[dict[str, Any]]:
    trials = Journal(directory, read_only=True).trials()
    return [t for t in trials if t["role"] in ("baseline", "explore") and t.get("dev")]


def take(rng: np.random.Generator, pool: list[int], size: int) -> int:
    """The next index of a draw without replacement from `size` runs; a study that asks for more
    runs than the bank holds (one that confirms several candidates) gets them again in a fresh
    order, rather than a crash that would drop exactly those studies from the rates."""
    if not pool:
        pool.extend(rng.permutation(size))
    return int(pool.pop())


class BankWorld:
    """Serves each (config, seed) a study asks for with a different bank run, drawn without
    replacement until the bank is spent (then again, see `take`); a spiked config gets a fixed
    set of tasks turned right in every run."""

    def __init__(self, rng: np.random.Generator, runs: list[dict[str, bool]],
                 spiked: int | None = None, spike: set[str] | None = None) -> None:
        self.rng, self.pool = rng, list(rng.permutation(len(runs)))
        self.bank, self.spiked, self.spike = runs, spiked, spike or set()
        self.runs: dict[tuple[int, int], dict[str, bool]] = {}

    def run(self, config: int, seed: int) -> dict[str, bool]:
        if (config, seed) not in self.runs:
            self.runs[(config, seed)] = self.draw(config)
        return self.runs[(config, seed)]

    def draw(self, config: int) -> dict[str, bool]:
        """The next bank run for `config` (spiked if it is the spiked config)."""
        verdicts = dict(self.bank[take(self.rng, self.pool, len(self.bank))])
        if config == self.spiked:
            verdicts.update(dict.fromkeys(self.spike & set(verdicts), True))
        return verdicts


def pseudo_studies(runs: list[dict[str, bool]], count: int, candidates: int, effect: float,
                   run_level: bool, seed: int) -> tuple[int, int]:
    """(hits, studies): false keeps without an effect, the planted candidate kept with one."""
    study = Study(name="pseudo", budget={"max_trials": candidates + 1, **BUDGET})
    rng = np.random.default_rng(seed)
    tasks = sorted(runs[0])
    accuracy = statistics.mean(sum(r.values()) / len(r) for r in runs)
    k = round(effect * len(tasks) / max(1e-9, 1 - accuracy)) if effect else 0
    hits = 0
    for _ in range(count):
        planted = int(rng.integers(1, candidates + 1)) if effect else None
        spike = set(rng.choice(tasks, size=min(k, len(tasks)), replace=False)) if k else set()
        best = new_study(BankWorld(rng, runs, planted, spike), candidates, study, run_level)
        hits += (best != 0) if planted is None else (best == planted)
    return hits, count


def rate(hits: int, n: int) -> str:
    est = wilson(hits, n)
    return f"{est.value:.1%} [{est.low:.1%}, {est.high:.1%}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=12)
    parser.add_argument("--pseudo", type=int, default=2000)
    parser.add_argument("--candidates", type=int, default=3)
    parser.add_argument("--resume", type=Path)
    args = parser.parse_args()
    root = args.resume or ROOT / "runs" / "bench-seed-bank" / time.strftime("%Y%m%d-%H%M%S")
    print(f"command: python -m bench.bench_seed_bank --seeds {args.seeds} --pseudo "
          f"{args.pseudo} --candidates {args.candidates} (results in {root}); "
          f"loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    started = time.time()
    run_study(bank_study(args.seeds), root / "bank", proposer=SeedProposer())
    rows = bank_runs(root / "bank")
    runs = [r["dev"]["verdicts"] for r in rows]
    scores = [r["dev_accuracy"] for r in rows]
    sd = statistics.stdev(scores)
    print(f"\nbank: {len(rows)} runs of the demo's base config on {len(runs[0])} dev tasks "
          f"({time.time() - started:.0f} s)")
    for r in rows:
        print(f"  {r['id']} seed {r['seed']}: dev {r['dev_accuracy']:.3f}")
    print(f"run-to-run SD of dev accuracy: {sd:.4f} ({100 * sd:.1f} points, {len(rows) - 1} df); "
          f"mean {statistics.mean(scores):.3f}")
    candidates = candidates_for(len(runs), args.candidates)
    if candidates < 1:
        raise SystemExit("the bank is too small for a pseudo-study: use more --seeds")
    print(f"\n{args.pseudo} pseudo-studies per cell: baseline + {candidates} candidates, one "
          f"confirmation of 2 seeds a side at alpha 0.05, seed bank of 3; each run a distinct "
          "bank run\n")
    print("| planted effect | measures | task-level rule | shipped rule (tasks and runs) |")
    print("|---|---|---|---|")
    summary: dict[str, Any] = {"sd": sd, "scores": scores, "cells": {}}
    for k, effect in enumerate((0.0, 0.05, 0.10)):
        cells = [pseudo_studies(runs, args.pseudo, candidates, effect, level, seed=100 + k)
                 for level in (False, True)]
        what = "false keeps per study" if not effect else "power (planted kept)"
        label = "none" if not effect else f"+{effect * 100:.0f} pts"
        print(f"| {label} | {what} | {rate(*cells[0])} | {rate(*cells[1])} |", flush=True)
        summary["cells"][label] = {"tasks": cells[0], "shipped": cells[1]}
    (root / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"\n{time.time() - started:.0f} s in all; loadavg "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
