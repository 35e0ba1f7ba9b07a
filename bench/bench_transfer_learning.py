"""Does a model trained here write SQL for databases it never saw? SFT then GRPO on the
multi-table corpus, scored on dev, test and the hand-written transfer split before and after
each stage.

Runs one trial against an in-process server: the base model is scored, then again after the SFT
warm-up on gold queries, then after GRPO, each greedily on the same tasks: the fixed dev and
test subsets (databases of themes never trained on) and the transfer split (three hand-written
application databases no corpus has). Prompts show each schema as CREATE TABLE statements with
keys, capped by the schema-linking truncation rule. Prints execution accuracy and the executing
rate with 95% Wilson intervals per split and stage, and the paired stage-to-stage differences.

    python bench/bench_transfer_learning.py                  # Gemma 3 270M on CPU, < 60 min
    python bench/bench_transfer_learning.py --quick          # the same pipeline, tiny sizes
    python bench/bench_transfer_learning.py --model google/gemma-3-1b-pt --device cuda \\
        --sft-steps 120 --rl-steps 60 --prompts 16 --group 8   # the recipe on a GPU

Resumable: rerun with the same `--out` and the trial resumes from its last checkpoint.
`--rescore` scores a finished run's saved weights (the base model, after SFT, after RL) again
on the transfer split as it stands, without training: for when the split's text has changed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from autoresearch.evaluation.stats import paired_difference, wilson
from autoresearch.rl.config import TrialConfig
from autoresearch.rl.record import CONFIG_FILE, TrialRecord
from autoresearch.rl.trial import run_trial
from rewards import RewardPool
from server.entrypoints.runtime import ServerConfig, ServerThread

SPLITS = ("dev", "test", "transfer")
STAGES = (("base", "base model"), ("sft", "after SFT"), ("final", "after SFT + RL"))


def trial_config(args: argparse.Namespace) -> TrialConfig:
    quick = args.quick
    return TrialConfig.model_validate({
        "name": "transfer-learning",
        "base_model": args.base_model,
        "lora_rank": args.rank,
        "seed": args.seed,
        "tokenizer": args.tokenizer,
        "corpus": "multitable",
        "prompt": {"sample_rows": args.sample_rows, "max_schema_chars": args.max_schema_chars},
        "sft": {"steps": 2 if quick else args.sft_steps, "batch_size": args.batch,
                "examples": 100_000, "adam": {"learning_rate": args.sft_lr}},
        "rl": {"steps": 1 if quick else args.rl_steps,
               "prompts_per_step": 2 if quick else args.prompts,
               "group_size": 2 if quick else args.group, "temperature": 1.0,
               "max_tokens": args.max_tokens, "adam": {"learning_rate": args.rl_lr}},
        "eval": {"every": 0, "dev_tasks": 4 if quick else args.dev_tasks,
                 "test_tasks": 4 if quick else args.test_tasks,
                 "transfer_tasks": 6 if quick else args.transfer_tasks,
                 "max_tokens": args.max_tokens, "baseline": True, "start": True},
        "reward": {"weights": dict(args.reward_weight)},
        "checkpoint_every": 5,
    })


def _weight(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    return name, float(value)


def _rate(hits: list[bool]) -> str:
    est = wilson(sum(hits), len(hits))
    return f"{est.value:.3f} [{est.low:.3f}, {est.high:.3f}]"


HEADER = ["| split | stage | n | correct (EX) [95% CI] | executes [95% CI] |",
          "|---|---|---|---|---|"]


def _row(split: str, label: str, e: dict[str, Any]) -> tuple[str, dict[str, int]]:
    """One table row from an eval entry, and its counts."""
    n = len(e["verdicts"])
    executes = round(e["execute_rate"] * n)
    correct = [bool(v) for v in e["verdicts"].values()]
    ran = [True] * executes + [False] * (n - executes)
    return (f"| {split} | {label} | {n} | {_rate(correct)} | {_rate(ran)} |",
            {"n": n, "correct": sum(correct), "executes": executes})


def table(record: TrialRecord) -> tuple[str, dict[str, Any]]:
    """The markdown table of every split and stage, and the numbers behind it."""
    evals = {(e["split"], "base" if e["stage"] == "start" else e["stage"]): e
             for e in record.of_type("eval")}
    lines = list(HEADER)
    numbers: dict[str, Any] = {}
    for split in SPLITS:
        for stage, label in STAGES:
            e = evals.get((split, stage))
            if e is None:
                continue
            line, numbers[f"{split}/{stage}"] = _row(split, label, e)
            lines.append(line)
        for (a, b) in (("sft", "base"), ("final", "sft"), ("final", "base")):
            ea, eb = evals.get((split, a)), evals.get((split, b))
            if ea is None or eb is None:
                continue
            ids = sorted(ea["verdicts"])
            d = paired_difference([float(ea["verdicts"][i]) for i in ids],
                                  [float(eb["verdicts"][i]) for i in ids])
            numbers[f"{split}/{a}-{b}"] = {"value": d.value, "low": d.low, "high": d.high}
    return "\n".join(lines), numbers


def rescore(out: Path, server_config: ServerConfig) -> str:
    """The transfer rows again, from the finished run's saved SFT and final weights (and the
    base model), each scored on the transfer split as it stands now."""
    record = TrialRecord(out / "transfer-learning")
    config = TrialConfig.model_validate(yaml.safe_load((record.dir / CONFIG_FILE).read_text()))
    final = record.final()
    if final is None:
        raise SystemExit(f"{out} holds no finished run to rescore")
    sft = next(c["path"] for c in record.of_type("checkpoint")
               if c["phase"] == "sft" and c["step"] == config.sft.steps)
    rows = {}
    with ServerThread(server_config) as server, RewardPool() as pool:
        for stage, path in (("sft", sft), ("final", final["checkpoint"])):
            job = config.with_changes({
                "name": f"rescore-{stage}", "init_checkpoint": path, "sft.steps": 0,
                "rl.steps": 0, "eval.dev_tasks": 0, "eval.test_tasks": 0, "eval.start": False,
                "eval.baseline": stage == "sft", "eval.transfer_tasks": 100_000})
            run_trial(job, out / "rescore" / stage, server.url, "tml-bench", pool=pool)
            for e in TrialRecord(out / "rescore" / stage).of_type("eval"):
                if e["split"] == "transfer":
                    rows["base" if e["stage"] == "base" else stage] = e
    return "\n".join(HEADER + [_row("transfer", label, rows[stage])[0]
                                for stage, label in STAGES])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rescore", action="store_true",
                        help="score a finished run's weights on the transfer split again")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--model", default=None, help="server model (default: embedded Gemma)")
    parser.add_argument("--base-model", default="google/gemma-3-270m",
                        help="the name trials address the model by")
    parser.add_argument("--device", default=None, help="cpu, cuda or mps (default: best)")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer id or path (default: what the server reports)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--sft-steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--sft-lr", type=float, default=5e-4)
    parser.add_argument("--rl-steps", type=int, default=8)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--rl-lr", type=float, default=5e-5)
    parser.add_argument("--max-tokens", type=int, default=80)
    parser.add_argument("--sample-rows", type=int, default=0)
    parser.add_argument("--max-schema-chars", type=int, default=1200)
    parser.add_argument("--reward-weight", type=_weight, action="append", default=[],
                        metavar="NAME=VALUE", help="a reward component's weight in RL, e.g. "
                        "schema_linking=0.3 (repeatable; the others keep their defaults)")
    parser.add_argument("--dev-tasks", type=int, default=48)
    parser.add_argument("--test-tasks", type=int, default=48)
    parser.add_argument("--transfer-tasks", type=int, default=150)
    args = parser.parse_args()
    if args.model and args.base_model == "google/gemma-3-270m":
        args.base_model = args.model
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-transfer-"))
    trial = trial_config(args)
    started = time.time()
    server_config = ServerConfig(port=0, data_dir=out / "server", model=args.model,
                                 device=args.device)
    if args.rescore:
        text = rescore(out, server_config)
        print(f"\nrescored {out} in {time.time() - started:.0f} s; load average "
              f"{os.getloadavg()}\n\n{text}")
        return
    with ServerThread(server_config) as server, RewardPool() as pool:
        run_trial(trial, out / trial.name, server.url, "tml-bench", pool=pool)
    wall = time.time() - started
    text, numbers = table(TrialRecord(out / trial.name))
    steps = list(TrialRecord(out / trial.name).of_type("step"))
    def seconds(entry: dict[str, Any]) -> float:
        value = entry["seconds"]
        return sum(value.values()) if isinstance(value, dict) else value

    sft_s = sum(seconds(e) for e in steps if e.get("phase") == "sft")
    rl_s = sum(seconds(e) for e in steps if e.get("phase") == "rl")
    eval_s = sum(e["seconds"] for e in TrialRecord(out / trial.name).of_type("eval"))
    summary = {"command": "python bench/bench_transfer_learning.py " + " ".join(
                   a for a in sys.argv[1:]),
               "wall_seconds": round(wall), "sft_seconds": round(sft_s),
               "rl_seconds": round(rl_s), "eval_seconds": round(eval_s),
               "load_average": os.getloadavg(), "config": json.loads(trial.model_dump_json()),
               "numbers": numbers}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"\n{summary['command']}\nwall {wall:.0f} s (SFT {sft_s:.0f} s, RL {rl_s:.0f} s, "
          f"evaluation {eval_s:.0f} s); load average {os.getloadavg()}; out {out}\n")
    print(text)
    for key, d in numbers.items():
        if "value" in d:
            print(f"{key}: {d['value']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]")


if __name__ == "__main__":
    main()
