"""Does a model trained here write SQL for databases it never saw? SFT then GRPO on the
multi-table corpus, scored on dev, test and the hand-written transfer split before and after
each stage.

Runs one trial against an in-process server: the base model is scored, then again after the SFT
warm-up on gold queries, then after GRPO, each greedily on the same tasks: the fixed dev and
test subsets (databases of themes never trained on) and the transfer split (three hand-written
application databases no corpus has). Prompts show each schema as CREATE TABLE statements with
keys, capped by the schema-linking truncation rule. Prints execution accuracy and the executing
rate with 95% Wilson intervals per split and stage, and the paired stage-to-stage differences.

    python -m bench.bench_transfer_learning                  # Gemma 3 270M on CPU, < 60 min
    python -m bench.bench_transfer_learning --quick          # the same pipeline, tiny sizes
    python -m bench.bench_transfer_learning --model google/gemma-3-1b-pt --device cuda \\
        --sft-steps 120 --rl-steps 60 --prompts 16 --group 8   # the recipe on a GPU

Resumable: rerun with the same `--out` and the trial resumes from its last checkpoint.
`--rescore` scores a finished run's weights (the base model, after SFT, after RL) again without
training, greedily on every split, or on those `--splits` and `--stages` name: the full table of
a run trained with `--train-only`, or the transfer rows again when the split's text has changed.
`--vote K` (after a run, or with `--rescore`) scores the SFT and final weights on the run's own
tasks of every split once more, answering each question with the result most of its greedy and
K sampled queries return on its database (execution-based self-consistency, the decoding
SLM-SQL's figures use), beside the greedy answers and the paired difference. `--snap` (alone or
with `--vote`) runs every answer with the table and column names its database lacks snapped
onto the closest ones it has (`rewards.snap`), beside the greedy queries as written;
`--snap-values` likewise snaps the strings an answer compares a column with onto the values that
column holds (`rewards.snap_values`), alone or with `--snap`. `--train-only` trains with
evaluation off, so that the training is timed alone; `--rescore` then scores its weights on as
many tasks of each split as `--dev-tasks`, `--test-tasks` and `--transfer-tasks` say.
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

import tinker
import yaml

from autoresearch.evaluation.stats import Estimate, paired_difference, wilson
from autoresearch.rl.config import TrialConfig
from autoresearch.rl.record import CONFIG_FILE, TrialRecord, step_seconds
from autoresearch.rl.trial import run_trial
from rewards import RewardPool
from server.entrypoints.runtime import ServerConfig, ServerThread

SPLITS = ("dev", "test", "transfer")
API_KEY = "tml-bench"
STAGES = (("base", "base model"), ("sft", "after SFT"), ("final", "after SFT + RL"))


def trial_config(args: argparse.Namespace) -> TrialConfig:
    quick = args.quick
    evaluation = {"every": 0, "dev_tasks": 4 if quick else args.dev_tasks,
                  "test_tasks": 4 if quick else args.test_tasks,
                  "transfer_tasks": 6 if quick else args.transfer_tasks,
                  "max_tokens": args.max_tokens, "baseline": True, "start": True}
    if args.train_only:  # evaluation off: the training timed alone
        evaluation.update(dev_tasks=0, test_tasks=0, transfer_tasks=0, baseline=False,
                          start=False)
    config = TrialConfig.model_validate({
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
        "eval": evaluation,
        "reward": {"weights": dict(args.reward_weight)},
        "checkpoint_every": 5,
    })
    return config.with_changes({f"rl.{k}": v for k, v in args.rl_set}) if args.rl_set else config


def _setting(text: str) -> tuple[str, object]:
    """`NAME=VALUE` with the value read as YAML (true, 12, signal)."""
    import yaml

    name, _, value = text.partition("=")
    return name, yaml.safe_load(value)


def _weight(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    return name, float(value)


def _names(text: str, allowed: tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    unknown = set(names) - set(allowed)
    if unknown or not names:
        raise SystemExit(f"expected some of {', '.join(allowed)}, got {text!r}")
    return names


def _rate(successes: int, n: int) -> str:
    est = wilson(successes, n)
    return f"{est.value:.3f} [{est.low:.3f}, {est.high:.3f}]"


def _paired(a: dict[str, bool], b: dict[str, bool]) -> Estimate:
    """a - b over the same tasks (the keys of `a`), with its paired 95% interval."""
    ids = sorted(a)
    return paired_difference([float(a[i]) for i in ids], [float(b[i]) for i in ids])


HEADER = ["| split | stage | n | correct (EX) [95% CI] | executes [95% CI] |",
          "|---|---|---|---|---|"]


def _row(split: str, label: str, n: int, correct: int, executes: int) -> str:
    return f"| {split} | {label} | {n} | {_rate(correct, n)} | {_rate(executes, n)} |"


def _counts(e: dict[str, Any]) -> dict[str, int]:
    """n, correct and executing answers of an eval entry."""
    n = len(e["verdicts"])
    return {"n": n, "correct": sum(bool(v) for v in e["verdicts"].values()),
            "executes": round(e["execute_rate"] * n)}


def table(record: TrialRecord) -> tuple[str, dict[str, Any]]:
    """The markdown table of every split and stage of a trained run, and the numbers behind
    it."""
    return stage_table({(e["split"], "base" if e["stage"] == "start" else e["stage"]): e
                        for e in record.of_type("eval")})


def stage_table(evals: dict[tuple[str, str], dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """Rows per split and stage (base, sft, final) with Wilson intervals, and the paired
    differences between the stages scored on the same tasks."""
    lines = list(HEADER)
    numbers: dict[str, Any] = {}
    for split in SPLITS:
        for stage, label in STAGES:
            e = evals.get((split, stage))
            if e is None:
                continue
            numbers[f"{split}/{stage}"] = counts = _counts(e)
            lines.append(_row(split, label, **counts))
        for (a, b) in (("sft", "base"), ("final", "sft"), ("final", "base")):
            ea, eb = evals.get((split, a)), evals.get((split, b))
            if ea is None or eb is None:
                continue
            d = _paired(ea["verdicts"], eb["verdicts"])
            numbers[f"{split}/{a}-{b}"] = {"value": d.value, "low": d.low, "high": d.high}
    return "\n".join(lines), numbers


def differences(numbers: dict[str, Any]) -> list[str]:
    """One line per paired stage difference of `stage_table`'s numbers."""
    return [f"{key}: {d['value']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"
            for key, d in numbers.items() if "value" in d]


