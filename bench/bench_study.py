"""Do studies decide correctly on the embedded Gemma? Positive and null controls, TPE vs random.

Every study here declares the same warm-up (SFT on gold queries); the first trains it, the
others reuse it from the bench's warm-up cache, so all trials fork from one checkpoint. Each
study runs on its own embedded server (the packaged Gemma 3 270M on CPU), one after another:

(a) Positive control (`pos-tpe`): the base config is deliberately weak in one searched dimension
    (`--weak`, default the RL learning rate, 100x above the one that works). The study must keep
    a change whose paired dev gain excludes zero, and that change must still hold on the test
    split (paired interval of best - base excluding zero), read once, for the final best only.
(b) Null control (`null`): on the healthy base config (the weak dimension at its good value),
    the proposer proposes that config again under other seeds (with a no-op change, so the
    study sees a new candidate). Nothing may be kept.
(c) TPE vs random search (`pos-random`): the positive-control study again, proposed by random
    search on the same budget. Reported: each study's best dev gain over the base, and the
    paired test difference of the two bests, with 95% intervals. The exploration trials it
    shares with (a) (the same config under the same seed: the baseline, the seeded start-up
    samples) are replayed from the run's trial cache, not trained again (`--no-trial-cache`
    trains them); confirmation re-runs, seed-bank runs and test checks are evidence and always
    run fresh.

Decisions are the studies' own (dev split only, their keep rule, pruning on a fixed dev subset).
The test split is read once per study, by its final check of the best config against the base.

    python bench/bench_study.py                    # the full design (about 70 min, 2 quiet cores)
    python bench/bench_study.py --smoke            # the same pipeline, tiny sizes (minutes)
    python bench/bench_study.py --resume runs/bench-study/<stamp>   # finish an interrupted run

Resumable: each study resumes from its journal, the warm-up comes from the cache, and a part
already summarised is not run again. Results: <run>/summary.json and each study's report.md.
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
sys.path[:0] = [str(ROOT), str(ROOT / "datasets")]
os.environ.setdefault("TINKER_TELEMETRY", "0")

from autoresearch.evaluation.stats import Estimate, paired_difference  # noqa: E402
from autoresearch.rl.record import TrialRecord  # noqa: E402
from autoresearch.study.decisions import paired_items  # noqa: E402
from autoresearch.study.journal import Journal  # noqa: E402
from autoresearch.study.proposers import Context, Proposal, ProposalBatch  # noqa: E402
from autoresearch.study.runner import run_study  # noqa: E402
from autoresearch.study.spec import Study  # noqa: E402

NO_OP = {"rl.max_train_tokens": 10**12}
"""A change that changes nothing a trial does (the token cap is never reached): it only makes a
re-proposed base config a new candidate in the study's eyes."""

