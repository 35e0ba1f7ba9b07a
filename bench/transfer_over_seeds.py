"""The transfer recipe over several runs (seeds): each split, stage and decoding of every run
directory `bench_transfer_learning.py` wrote, with runs as the unit.

For each answer kind that every run scored (greedy table rows, and a decoding pass's greedy as
written, greedy snapped and voted answers), prints each run's accuracy, the mean over runs with
a 95% interval that holds both the runs' luck and the questions' (`stats.runs_and_questions_
mean`: other seeds, other questions of the same kind), the run-to-run SD, and the executing
rate per run and on average. A run's own Wilson interval is in its own table.

    python -m bench.transfer_over_seeds runs/seed0 runs/seed1 runs/seed2
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from autoresearch.evaluation.stats import runs_and_questions_mean
from bench.bench_transfer_learning import SPLITS, STAGES, snapped_suffix

LABELS = dict(STAGES)


def eval_entries(run: Path) -> list[dict[str, Any]]:
    """Every eval entry of a run: its training trial's and each rescoring pass's."""
    entries = []
    for record in sorted(run.glob("**/record.jsonl")):
        for line in record.read_text().splitlines():
            entry = json.loads(line)
            if entry.get("type") == "eval":
                entries.append(entry)
    return entries


def answers(entry: dict[str, Any]) -> list[tuple[str, dict[str, bool], float]]:
    """(kind, per-task verdicts, executing rate) of every answer kind an eval entry holds: the
    greedy query as written where names or values were snapped, the greedy answer where a vote
    chose, and the answer the pass chose."""
    decoding = entry.get("decoding") or {}
    snapped = snapped_suffix(bool(decoding.get("snap_names")), bool(decoding.get("snap_values")))
    found = []
    if "written_verdicts" in decoding:
        found.append(("greedy as written", decoding["written_verdicts"],
                      decoding["written_execute_rate"]))
    if decoding.get("mode") == "vote":
        found.append((f"greedy{snapped}" if snapped else "greedy as written",
                      decoding["greedy_verdicts"],
                      decoding["greedy_execute_rate"]))
        chosen = f"vote of {decoding['candidates']}{snapped}"
    else:
        chosen = f"greedy{snapped}" if snapped else "greedy as written"
    found.append((chosen, entry["verdicts"], entry["execute_rate"]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", type=Path, nargs="+")
    args = parser.parse_args()
    table: dict[tuple[str, str, str], list[tuple[dict[str, bool], float]]] = defaultdict(list)
    for run in args.runs:
        seen = set()
        for entry in eval_entries(run):
            for kind, verdicts, rate in answers(entry):
                key = (entry["split"], entry["stage"], kind)
                if key not in seen:  # the first pass that scored it (a later one is the same)
                    seen.add(key)
                    table[key].append((verdicts, rate))
    print(f"{len(args.runs)} runs: {', '.join(str(r) for r in args.runs)}\n")
    print("| split | stage | answers | n | each run correct | mean [95% CI, runs and questions] "
          "| run SD | each run executes | mean executes |")
    print("|---|---|---|---|---|---|---|---|---|")
    order = {s: i for i, s in enumerate(SPLITS)}
    stages = {s: i for i, s in enumerate(LABELS)}
    for (split, stage, kind), runs in sorted(
            table.items(), key=lambda kv: (order.get(kv[0][0], 9), stages.get(kv[0][1], 9))):
        if len(runs) != len(args.runs):
            continue
        accuracy = [sum(v.values()) / len(v) for v, _ in runs]
        rates = [rate for _, rate in runs]
        mean = runs_and_questions_mean([v for v, _ in runs])
        sd = statistics.stdev(accuracy) if len(accuracy) > 1 else 0.0
        print(f"| {split} | {LABELS.get(stage, stage)} | {kind} | {len(runs[0][0])} | "
              f"{', '.join(f'{a:.3f}' for a in accuracy)} | **{mean.value:.3f}** "
              f"[{mean.low:.3f}, {mean.high:.3f}] | {sd:.3f} | "
              f"{', '.join(f'{r:.3f}' for r in rates)} | {statistics.mean(rates):.3f} |")


if __name__ == "__main__":
    main()