def untrained_adapter(url: str, config: TrialConfig) -> str:
    """A new adapter of the run's rank, saved: its zero delta leaves the base model's function,
    so the base model is scored on the same trial path as the trained weights (a trial must
    start from a checkpoint or train)."""
    service = tinker.ServiceClient(base_url=url, api_key=API_KEY)
    training = service.create_lora_training_client(
        base_model=config.base_model, rank=config.lora_rank, seed=config.seed,
        train_unembed=config.train_unembed).result()
    return training.save_state("untrained").result().path


def saved_run(out: Path) -> tuple[TrialRecord, TrialConfig]:
    """The record and config of the run a `--out` directory holds."""
    record = TrialRecord(out / "transfer-learning")
    config = TrialConfig.model_validate(yaml.safe_load((record.dir / CONFIG_FILE).read_text()))
    return record, config


def sft_checkpoint(record: TrialRecord, config: TrialConfig) -> str:
    """The path of the run's last SFT checkpoint (after `config.sft.steps` steps)."""
    found = [c["path"] for c in record.of_type("checkpoint")
             if c["phase"] == "sft" and c["step"] == config.sft.steps]
    if not found:
        raise SystemExit(f"{record.dir} holds no finished SFT ({config.sft.steps} steps)")
    return found[0]


def rescore(out: Path, server_config: ServerConfig, vote: int = 0,
            temperature: float = 0.8, stages: tuple[str, ...] = ("base", "sft", "final"),
            splits: tuple[str, ...] = SPLITS, snap: bool = False,
            snap_values: bool = False, tasks: dict[str, int] | None = None) -> str:
    """Score a finished run's weights again, without training: the base model (a new adapter,
    whose zero delta leaves the base model's function), the SFT weights and the final ones.

    Plain (`vote` 0, no `snap`): each of `stages` greedy on each of `splits`, with the paired
    stage differences: the table a run trained with `--train-only` has not scored. A decoding
    pass (`vote` > 0 or `snap`): each answer chosen by execution-based self-consistency over the
    greedy query and `vote` samples and/or run with its names snapped onto the schema, beside
    the answers without it of the same pass and their paired differences (a vote costs about
    `vote` times the sampling). Each split is scored on as many tasks as the run's own config
    says, or `tasks` where it scored none (a run trained with `--train-only`)."""
    record, config = saved_run(out)
    final = record.final()
    if final is None:
        raise SystemExit(f"{out} holds no finished run to rescore")
    sft = sft_checkpoint(record, config)
    decoding = bool(vote or snap or snap_values)
    counts = {split: getattr(config.eval, f"{split}_tasks") or (tasks or {}).get(split, 0)
              for split in SPLITS}
    # What a pass varies names its folder: a finished pass is reused, never mixed up.
    name = "-".join([f"vote-{vote}-t{temperature:g}" if vote else "greedy", *splits]
                    + (["snap"] if snap else []) + (["values"] if snap_values else []))
    evals: dict[tuple[str, str], dict[str, Any]] = {}
    with ServerThread(server_config) as server, RewardPool() as pool:
        weights = {"sft": sft, "final": final["checkpoint"],
                   "base": untrained_adapter(server.url, config) if "base" in stages else None}
        for stage in stages:
            changes: dict[str, Any] = {
                "name": f"{name}-{stage}", "init_checkpoint": weights[stage], "sft.steps": 0,
                "rl.steps": 0, "eval.start": False, "eval.baseline": False,
                "eval.vote": vote, "eval.vote_temperature": temperature,
                "eval.snap_names": snap, "eval.snap_values": snap_values}
            for split in SPLITS:
                changes[f"eval.{split}_tasks"] = counts[split] if split in splits else 0
            run_trial(config.with_changes(changes), out / name / stage, server.url, API_KEY,
                      pool=pool)
            for e in TrialRecord(out / name / stage).of_type("eval"):
                evals[(e["split"], stage)] = e
    if not decoding:
        text, numbers = stage_table(evals)
        return "\n".join([text, "", *differences(numbers)])
    return decoding_table(evals, vote, snap, snap_values)


