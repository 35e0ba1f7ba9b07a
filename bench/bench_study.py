"""Does the study find a config that generalises, and does TPE beat random search at equal budget?

Runs two studies with the same search space, budget, parallelism and seed on one embedded
server (the packaged Gemma 3 270M on CPU unless --server-url is given): one proposed by Optuna's
TPE (the default offline proposer), one by random search. For each it prints the best dev config
and, on the held-out test split, that config's accuracy against the default config's (the
baseline trial every study starts with), with 95% Wilson intervals and the paired difference.
Then it says which search found the better config, by the paired test difference of the two
bests (the test split is read only here, never by the studies' decisions).

Two searches, each a question a researcher would ask with a few CPU hours:
- `--search rl` (default): short trials from scratch learn nothing measurable on a CPU (the
  base model scores 0 on unseen domains, and 8 SFT steps at lr 5e-4 did not change that), so
  the run first trains one shared SFT warm-up and both studies search the RL and reward
  settings of trials that start from it (`init_checkpoint`).
- `--search sft`: short SFT trials from the base model, searching the learning rate, Adam's
  beta2 and the LoRA rank around the package defaults.

    python bench/bench_study.py --quick          # minutes: 3 tiny trials each
    python bench/bench_study.py                  # 6 trials each + re-runs, 2 in parallel
    python bench/bench_study.py --search sft
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "datasets")]
os.environ.setdefault("TINKER_TELEMETRY", "0")

from autoresearch.evaluation.stats import Estimate, paired_difference  # noqa: E402
from autoresearch.rl.config import TrialConfig  # noqa: E402
from autoresearch.rl.trial import run_trial  # noqa: E402
from autoresearch.study.decisions import paired_items  # noqa: E402
from autoresearch.study.runner import StudyOutcome, run_study  # noqa: E402
from autoresearch.study.spec import Study  # noqa: E402

RL_SPACE = {
    "rl.adam.learning_rate": {"low": 1e-5, "high": 1e-3, "log": True},
    "rl.temperature": {"low": 0.7, "high": 1.2},
    "rl.advantage": {"choices": ["mean", "zscore"]},
    "reward.weights.executes": {"low": 0.0, "high": 0.3},
}
SFT_SPACE = {
    "sft.adam.learning_rate": {"low": 1e-4, "high": 5e-3, "log": True},
    "sft.adam.beta2": {"low": 0.9, "high": 0.999},
    "lora_rank": {"choices": [8, 16, 32]},
}
QUICK_SPACE = {"sft.adam.learning_rate": {"low": 1e-4, "high": 3e-3, "log": True}, **RL_SPACE}
EVAL = {"every": 0, "dev_tasks": 48, "test_tasks": 100, "max_tokens": 64}


def warmup_trial() -> dict:
    """The shared SFT warm-up (the learning benchmark's: 30 steps of 8 gold queries)."""
    return {"name": "sft-warmup", "sft": {"steps": 30, "batch_size": 8,
                                          "adam": {"learning_rate": 5e-4}},
            "rl": {"steps": 0}, "eval": {**EVAL, "test_tasks": 0}, "checkpoint_every": 10}


def base_trial(search: str, init_checkpoint: str | None) -> dict:
    """The default config each study starts from: the package defaults, short budgets."""
    if search == "quick":
        return {"sft": {"steps": 2, "batch_size": 4}, "rl": {"steps": 1, "prompts_per_step": 2,
                "group_size": 2, "max_tokens": 32}, "lora_rank": 8,
                "eval": {"every": 0, "dev_tasks": 8, "test_tasks": 16, "max_tokens": 32},
                "checkpoint_every": 2}
    if search == "sft":  # short supervised trials from the base model
        return {"sft": {"steps": 8, "batch_size": 8}, "rl": {"steps": 0}, "eval": EVAL,
                "checkpoint_every": 4}
    return {"init_checkpoint": init_checkpoint, "sft": {"steps": 0},
            "rl": {"steps": 6, "prompts_per_step": 4, "group_size": 4, "max_tokens": 64},
            "eval": EVAL, "checkpoint_every": 3}


SPACES = {"quick": QUICK_SPACE, "rl": RL_SPACE, "sft": SFT_SPACE}


def paired(a: dict | None, b: dict | None, split: str) -> Estimate | None:
    if not a or not b or not a.get(split) or not b.get(split):
        return None
    x, y = paired_items(a[split]["verdicts"], b[split]["verdicts"])
    return paired_difference(x, y)


def acc(row: dict | None, split: str) -> str:
    if not row or row.get(f"{split}_accuracy") is None:
        return "n/a"
    return (f"{row[f'{split}_accuracy']:.3f} [{row[f'{split}_low']:.3f}, "
            f"{row[f'{split}_high']:.3f}] (n={row[f'{split}_n']})")


def diff(est: Estimate | None) -> str:
    return "n/a" if est is None else f"{est.value:+.3f} [{est.low:+.3f}, {est.high:+.3f}]"


def describe(label: str, outcome: StudyOutcome, seconds: float) -> dict:
    best, base = outcome.best, outcome.baseline
    gain = paired(best, base, "test") if best and base and best["id"] != base["id"] else None
    print(f"\n== {label} ({seconds:.0f}s) ==")
    print(f"best dev config: {best['id'] if best else '-'} "
          f"{json.dumps(best['changes']) if best else ''}")
    print(f"  dev  accuracy: best {acc(best, 'dev')}  default {acc(base, 'dev')}")
    print(f"  test accuracy: best {acc(best, 'test')}  default {acc(base, 'test')}")
    if best and base and best["id"] == base["id"]:
        print("  no change beat the default config beyond noise on dev: best = default")
    else:
        print(f"  test gain over default (paired, 95% CI): {diff(gain)}")
    return {"study": label, "seconds": round(seconds, 1), "report": str(outcome.report),
            "best": best and {k: best[k] for k in ("id", "changes", "dev_accuracy", "dev_low",
                                                   "dev_high", "test_accuracy", "test_low",
                                                   "test_high")},
            "default_test": base and base["test_accuracy"],
            "test_gain": gain and gain.as_dict()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 tiny trials per study")
    parser.add_argument("--search", choices=["rl", "sft"], default="rl",
                        help="rl: RL and reward settings on a shared SFT warm-up (default); "
                             "sft: the settings of short SFT trials from the base model")
    parser.add_argument("--trials", type=int, default=None)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--server-url", default=None)
    parser.add_argument("--out", type=Path, default=Path("runs/bench-study"))
    parser.add_argument("--resume", type=Path, default=None,
                        help="an interrupted run's directory (OUT/<stamp>): its studies resume")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger("tinker").setLevel(logging.ERROR)  # "try again" long-polls are normal
    logging.getLogger("autoresearch.study.runner").setLevel(logging.INFO)
    search = "quick" if args.quick else args.search
    trials = args.trials or (3 if args.quick else 6)
    budget = {"max_trials": trials, "confirm_seeds": 1, "max_confirm_trials": 2}
    root = args.resume or args.out / time.strftime("%Y%m%d-%H%M%S")
    results = []
    with contextlib.ExitStack() as stack:
        url = args.server_url or os.environ.get("TINKER_BASE_URL")
        if url is None:
            from server.entrypoints.runtime import ServerConfig, ServerThread

            server = ServerThread(ServerConfig(port=0, data_dir=root / "server-data",
                                               api_keys=""))
            url = stack.enter_context(server).url
        init = None
        if search == "rl":
            started = time.time()
            warm = run_trial(TrialConfig.model_validate(warmup_trial()), root / "warmup", url,
                             os.environ.get("TINKER_API_KEY") or "tml-local")
            init = warm.checkpoint
            dev = warm.dev["accuracy"] if warm.dev else None
            results.append({"warmup": init, "seconds": round(time.time() - started, 1),
                            "dev": dev})
            print(f"shared SFT warm-up: {init} ({time.time() - started:.0f}s); dev accuracy "
                  f"{dev['value']:.3f} [{dev['low']:.3f}, {dev['high']:.3f}] (n={dev['n']})"
                  if dev else f"shared SFT warm-up: {init}")
        outcomes = {}
        for kind in ("optuna", "random"):
            study = Study(name=f"bench-{kind}", seed=args.seed, server_url=url,
                          base_trial=base_trial(search, init), search_space=SPACES[search],
                          budget=budget,
                          proposer={"kind": kind, "startup_trials": 2},
                          executor={"max_parallel_trials": args.parallel})
            started = time.time()
            outcomes[kind] = run_study(study, root / kind)
            results.append(describe(f"{kind} ({'TPE' if kind == 'optuna' else 'random search'})",
                                    outcomes[kind], time.time() - started))
    tpe, rnd = outcomes["optuna"].best, outcomes["random"].best
    head = paired(tpe, rnd, "test")
    print(f"\n== TPE vs random search, same budget ({trials} trials, {args.parallel} parallel) ==")
    print(f"best dev: TPE {acc(tpe, 'dev')} vs random {acc(rnd, 'dev')}")
    print(f"test, TPE best - random best (paired, 95% CI): {diff(head)}")
    if head is None or head.n == 0:
        verdict = "no comparison possible"
    elif head.low > 0:
        verdict = "TPE found the better config"
    elif head.high < 0:
        verdict = "random search found the better config"
    else:
        verdict = "no measurable difference between the configs the two searches found"
    print(verdict)
    summary = {"search": search, "trials": trials, "parallel": args.parallel,
               "studies": results, "tpe_minus_random_test": head and head.as_dict(),
               "verdict": verdict}
    (root / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"\nsummary: {root / 'summary.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
