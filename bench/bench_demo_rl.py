"""Does the demo's RL beat the warm-up it forks from? RL variants scored against the warm-up.

Runs one study on the embedded Gemma 3 270M that decides nothing: the demo study's warm-up
(`autoresearch/configs/demo_study.yaml`, cached), its base trial with `--base` overrides as the
baseline, and each `--variant` (changes to that base) as one more trial, side by side, every
trial scored on the demo's 48 dev tasks. The study's report ("Against the warm-up") gives each
trial minus the warm-up checkpoint, paired per task with a 95% interval; this prints the same.

    python -m bench.bench_demo_rl --out runs/demo-rl/defaults \\
        --variant '{"rl.steps": 8, "rl.prompts_per_step": 8, "rl.group_size": 8}'
    python -m bench.bench_demo_rl --out runs/demo-rl/no-executes \\
        --base '{"reward.weights.executes": 0.0, "rl.steps": 8, "rl.group_size": 8}' \\
        --variant '{"rl.adam.learning_rate": 3e-5}'

Resumable: rerun with the same `--out`.
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

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TINKER_TELEMETRY", "0")

from autoresearch.study.confirmation import against_warmup  # noqa: E402
from autoresearch.study.journal import Journal  # noqa: E402
from autoresearch.study.runner import run_study  # noqa: E402
from autoresearch.study.spec import Study  # noqa: E402
from bench.bench_study import ListProposer, _choices, fmt, set_dotted  # noqa: E402

DEMO = ROOT / "autoresearch" / "configs" / "demo_study.yaml"


def variants_study(base: dict[str, Any], variants: list[dict[str, Any]], parallel: int,
                   warmup: dict[str, Any] | None = None) -> tuple[Study, ListProposer]:
    """The demo study with `base` applied to its base trial (and `warmup` to its warm-up),
    proposing `variants` in order."""
    demo = Study.from_file(DEMO).model_dump(mode="json")
    for dotted, value in base.items():
        set_dotted(demo["base_trial"], dotted, value)
    for dotted, value in (warmup or {}).items():
        set_dotted(demo["warmup"], dotted, value)
    jobs = [(v, "an RL variant") for v in variants]
    demo.update(name="demo-rl", pruning={"kind": "none"},
                search_space=_choices(jobs, demo["base_trial"]),
                executor={**demo["executor"], "max_parallel_trials": parallel},
                budget={"max_trials": len(variants) + 1, "confirm_seeds": 0,
                        "max_confirm_trials": 0, "seed_bank": 0})
    return Study.model_validate(demo), ListProposer(jobs)


def print_table(directory: Path) -> None:
    """Each finished trial of the study in `directory` against the warm-up it forked from."""
    trials = Journal(directory, read_only=True).trials()
    warmup = next((t for t in trials if t["role"] == "warmup"), None)
    print(f"\nwarm-up: dev {warmup and warmup.get('dev_accuracy')}")
    print("| trial | changes | dev | executes | vs warm-up (paired, 95% CI) |")
    print("|---|---|---|---|---|")
    for t in trials:
        if t["role"] == "warmup" or not t.get("dev"):
            continue
        changes = json.dumps(t["changes"] or {}) if t["role"] != "baseline" else "base"
        print(f"| {t['id']} | {changes} | {t['dev_accuracy']:.3f} | "
              f"{t['dev'].get('execute_rate', float('nan')):.2f} | "
              f"{fmt(against_warmup(t, warmup))} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", type=json.loads, default={},
                        help="JSON overrides of the demo's base trial (dotted keys)")
    parser.add_argument("--warmup", type=json.loads, default={},
                        help="JSON overrides of the demo's warm-up (dotted keys)")
    parser.add_argument("--variant", type=json.loads, action="append", default=[],
                        help="JSON changes to the base: one more trial (repeatable)")
    parser.add_argument("--parallel", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("autoresearch.study.runner").setLevel(logging.INFO)
    print(f"command: python -m bench.bench_demo_rl {' '.join(sys.argv[1:])}; loadavg "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    started = time.time()
    study, proposer = variants_study(args.base, args.variant, args.parallel,
                                      args.warmup)
    run_study(study, args.out, proposer=proposer)
    print_table(args.out)
    print(f"\n{time.time() - started:.0f} s; loadavg "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