DESIGNS: dict[str, dict[str, Any]] = {
    # About 70 minutes of this 2-core machine when quiet (4130 s measured). Measured step costs
    # there: an SFT step of 8 gold queries about 19 s, a GRPO step of 4 x 4 about 35 s, greedy
    # evaluation about 1.2 s per task; trials side by side share the two cores, so time adds up
    # over trials.
    "full": {
        # The warm-up does the learning a 270M model can do on this budget (dev 0 -> about
        # 0.1); trials are short GRPO runs forked from it, so a base config that wrecks what
        # the warm-up taught is a weakness 96 paired dev tasks can see.
        "warmup": {"sft": {"steps": 16, "batch_size": 8, "adam": {"learning_rate": 5e-4}},
                   "checkpoint_every": 8},
        "base": {"sft": {"steps": 0},
                 "rl": {"steps": 3, "prompts_per_step": 4, "group_size": 4, "max_tokens": 64,
                        "adam": {"learning_rate": 1e-4}},
                 # All 200 test tasks: the repaired model scores a few points on the harder
                 # test domains, and 100 tasks cannot tell 3 wins and 0 losses from zero.
                 "eval": {"every": 0, "dev_tasks": 96, "test_tasks": 200, "max_tokens": 64},
                 "checkpoint_every": 1},
        "pruning": {"kind": "successive_halving", "every": 2, "dev_tasks": 32, "min_resource": 2,
                    "reduction_factor": 2, "margin_z": 1.0},
        "budget": {"max_trials": 4, "confirm_seeds": 1, "max_confirm_trials": 2},
        "null_trials": 2,
        "parallel": 2,
    },
    # The same pipeline at toy sizes: proves it runs end to end, decides nothing.
    "smoke": {
        "warmup": {"sft": {"steps": 2, "batch_size": 2, "adam": {"learning_rate": 5e-4}},
                   "checkpoint_every": 1},
        "base": {"sft": {"steps": 0},
                 "rl": {"steps": 2, "prompts_per_step": 2, "group_size": 2, "max_tokens": 16,
                        "adam": {"learning_rate": 1e-4}},
                 "eval": {"every": 0, "dev_tasks": 4, "test_tasks": 4, "max_tokens": 16},
                 "checkpoint_every": 1},
        "pruning": {"kind": "successive_halving", "every": 1, "dev_tasks": 2, "min_resource": 1,
                    "reduction_factor": 2, "margin_z": 1.0},
        "budget": {"max_trials": 2, "confirm_seeds": 1, "max_confirm_trials": 2},
        "null_trials": 1,
        "parallel": 2,
    },
}

WEAK = {
    # dimension: (the weak value the positive control's base config gets, the search space)
    # The RL learning rate 100x too high: a few Adam steps of that size undo the warm-up.
    "rl-lr-high": ({"rl.adam.learning_rate": 1e-2},
                   {"rl.adam.learning_rate": {"low": 1e-5, "high": 1e-2, "log": True},
                    "rl.temperature": {"low": 0.7, "high": 1.2}}),
    # Ten times too low (the design first considered): on trials this short RL barely moves
    # the model at any learning rate, so this control has almost no effect to find.
    "rl-lr-low": ({"rl.adam.learning_rate": 1e-5},
                  {"rl.adam.learning_rate": {"low": 1e-6, "high": 1e-3, "log": True},
                   "rl.temperature": {"low": 0.7, "high": 1.2}}),
}


NULL_SPACE = {"seed": {"choices": list(range(100, 1100))},
              "rl.max_train_tokens": {"choices": [NO_OP["rl.max_train_tokens"]]}}
"""What the null control's proposals change, declared in its search space (a study rejects a
proposal outside its space)."""


class NullProposer:
    """Proposes the base config again, each time under a new seed (plus a no-op change)."""

    name = "null-control"

    def propose(self, context: Context, n: int) -> ProposalBatch:
        done = len(context.explored())
        proposals = [Proposal({**NO_OP, "seed": 100 + done + k},
                              "the base config again under another seed: must not be kept")
                     for k in range(n)]
        return ProposalBatch(self.name, "sampled", proposals)


def _base_trial(design: dict[str, Any], weak: str | None) -> dict[str, Any]:
    """The design's base trial; with `weak`, one dimension set to its deliberately bad value."""
    base = json.loads(json.dumps(design["base"]))
    for dotted, value in (WEAK[weak][0] if weak else {}).items():
        node = base
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return base


def make_study(name: str, design: dict[str, Any], weak: str, cache: Path, proposer: str,
               seed: int, model: str | None, healthy: bool = False,
               trials: Path | None = None, extra_space: dict[str, Any] | None = None) -> Study:
    space = {**WEAK[weak][1], **(extra_space or {})}
    base = _base_trial(design, None if healthy else weak)
    if model is not None:  # another embedded model: the trials must name it
        base.update(base_model=model, tokenizer=model)
    return Study.model_validate({
        "name": name, "seed": seed, "embedded_model": model, "base_trial": base,
        "warmup": {**design["warmup"], "cache_dir": str(cache)},
        "pruning": design["pruning"], "search_space": space, "budget": design["budget"],
        "trial_cache": None if trials is None else {"dir": str(trials)},
        "proposer": {"kind": proposer, "startup_trials": 2},
        "executor": {"max_parallel_trials": design["parallel"]}})


