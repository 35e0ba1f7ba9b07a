"""What RL adds to its own SFT start: several GRPO runs forked from one finished SFT, scored
against that SFT on dev, test and transfer, with runs as the unit.

Reads a run of `bench.bench_transfer_learning` (its config and its SFT checkpoint), then trains
one GRPO run per seed from that checkpoint with the run's own RL settings (or those `--rl-set`,
`--reward-weight` and `--rl-steps` change), all side by side on one in-process server, and
scores each run's final weights and the SFT weights greedily on the same tasks. For each split:
the SFT's accuracy, each run's, and the mean of the runs' differences from the SFT with a 95%
t-interval over the runs (each run's difference on the same tasks is one observation). The
interval covers what varies between RL runs from this SFT (prompts drawn, samples); a second
SFT seed would add the SFT's own spread. Also per run: groups trained on and drawn, samples,
and the RL seconds.

    python -m bench.bench_rl_over_sft --from runs/recipe-dynamic-seed0 --seeds 3

Each run starts from the SFT weights with a fresh optimizer, as a study's trials fork from its
warm-up (the source run's RL carried the SFT's Adam moments on). So the seed that trained the
source run repeats the source's first RL step exactly (the same weights, prompts and sampling
seeds, here beside other runs), checked field for field; its later steps differ by the moments.
Resumable: rerun with the same `--out` (finished trials are read back).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

os.environ.setdefault("TINKER_TELEMETRY", "0")

from autoresearch.evaluation.stats import paired_t, wilson
from autoresearch.rl.config import TrialConfig
from autoresearch.rl.record import TrialRecord, step_seconds
from autoresearch.rl.trial import run_trial
from bench.bench_rl_ablation import accuracy
from bench.bench_transfer_learning import (
    API_KEY,
    SPLITS,
    _setting,
    _weight,
    saved_run,
    sft_checkpoint,
)
from rewards import RewardPool
from server.entrypoints.runtime import ServerConfig, ServerThread

#: Fields of an RL step that must repeat bit for bit when the same seed trains again.
REPEATED_FIELDS = ("loss", "reward_mean", "entropy", "groups_used", "groups_drawn",
                   "samples_drawn", "completion_tokens", "grad_norm")


def source(run: Path) -> tuple[TrialConfig, str]:
    """The source run's config and the path of its last SFT checkpoint."""
    record, config = saved_run(run)
    return config, sft_checkpoint(record, config)


def configs(base: TrialConfig, sft: str, seeds: list[int], rl: dict[str, Any],
            tasks: dict[str, int]) -> dict[str, TrialConfig]:
    """The SFT scored alone (`sft`) and one RL run per seed (`rl-seed{N}`), all from `sft`,
    each scored at its end on the same tasks."""
    common: dict[str, Any] = {"init_checkpoint": sft, "sft.steps": 0, "eval.start": False,
                              "eval.baseline": False, "eval.every": 0}
    common.update({f"eval.{split}_tasks": n for split, n in tasks.items()})
    out = {"sft": base.with_changes({**common, "name": "sft", "rl.steps": 0})}
    for seed in seeds:
        out[f"rl-seed{seed}"] = base.with_changes({**common, **rl, "name": f"rl-seed{seed}",
                                                   "seed": seed})
    return out


def verdicts(record: TrialRecord) -> dict[str, dict[str, bool]]:
    return {e["split"]: e["verdicts"] for e in record.of_type("eval")}


def rl_counts(record: TrialRecord) -> dict[str, float]:
    steps = [s for s in record.of_type("step") if s.get("phase") == "rl"]
    return {"steps": len(steps), "groups_used": sum(s["groups_used"] for s in steps),
            "groups_drawn": sum(s.get("groups_drawn", s["groups_used"]) for s in steps),
            "samples": sum(s.get("samples_drawn", 0) for s in steps),
            "seconds": sum(step_seconds(s) for s in steps)}


def repeats_source(record: TrialRecord, run: Path) -> str:
    """Whether a rerun's first RL step (all that precedes an optimizer update) equals the
    source run's, field for field."""
    mine, theirs = ([s for s in r.of_type("step") if s.get("phase") == "rl" and s["step"] == 0]
                    for r in (record, TrialRecord(run / "transfer-learning")))
    if not mine or not theirs:
        return "not compared (a first RL step is missing)"
    differing = [f for f in REPEATED_FIELDS if mine[0].get(f) != theirs[0].get(f)]
    if differing:
        return "first RL step differs from the source's in " + ", ".join(differing)
    return "first RL step equal to the source's in " + ", ".join(REPEATED_FIELDS)