def snapped_suffix(names: bool, values: bool) -> str:
    """What an answer label adds for snapping: ", names and values snapped", or nothing."""
    what = " and ".join(w for w, on in (("names", names), ("values", values)) if on)
    return f", {what} snapped" if what else ""


def decoding_table(evals: dict[tuple[str, str], dict[str, Any]], vote: int,
                   snap: bool = False, snap_values: bool = False) -> str:
    """Per split and stage: the greedy query as written (with `snap` or `snap_values`), the
    greedy answer, the voted one (with `vote`), then the paired differences between them."""
    lines, diffs = list(HEADER), []
    snapped = snapped_suffix(snap, snap_values)
    snap = bool(snapped)
    for split in SPLITS:
        for stage, label in STAGES:
            e = evals.get((split, stage))
            if e is None:
                continue
            d, n = e["decoding"], len(e["verdicts"])
            if snap:
                lines.append(_row(split, f"{label}, greedy as written", n, d["written_correct"],
                                  round(d["written_execute_rate"] * n)))
            if vote:
                lines.append(_row(split, f"{label}, greedy{snapped}", n, d["greedy_correct"],
                                  round(d["greedy_execute_rate"] * n)))
            chosen = f"vote of {vote + 1}" if vote else "greedy"
            lines.append(_row(split, f"{label}, {chosen}{snapped}", **_counts(e)))
            if snap:
                diff = _paired(e["verdicts"], d["written_verdicts"])
                diffs.append(f"{split} {label}: {chosen}{snapped} - greedy as written "
                             f"{diff.value:+.3f} [{diff.low:+.3f}, {diff.high:+.3f}]; answers "
                             f"snapped {d['snapped']}/{n}")
            if vote:
                diff = _paired(e["verdicts"], d["greedy_verdicts"])
                diffs.append(f"{split} {label}: vote - greedy{snapped} {diff.value:+.3f} "
                             f"[{diff.low:+.3f}, {diff.high:+.3f}]; the greedy query chosen "
                             f"{d['chose_greedy']}/{n}; some candidate right "
                             f"{d['any_correct']}/{n}")
    return "\n".join(lines + [""] + diffs)


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
    parser.add_argument("--rl-set", type=_setting, action="append", default=[],
                        metavar="NAME=VALUE", help="an RL setting, e.g. dynamic_sampling=true, "
                        "prompt_selection=signal, loss_aggregation=token_mean (repeatable)")
    parser.add_argument("--dev-tasks", type=int, default=48)
    parser.add_argument("--test-tasks", type=int, default=48)
    parser.add_argument("--transfer-tasks", type=int, default=150)
    parser.add_argument("--vote", type=int, default=0, metavar="K",
                        help="after the run (or with --rescore), score its SFT and final weights "
                        "again answering by execution-based self-consistency over the greedy "
                        "query and K samples")
    parser.add_argument("--vote-temperature", type=float, default=0.8)
    parser.add_argument("--snap", action="store_true",
                        help="after a run or with --rescore: run every answer with the names "
                             "its database lacks snapped onto the closest ones it has")
    parser.add_argument("--snap-values", action="store_true",
                        help="likewise: run every answer with the strings it compares a column "
                             "with snapped onto the values that column holds")
    parser.add_argument("--train-only", action="store_true",
                        help="train with evaluation off, to time the training alone; score the "
                             "saved weights afterwards with --rescore (the greedy table), "
                             "with --vote or --snap for a decoding pass")
    parser.add_argument("--stages", "--vote-stages", dest="stages", default=None,
                        help="which weights a rescore scores: some of base, sft, final "
                             "(default: all three greedy; sft,final for a decoding pass)")
    parser.add_argument("--splits", "--vote-splits", dest="splits", default=",".join(SPLITS),
                        help="which splits a rescore scores (comma-separated)")
    args = parser.parse_args()
    if args.model and args.base_model == "google/gemma-3-270m":
        args.base_model = args.model
    out = args.out or Path(tempfile.mkdtemp(prefix="bench-transfer-"))
    trial = trial_config(args)
    started = time.time()
    server_config = ServerConfig(port=0, data_dir=out / "server", model=args.model,
                                 device=args.device)
    decoding = bool(args.vote or args.snap or args.snap_values)
    stages = args.stages or ("sft,final" if decoding else "base,sft,final")
    narrowing = (_names(stages, tuple(s for s, _ in STAGES)), _names(args.splits, SPLITS))
    tasks = {"dev": args.dev_tasks, "test": args.test_tasks, "transfer": args.transfer_tasks}
    if args.rescore:
        text = rescore(out, server_config, args.vote, args.vote_temperature, *narrowing,
                       snap=args.snap, snap_values=args.snap_values, tasks=tasks)
        print(f"\nrescored {out} in {time.time() - started:.0f} s; load average "
              f"{os.getloadavg()}\n\n{text}")
        return
    with ServerThread(server_config) as server, RewardPool() as pool:
        run_trial(trial, out / trial.name, server.url, API_KEY, pool=pool)
    wall = time.time() - started
    record = TrialRecord(out / trial.name)
    text, numbers = table(record)
    entries = record.entries()
    steps = [e for e in entries if e["type"] == "step"]
    sft_s = sum(step_seconds(e) for e in steps if e.get("phase") == "sft")
    rl_s = sum(step_seconds(e) for e in steps if e.get("phase") == "rl")
    eval_s = sum(e["seconds"] for e in entries if e["type"] == "eval")
    summary = {"command": "python -m bench.bench_transfer_learning " + " ".join(
                   a for a in sys.argv[1:]),
               "wall_seconds": round(wall), "sft_seconds": round(sft_s),
               "rl_seconds": round(rl_s), "eval_seconds": round(eval_s),
               "load_average": os.getloadavg(), "config": json.loads(trial.model_dump_json()),
               "numbers": numbers}
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"\n{summary['command']}\nwall {wall:.0f} s (SFT {sft_s:.0f} s, RL {rl_s:.0f} s, "
          f"evaluation {eval_s:.0f} s); load average {os.getloadavg()}; out {out}\n")
    print("\n".join([text, *differences(numbers)]))
    if decoding:
        again = time.time()
        text = rescore(out, server_config, args.vote, args.vote_temperature, *narrowing,
                       snap=args.snap, snap_values=args.snap_values, tasks=tasks)
        print(f"\ndecoding pass (vote of {args.vote + 1}, names snapped: {args.snap}, values "
              f"snapped: {args.snap_values}): "
              f"{time.time() - again:.0f} s\n\n{text}")


if __name__ == "__main__":
    main()