def paired(a: dict | None, b: dict | None, split: str) -> Estimate | None:
    if not a or not b or not a.get(split) or not b.get(split):
        return None
    x, y = paired_items(a[split]["verdicts"], b[split]["verdicts"])
    return paired_difference(x, y) if x else None


def fmt(est: Estimate | None) -> str:
    return "n/a" if est is None else f"{est.value:+.3f} [{est.low:+.3f}, {est.high:+.3f}]"


def acc(row: dict | None, split: str) -> str:
    if not row or row.get(f"{split}_accuracy") is None:
        return "n/a"
    return (f"{row[f'{split}_accuracy']:.3f} [{row[f'{split}_low']:.3f}, "
            f"{row[f'{split}_high']:.3f}] (n={row[f'{split}_n']})")


def summarise(label: str, directory: Path, seconds: float) -> dict[str, Any]:
    """What a finished study decided, from its journal; the test split is read here only."""
    journal = Journal(directory, read_only=True)
    trials = journal.trials()
    by_id = {t["id"]: t for t in trials}
    baseline = next((t for t in trials if t["role"] == "baseline"), None)
    best = by_id.get(journal.study()["best_trial"] or "")
    kept = [d for d in journal.decisions() if d["verdict"] == "kept" and d["incumbent"]]
    warm = by_id.get("warmup")
    dev_gain = paired(best, baseline, "dev") if best is not baseline else None
    test_gain = paired(best, baseline, "test") if best is not baseline else None
    print(f"\n== {label} ({seconds:.0f} s) ==")
    if warm:
        print(f"warm-up: {warm['status']}, {(warm['rationale'] or '')[:100]}")
    for t in trials:
        if t["role"] == "warmup":
            continue
        print(f"  {t['id']} {t['role']:<8} {t['status']:<9} dev {acc(t, 'dev'):<28} "
              f"{json.dumps(t['changes'] or {})[:70]}")
    for d in journal.decisions():
        if d["incumbent"]:
            est = Estimate(d["difference"] or 0, d["low"] or 0, d["high"] or 0, d["n"] or 0)
            print(f"  decision {d['candidate']} vs {d['incumbent']} ({d['rule']}): "
                  f"{fmt(est)} -> {d['verdict']} {d['note'] or ''}")
    pruned = [t["id"] for t in trials if t["status"] == "pruned"]
    replayed = [t["id"] for t in trials if _replayed(directory / t["directory"])]
    print(f"  pruned: {pruned or 'none'}; replayed from the trial cache: {replayed or 'none'}")
    print(f"  best: {best['id'] if best else '-'}; dev gain over base {fmt(dev_gain)}; "
          f"test gain over base (read once, here) {fmt(test_gain)}")
    return {"study": label, "seconds": round(seconds, 1), "directory": str(directory),
            "trials": len([t for t in trials if t["role"] != "warmup"]), "pruned": pruned,
            "replayed": replayed,
            "kept": [d["candidate"] for d in kept],
            "best": best and {k: best[k] for k in ("id", "changes", "dev_accuracy",
                                                   "test_accuracy")},
            "dev_gain": dev_gain and dev_gain.as_dict(),
            "test_gain": test_gain and test_gain.as_dict(),
            "warmup_reused": bool(warm and "Reused" in (warm["rationale"] or ""))}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: minutes, no verdict")
    parser.add_argument("--weak", choices=sorted(WEAK), default="rl-lr-high",
                        help="the dimension the positive control's base config gets wrong")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model", default=None,
                        help="embedded server model (default: the packaged Gemma 3 270M)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-study"))
    parser.add_argument("--no-trial-cache", action="store_true",
                        help="run every trial, even one an earlier study here already ran")
    parser.add_argument("--resume", type=Path, default=None,
                        help="an interrupted run's directory: its studies resume")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger("tinker").setLevel(logging.ERROR)
    for name in ("autoresearch.study.runner", "autoresearch.study.warmup"):
        logging.getLogger(name).setLevel(logging.INFO)
    design = DESIGNS["smoke" if args.smoke else "full"]
    root = args.resume or args.out / time.strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True, exist_ok=True)
    cache = root / "warmups"
    summary_path = root / "summary.json"
    summary: dict[str, Any] = (json.loads(summary_path.read_text()) if summary_path.exists()
                               else {"design": "smoke" if args.smoke else "full",
                                     "weak": args.weak, "parts": {}})
    started = time.time()
    parts = [("pos-tpe", "optuna", None), ("null", "optuna", NullProposer()),
             ("pos-random", "random", None)]
    for name, kind, proposer in parts:
        if name in summary["parts"]:
            print(f"{name}: already done ({summary['parts'][name]['seconds']:.0f} s)")
            continue
        # The null control re-proposes the healthy base: seed noise on a model that works.
        study = make_study(name, design, args.weak, cache, kind, args.seed, args.model,
                           healthy=name == "null",
                           trials=None if args.no_trial_cache else root / "trials",
                           extra_space=NULL_SPACE if name == "null" else None)
        if name == "null":
            study = study.model_copy(update={"budget": study.budget.model_copy(
                update={"max_trials": 1 + design["null_trials"]})})
        t0 = time.time()
        run_study(study, root / name, proposer=proposer)
        summary["parts"][name] = summarise(name, root / name, time.time() - t0)
        summary_path.write_text(json.dumps(summary, indent=2))

    pos, null, rnd = (summary["parts"][k] for k in ("pos-tpe", "null", "pos-random"))
    gain = pos["test_gain"]
    positive_ok = bool(pos["kept"] and pos["dev_gain"] and pos["dev_gain"]["low"] > 0
                       and gain and gain["low"] > 0)
    null_ok = not null["kept"]
    tpe_best = _best_row(root / "pos-tpe")
    rnd_best = _best_row(root / "pos-random")
    head = paired(tpe_best, rnd_best, "test")
    print("\n== verdicts ==")
    print(f"(a) positive control ({args.weak} weak in the base): "
          f"{'PASS' if positive_ok else 'FAIL'}: kept {pos['kept'] or 'nothing'}; dev gain "
          f"{fmt(_est(pos['dev_gain']))}; test gain {fmt(_est(gain))}")
    print(f"(b) null control (base config under other seeds): {'PASS' if null_ok else 'FAIL'}: "
          f"kept {null['kept'] or 'nothing'}")
    print(f"(c) TPE vs random search, same budget: best dev gain over base: TPE "
          f"{fmt(_est(pos['dev_gain']))}, random {fmt(_est(rnd['dev_gain']))}; test, TPE best - "
          f"random best (paired): {fmt(head)}")
    summary.update({"positive_control_pass": positive_ok, "null_control_pass": null_ok,
                    "tpe_minus_random_test": head and head.as_dict(),
                    "seconds_this_invocation": round(time.time() - started, 1)})
    if args.smoke:
        summary["note"] = "smoke sizes: the pipeline ran end to end; the verdicts mean nothing"
        print("smoke sizes: the pipeline ran end to end; these verdicts mean nothing")
    summary_path.write_text(json.dumps(summary, indent=2))
    print(f"\nsummary: {summary_path}")
    return 0


def _replayed(directory: Path) -> bool:
    """Whether the trial in `directory` was replayed from the trial cache, not trained."""
    return directory.is_dir() and any(
        e.get("cache_key") for e in TrialRecord(directory).of_type("event"))


def _best_row(directory: Path) -> dict | None:
    journal = Journal(directory, read_only=True)
    best = journal.study()["best_trial"]
    return journal.trial(best) if best else None


def _est(d: dict | None) -> Estimate | None:
    return None if d is None else Estimate(d["value"], d["low"], d["high"], d["n"])


if __name__ == "__main__":
    sys.exit(main())