def summarise(out: Path, names: list[str]) -> tuple[str, dict[str, Any]]:
    """The markdown tables and the numbers behind them."""
    records = {n: TrialRecord(out / n) for n in names}
    v = {n: verdicts(r) for n, r in records.items()}
    runs = [n for n in names if n != "sft"]
    lines = ["| split | n | SFT | " + " | ".join(runs) + " | RL - SFT (runs, 95% t) |",
             "|---|---|---|" + "---|" * len(runs) + "---|"]
    numbers: dict[str, Any] = {}
    for split in SPLITS:
        if split not in v["sft"]:
            continue
        tasks = sorted(v["sft"][split])
        base = accuracy(v["sft"][split], tasks)
        accs = [accuracy(v[n][split], tasks) for n in runs]
        est = paired_t([a - base for a in accs])
        ci = wilson(round(base * len(tasks)), len(tasks))
        numbers[split] = {"n": len(tasks), "sft": base, "runs": dict(zip(runs, accs, strict=True)),
                          "difference": {"value": est.value, "low": est.low, "high": est.high}}
        lines.append(f"| {split} | {len(tasks)} | {base:.3f} [{ci.low:.3f}, {ci.high:.3f}] | "
                     + " | ".join(f"{a:.3f}" for a in accs)
                     + f" | {est.value:+.3f} [{est.low:+.3f}, {est.high:+.3f}] |")
    lines += ["", "| run | RL steps | groups trained / drawn | samples | RL s |",
              "|---|---|---|---|---|"]
    for n in runs:
        c = numbers.setdefault("rl", {})[n] = rl_counts(records[n])
        lines.append(f"| {n} | {c['steps']} | {c['groups_used']} / {c['groups_drawn']} | "
                     f"{c['samples']} | {c['seconds']:.0f} |")
    return "\n".join(lines), numbers


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--from", dest="source", type=Path, required=True,
                        help="a finished bench_transfer_learning run (its --out)")
    parser.add_argument("--out", type=Path, default=None,
                        help="where the runs go (default: <from>/rl-over-sft)")
    parser.add_argument("--seeds", type=int, default=3, help="RL runs, seeds 0..N-1")
    parser.add_argument("--rl-steps", type=int, default=None)
    parser.add_argument("--rl-set", type=_setting, action="append", default=[],
                        metavar="NAME=VALUE", help="an RL setting changed for every run")
    parser.add_argument("--reward-weight", type=_weight, action="append", default=[],
                        metavar="NAME=VALUE")
    parser.add_argument("--dev-tasks", type=int, default=48)
    parser.add_argument("--test-tasks", type=int, default=48)
    parser.add_argument("--transfer-tasks", type=int, default=150)
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default=None)
    args = parser.parse_args()
    out = args.out or args.source / "rl-over-sft"
    base, sft = source(args.source)
    rl: dict[str, Any] = {f"rl.{k}": val for k, val in args.rl_set}
    rl.update({f"reward.weights.{k}": w for k, w in args.reward_weight})
    if args.rl_steps:
        rl["rl.steps"] = args.rl_steps
    tasks = {"dev": args.dev_tasks, "test": args.test_tasks, "transfer": args.transfer_tasks}
    trials = configs(base, sft, list(range(args.seeds)), rl, tasks)
    command = "python -m bench.bench_rl_over_sft " + " ".join(sys.argv[1:])
    print(f"{command}\nfrom {sft}; load average {os.getloadavg()}", flush=True)
    started = time.time()
    server_config = ServerConfig(port=0, data_dir=args.source / "server", model=args.model,
                                 device=args.device)
    with ServerThread(server_config) as server, RewardPool() as pool, \
            ThreadPoolExecutor(max_workers=len(trials), thread_name_prefix="trial") as threads:
        futures = [threads.submit(run_trial, config, out / name, server.url, API_KEY, None, pool)
                   for name, config in trials.items()]
        for future in futures:
            future.result()
    text, numbers = summarise(out, list(trials))
    same_seed = f"rl-seed{base.seed}"
    bits = (repeats_source(TrialRecord(out / same_seed), args.source)
            if same_seed in trials and not rl else "not compared (RL settings changed)")
    wall = time.time() - started
    summary = {"command": command, "wall_seconds": round(wall),
               "load_average": os.getloadavg(), "bits": bits, "numbers": numbers}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"\nwall {wall:.0f} s; load average {os.getloadavg()}\n{same_seed}: {bits}\n\n{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
