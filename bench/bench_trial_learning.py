"""Does RL really teach Gemma SQL? Base model vs SFT warm-up vs SFT+RL, on held-out domains.

Runs one trial on the embedded Gemma 3 270M against an in-process server: the base model is
scored, then again after the SFT warm-up, then after GRPO, each greedily on the same test tasks
from domains never seen in training (the trial's `eval.baseline` stages). Prints
execution accuracy with 95% Wilson intervals, and the paired difference (SFT+RL minus SFT) with
its interval, which must exclude zero for the improvement to count.

    python -m bench.bench_trial_learning                 # the default config, ~30 min on CPU
    python -m bench.bench_trial_learning --quick         # a smoke run
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from autoresearch.evaluation.stats import paired_difference
from autoresearch.rl.config import TrialConfig
from autoresearch.rl.record import TrialRecord
from autoresearch.rl.trial import run_trial
from rewards import RewardPool
from server.entrypoints.runtime import ServerConfig, ServerThread


def config(quick: bool, test_tasks: int) -> TrialConfig:
    sft = {"steps": 4 if quick else 30, "batch_size": 8, "adam": {"learning_rate": 5e-4}}
    rl = {
        "steps": 2 if quick else 30,
        "prompts_per_step": 4 if quick else 8,
        "group_size": 4 if quick else 8,
        "temperature": 1.0,
        "max_tokens": 64,
        "adam": {"learning_rate": 1e-4},
    }
    evaluation = {"every": 0, "dev_tasks": 16 if quick else 64, "test_tasks": test_tasks,
                  "max_tokens": 64}
    return TrialConfig.model_validate(
        {"name": "sft-then-rl", "lora_rank": 16, "seed": 0, "sft": sft, "rl": rl,
         "eval": {**evaluation, "baseline": True}, "checkpoint_every": 10})


def accuracy(summary: dict) -> str:
    acc = summary["accuracy"]
    return f"{acc['value']:.3f} [{acc['low']:.3f}, {acc['high']:.3f}] (n={acc['n']})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--test-tasks", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    test_tasks = args.test_tasks or (16 if args.quick else 200)
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-learning-"))
    trial = config(args.quick, test_tasks)
    started = time.time()
    with ServerThread(ServerConfig(port=0, data_dir=out / "server")) as server, \
            RewardPool() as pool:
        result = run_trial(trial, out / trial.name, server.url, "tml-bench", pool=pool)
    stages = {e["stage"]: e for e in TrialRecord(out / trial.name).of_type("eval")
              if e["split"] == "test"}
    base_eval, sft_eval, rl_eval = stages["base"], stages["sft"], result.test
    ids = sorted(sft_eval["verdicts"])
    diff = paired_difference([float(rl_eval["verdicts"][i]) for i in ids],
                             [float(sft_eval["verdicts"][i]) for i in ids])
    print(f"\nload average: {os.getloadavg()}; wall time {time.time() - started:.0f} s; out {out}")
    print(f"base model      test accuracy: {accuracy(base_eval)}")
    print(f"after SFT       test accuracy: {accuracy(sft_eval)}")
    print(f"after SFT + RL  test accuracy: {accuracy(rl_eval)}")
    print(f"RL - SFT (paired over {diff.n} tasks): {diff.value:+.3f} "
          f"[{diff.low:+.3f}, {diff.high:+.3f}]  "
          f"{'excludes zero' if diff.low > 0 or diff.high < 0 else 'includes zero'}")


if __name__ == "__main__":
    main()
