"""Do studies decide correctly on the embedded Gemma? Controls with each run's own luck.

The studies of a part declare the same warm-up (16 SFT steps on gold queries): the first trains
it, the others reuse it from the bench's warm-up cache, so their trials fork from one checkpoint.
Each study runs on its own embedded server (the packaged Gemma 3 270M on CPU), one after
another. The default parts:

`arms`: two configs measured beforehand, as one study that decides nothing: the healthy base
    config (3 GRPO steps of 4 x 4) under `--seeds` seeds (the baseline's own and `--seeds - 1`
    more) and the base with the design's known change (a longer warm-up: the same RL from a
    second declared warm-up of 48 SFT steps, `warmup: long`) under `--seeds` seeds of its own,
    every run scored on the same dev tasks. From these runs:
    (a) A/A: the base arm is a seed bank of one healthy config; it is resampled into
        `--pseudo` pseudo-studies (a baseline and three candidates that are all this config,
        each run a different bank run) decided by the runner's own code
        (`confirmation.next_decision`, the shipped keep rule): every keep is a false keep.
        Printed: the false-keep rate with its Wilson 95% interval.
    (b) power: the same pseudo-studies with one candidate's runs spiked (+5 and +10 points:
        a fixed set of tasks turned right in each of its runs); how often it ends as the best.
    (c, first half) the change against the base over runs (Student t, pooled run-to-run
        variance): known to help when this interval excludes zero.
`known`: (c, second half) a real study of the healthy base offered the known change and a
    decoy (the base under another seed), with the shipped keep rule (first look, seed bank of
    3, one confirmation on 4 fresh seeds a side at alpha 0.05) and its final test check (the
    kept config's confirmation runs against the base config's runs, read once on 100 test
    tasks, an interval over runs). It passes when it keeps the change and the change holds on
    test.

The long warm-up begins with the short one's 16 steps (same seed, batches and constant
learning rate), so the study trains it by continuing the short one from its final state: 32
steps, not 48, with the same bits (`warmup.continues`).

The earlier controls stay available with `--parts pos-tpe null pos-random`: a base config with
its RL learning rate 100x too high, repaired by TPE and by random search, and the healthy base
re-proposed under other seeds (see docs/studies.md for what they showed).

Decisions are the studies' own (dev split only); each study reads the test split once.

    python -m bench.bench_study                    # arms and known (69 min, 2 quiet fp32 cores)
    python -m bench.bench_study --smoke            # the same pipeline, tiny sizes (minutes)
    python -m bench.bench_study --resume runs/bench-study/<stamp>   # finish an interrupted run
    python -m bench.bench_study --resume runs/bench-study/<stamp> --redecide --parts arms
        # the arms' pseudo-studies and keep rate decided again by the current keep rule

Resumable: each study resumes from its journal, the warm-up comes from the cache, and a part
already summarised is not run again. Results: <run>/summary.json and each study's report.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TINKER_TELEMETRY", "0")

import numpy as np

from autoresearch.evaluation.stats import (
    Estimate,
    RunTest,
    paired_difference,
    run_level_test,
)
from autoresearch.rl.record import TrialRecord
from autoresearch.study.confirmation import test_verdicts
from autoresearch.study.decisions import paired_items
from autoresearch.study.journal import Journal
from autoresearch.study.proposers import Context, Proposal, ProposalBatch
from autoresearch.study.runner import run_study
from autoresearch.study.space import flatten
from autoresearch.study.spec import Study
from bench.bench_keep_rule import new_study
from bench.bench_seed_bank import (
    BankWorld,
    bank_runs,
    candidates_for,
    pseudo_studies,
    rate,
    take,
)

NO_OP = {"rl.max_train_tokens": 10**12}
"""A change that changes nothing a trial does (the token cap is never reached): it only makes a
re-proposed base config a new candidate in the study's eyes."""

DESIGNS: dict[str, dict[str, Any]] = {
    # 69 minutes on 2 quiet fp32 cores (4118 s measured: the two warm-ups 733 s, the 48-step
    # one continuing the 16-step one; the arms' 20 runs 1748 s; the known study 1592 s, its
    # test check 540 s of it). 83 minutes (4997 s) before the continuation, the known study's
    # pruning-free rounds and its 4 seeds a side. In that run an SFT step of 8 gold queries
    # took 12-13 s, greedy evaluation 0.45-0.6 s per task; trials side by side share the two
    # cores, so time adds up over trials.
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
        # The arms and known parts fork from the same warm-up as the earlier controls: from it,
        # 16 more SFT steps inside the trial gained +4.6 points over runs (p 0.0008, 10 seeds
        # per arm, old corpus) at a run SD under 3 points, the largest effect for its noise
        # measured here. The demo's RL recipe from the demo's 32-step warm-up gained +4.1 at a
        # run SD up to 5 points (p 0.022): too noisy for a study's confirmation to find.
        # That change, 16 SFT steps inside each trial, cost each arm-B run four arm-A runs, so
        # its arms alone overran the hour (110 minutes in all, +5.9 points at a run SD of 4).
        # The real change known to help is now a longer warm-up as a checkpoint: the study
        # declares a second warm-up of 48 SFT steps (trained once, cached) and the change
        # starts the base's RL from it instead of from the 16-step one, so an arm-B run costs
        # what an arm-A run does; the arms part measures it beforehand on 10 seeds a side.
        "warmup_choices": {"long": {"sft": {"steps": 48, "batch_size": 8,
                                            "adam": {"learning_rate": 5e-4}},
                                    "checkpoint_every": 8}},
        "known_change": {"warmup": "long"},
        "known_label": "a longer warm-up: RL from the 48-step SFT checkpoint, not the 16-step one",
        # The known study's confirmation: 4 fresh seeds a side (with the seed bank's 3 runs, 8
        # run-to-run df). Resampled from the real arms, a study of this design keeps the
        # longer warm-up's +14.3 points 80% of the time, with 4 seeds a side as with 5: the
        # candidate's one first-look run is the limit, not the confirmation. (The in-trial
        # SFT's +5.9 it kept 45% at 5 seeds, 37% when first looks compared with the
        # baseline's one run, where 3 seeds a side kept +4.6 one time in seven.) The fifth
        # seed a side cost 2 runs and 2 test reads, about 5 minutes. Its test check reads 100
        # tasks for each of its 11 runs (4 of the change, 7 of the base): runs, not tasks,
        # limit its precision, and by estimate 200 would add about 9 minutes.
        "known_confirm_seeds": 4,
        "known_test_tasks": 100,
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
        "warmup_choices": {"long": {"sft": {"steps": 3, "batch_size": 2,
                                            "adam": {"learning_rate": 5e-4}},
                                    "checkpoint_every": 1}},
        "known_change": {"warmup": "long"},
        "known_label": "a longer warm-up (3 SFT steps, not 2)",
        "known_confirm_seeds": 1,
        "known_test_tasks": 4,
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


ARM_SEED = 3000
"""Seeds of the arms part's runs (other than the baseline's own seed)."""


def _arm_jobs(change: dict[str, Any], seeds: int) -> list[tuple[dict[str, Any], str]]:
    """Both arms, seed by seed, interleaved so that they share the server's batches alike: the
    baseline is the base arm's first run, so the base arm gets `seeds - 1` more."""
    jobs = []
    for i in range(seeds):
        jobs.append(({"seed": ARM_SEED + i, **change}, "arm B: the change"))
        if i < seeds - 1:
            jobs.append(({"seed": ARM_SEED + i}, "arm A: the base config"))
    return jobs


class ListProposer:
    """Proposes a fixed list of changes, in order (the study is the measuring instrument)."""

    name = "fixed-list"

    def __init__(self, jobs: list[tuple[dict[str, Any], str]]) -> None:
        self.jobs = jobs

    def propose(self, context: Context, n: int) -> ProposalBatch:
        done = len(context.explored()) - 1  # the baseline is not proposed
        return ProposalBatch(self.name, "sampled", [
            Proposal(changes, why) for changes, why in self.jobs[done:done + n]])


def _choices(jobs: list[tuple[dict[str, Any], str]], base: dict[str, Any]) -> dict[str, Any]:
    """A search space that admits exactly the values the listed jobs and the base config use."""
    base_values = flatten(base)
    space: dict[str, Any] = {}
    for changes, _ in jobs:
        for key, value in changes.items():
            values = space.setdefault(key, {"choices": []})["choices"]
            for v in (base_values.get(key), value):
                if v is not None and v not in values:
                    values.append(v)
    return space


def arms_study(design: dict[str, Any], weak: str, cache: Path, seed: int,
               model: str | None, seeds: int) -> tuple[Study, ListProposer]:
    """Both arms as one study that decides nothing: no pruning, no confirmations."""
    jobs = _arm_jobs(design["known_change"], seeds)
    study = make_study("arms", design, weak, cache, "optuna", seed, model, healthy=True)
    base = study.base_trial.with_changes({"eval.test_tasks": 0})  # it decides nothing
    return Study.model_validate({
        **study.model_dump(mode="json"),
        "base_trial": base.model_dump(mode="json"),
        "search_space": _choices(jobs, base.model_dump(mode="json")),
        "pruning": {"kind": "none"},
        # four runs side by side: decoding fuses across runs, so the two cores do more work;
        # as soon as one ends the next starts (the arms' runs differ in length, and with a
        # fixed list and no pruning nothing depends on the order they end in)
        "executor": {"max_parallel_trials": 4, "schedule": "asap"},
        "budget": {"max_trials": 2 * seeds, "confirm_seeds": 0, "max_confirm_trials": 0,
                   "seed_bank": 0}}), ListProposer(jobs)


def arm_runs(directory: Path, change: dict[str, Any]
             ) -> tuple[list[dict[str, bool]], list[dict[str, bool]]]:
    """Dev verdicts of each finished run, as (base arm, change arm)."""
    trials = bank_runs(directory)
    base = [t["dev"]["verdicts"] for t in trials if not _has(t["changes"], change)]
    changed = [t["dev"]["verdicts"] for t in trials if _has(t["changes"], change)]
    return base, changed


def warmup_scores(directory: Path) -> dict[str, str]:
    """Each declared warm-up's dev accuracy after it (the checkpoints the arms fork from)."""
    trials = Journal(directory, read_only=True).trials("role = ?", ["warmup"])
    return {t["id"]: acc(t, "dev") for t in trials}


def _has(changes: dict[str, Any] | None, change: dict[str, Any]) -> bool:
    return all((changes or {}).get(k) == v for k, v in change.items())


def _mean_sd(runs: list[dict[str, bool]]) -> str:
    scores = [sum(r.values()) / len(r) for r in runs]
    return (f"{statistics.mean(scores):.3f} (SD {statistics.stdev(scores):.3f}, "
            f"{len(scores)} runs)")


def summarise_arms(directory: Path, change_made: dict[str, Any], seconds: float,
                   pseudo: int) -> dict[str, Any]:
    """(a) and (b) from the base arm as an A/A seed bank, and the change measured against it."""
    base, change = arm_runs(directory, change_made)
    known = run_level_test(change, base)
    interval = known.interval()
    print(f"\n== arms ({seconds:.0f} s) ==")
    warmups = warmup_scores(directory)
    for trial_id, score in warmups.items():
        print(f"  {trial_id}: dev {score}")
    print(f"  arm A, the base config: dev {_mean_sd(base)}")
    print(f"  arm B, {json.dumps(change_made)}: dev {_mean_sd(change)}")
    print(f"  B - A over runs: {fmt(interval)} (Student t, run SD {known.run_sd:.3f}, "
          f"{known.df} df, one-sided p {known.p_value:.2g})")
    candidates = candidates_for(len(base), 3)
    cells: dict[str, Any] = {}
    if candidates >= 1:
        for k, effect in enumerate((0.0, 0.05, 0.10)):
            hits, n = pseudo_studies(base, pseudo, candidates, effect, True, seed=200 + k)
            label = "none" if not effect else f"+{effect * 100:.0f} pts"
            cells[label] = {"hits": hits, "studies": n, "rate": rate(hits, n)}
            what = "false keeps per A/A study" if not effect else "power (planted kept)"
            print(f"  {label}: {what}: {rate(hits, n)}")
    return {"study": "arms", "seconds": round(seconds, 1), "directory": str(directory),
            "warmups": warmups,
            "base_arm": _mean_sd(base), "change_arm": _mean_sd(change),
            "change_minus_base": interval.as_dict(), "run_test": known.as_dict(),
            "pseudo_candidates": candidates, "pseudo": cells}


class ArmsWorld(BankWorld):
    """A seed bank of two arms: each (config, seed) a pseudo-study asks for gets a different
    real run, drawn without replacement, the changed config's from the change arm, every other
    from the base arm."""

    def __init__(self, rng: np.random.Generator, base: list[dict[str, bool]],
                 change: list[dict[str, bool]], changed: int) -> None:
        super().__init__(rng, base)
        self.change, self.changed = change, changed
        self.change_pool = list(rng.permutation(len(change)))

    def draw(self, config: int) -> dict[str, bool]:
        if config == self.changed:
            return dict(self.change[take(self.rng, self.change_pool, len(self.change))])
        return super().draw(config)


def keeps_of_real_change(directory: Path, change: dict[str, Any], study: Study, count: int,
                         seed: int = 300) -> tuple[int, int]:
    """How often a study of `study`'s design keeps the change, each run it asks for a different
    real run of the arms part (the change at a random place among the candidates): the power
    of the rule for this effect at this run luck, from runs rather than a model of them."""
    base, changed = arm_runs(directory, change)
    rng = np.random.default_rng(seed)
    candidates = study.budget.max_trials - 1
    hits = 0
    for _ in range(count):
        planted = int(rng.integers(1, candidates + 1))
        hits += new_study(ArmsWorld(rng, base, changed, planted), candidates, study) == planted
    return hits, count


def known_study(design: dict[str, Any], weak: str, cache: Path, seed: int,
                model: str | None) -> tuple[Study, ListProposer]:
    """A study of the healthy base offered the known change and a decoy (the base again under
    another seed, which must not be kept), with the default keep rule and its test check."""
    jobs = [(dict(design["known_change"]), design["known_label"]),
            ({**NO_OP, "seed": 101}, "the base config again under another seed: a decoy")]
    study = make_study("known", design, weak, cache, "optuna", seed, model, healthy=True)
    space = _choices(jobs, study.base_trial.model_dump(mode="json"))
    # The confirmation's fresh seeds a side: the test check then compares them with the
    # base's runs (baseline, bank, re-runs). The resampled keep rate printed beside the
    # verdict is how often a study of this design keeps the change the arms measured.
    confirm = design["known_confirm_seeds"]
    base = study.base_trial.with_changes({"eval.test_tasks": design["known_test_tasks"]})
    return Study.model_validate({
        **study.model_dump(mode="json"), "search_space": space,
        "base_trial": base.model_dump(mode="json"),
        # No pruning: both candidates run in the first round beside the baseline, so pruning
        # could save at most the last step of one of them, while its interim evaluations
        # (32 dev tasks at step 2) cost every one of the study's runs, about 4 minutes in all.
        "pruning": {"kind": "none"},
        "executor": {"max_parallel_trials": 4},
        "budget": {**design["budget"], "max_trials": 1 + len(jobs), "confirm_seeds": confirm,
                   "max_confirm_trials": 2 * confirm, "seed_bank": 3}}), ListProposer(jobs)


def test_over_runs(directory: Path) -> RunTest | None:
    """The study's own test check as its report reads it: the kept config's confirmation runs
    against the base config's runs, over runs."""
    journal = Journal(directory, read_only=True)
    best = journal.study()["best_trial"]
    arms = best and test_verdicts(journal.trials(), best)
    return run_level_test(*arms) if arms and min(map(len, arms)) > 1 else None


def set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `a.b.c` in a nested dict, creating the sections on the way."""
    *parents, leaf = dotted.split(".")
    for key in parents:
        tree = tree.setdefault(key, {})
    tree[leaf] = value


def _base_trial(design: dict[str, Any], weak: str | None) -> dict[str, Any]:
    """The design's base trial; with `weak`, one dimension set to its deliberately bad value."""
    base = json.loads(json.dumps(design["base"]))
    for dotted, value in (WEAK[weak][0] if weak else {}).items():
        set_dotted(base, dotted, value)
    return base


def make_study(name: str, design: dict[str, Any], weak: str, cache: Path, proposer: str,
               seed: int, model: str | None, healthy: bool = False,
               trials: Path | None = None, extra_space: dict[str, Any] | None = None,
) -> Study:
    space = {**WEAK[weak][1], **(extra_space or {})}
    base = _base_trial(design, None if healthy else weak)
    if model is not None:  # another embedded model: the trials must name it
        base.update(base_model=model, tokenizer=model)
    return Study.model_validate({
        "name": name, "seed": seed, "embedded_model": model, "base_trial": base,
        "warmup": {**design["warmup"], "cache_dir": str(cache)},
        "warmup_choices": design.get("warmup_choices", {}),
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


LEGACY = ("pos-tpe", "null", "pos-random")
"""The earlier controls: a deliberately broken base repaired (TPE, then random search) and the
healthy base re-proposed under other seeds. `--parts` runs them; they are not the default."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: minutes, no verdict")
    parser.add_argument("--parts", nargs="+", default=["arms", "known"],
                        choices=["arms", "known", *LEGACY])
    parser.add_argument("--seeds", type=int, default=None,
                        help="runs per arm in the arms part (default 10; 2 with --smoke)")
    parser.add_argument("--pseudo", type=int, default=2000,
                        help="pseudo-studies per cell of the A/A and spiked resampling")
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
    parser.add_argument("--redecide", action="store_true",
                        help="with --resume: decide the finished arms part's pseudo-studies "
                             "again with the current decision code (same real runs; none run)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s",
                        datefmt="%H:%M:%S")
    logging.getLogger("tinker").setLevel(logging.ERROR)
    for name in ("autoresearch.study.runner", "autoresearch.study.warmup"):
        logging.getLogger(name).setLevel(logging.INFO)
    design = DESIGNS["smoke" if args.smoke else "full"]
    seeds = args.seeds or (2 if args.smoke else 10)
    root = args.resume or args.out / time.strftime("%Y%m%d-%H%M%S")
    root.mkdir(parents=True, exist_ok=True)
    cache = root / "warmups"
    summary_path = root / "summary.json"
    summary: dict[str, Any] = (json.loads(summary_path.read_text()) if summary_path.exists()
                               else {"design": "smoke" if args.smoke else "full",
                                     "weak": args.weak, "parts": {}})
    print(f"command: python -m bench.bench_study {' '.join(sys.argv[1:])} (results in {root}); "
          f"loadavg {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    started = time.time()
    for name in args.parts:
        if name == "arms" and args.redecide and name in summary["parts"]:
            done = summary["parts"][name]
            summary["parts"][name] = summarise_arms(Path(done["directory"]),
                                                    design["known_change"], done["seconds"],
                                                    args.pseudo)
            summary_path.write_text(json.dumps(summary, indent=2))
            continue
        if name in summary["parts"]:
            print(f"{name}: already done ({summary['parts'][name]['seconds']:.0f} s)")
            continue
        t0 = time.time()
        if name == "arms":
            study, proposer = arms_study(design, args.weak, cache, args.seed, args.model, seeds)
            run_study(study, root / name, proposer=proposer)
            summary["parts"][name] = summarise_arms(root / name, design["known_change"],
                                                    time.time() - t0, args.pseudo)
        elif name == "known":
            study, proposer = known_study(design, args.weak, cache, args.seed, args.model)
            run_study(study, root / name, proposer=proposer)
            part = summarise(name, root / name, time.time() - t0)
            runs = test_over_runs(root / name)
            part["test_over_runs"] = runs and {**runs.interval().as_dict(), **runs.as_dict()}
            summary["parts"][name] = part
        else:
            proposer = NullProposer() if name == "null" else None
            kind = "random" if name == "pos-random" else "optuna"
            # The null control re-proposes the healthy base: seed noise on a model that works.
            study = make_study(name, design, args.weak, cache, kind, args.seed, args.model,
                               healthy=name == "null",
                               trials=None if args.no_trial_cache else root / "trials",
                               extra_space=NULL_SPACE if name == "null" else None)
            if name == "null":
                study = study.model_copy(update={"budget": study.budget.model_copy(
                    update={"max_trials": 1 + design["null_trials"]})})
            run_study(study, root / name, proposer=proposer)
            summary["parts"][name] = summarise(name, root / name, time.time() - t0)
        summary_path.write_text(json.dumps(summary, indent=2))

    print("\n== verdicts ==")
    parts = summary["parts"]
    if "arms" in parts:
        arms = parts["arms"]
        for label, cell in arms["pseudo"].items():
            what = "(a) false keeps per A/A study" if label == "none" else \
                f"(b) power at {label}"
            print(f"{what}: {cell['rate']} ({cell['studies']} pseudo-studies of the base arm's "
                  f"runs, baseline + {arms['pseudo_candidates']} candidates)")
        print(f"(c) the change measured beforehand: {arms['change_arm']} against "
              f"{arms['base_arm']}: {fmt(_est(arms['change_minus_base']))} over runs")
    if "known" in parts:
        known = parts["known"]
        best = known["best"] or {}
        kept = bool(known["kept"]) and _has(best.get("changes"), design["known_change"])
        runs = known.get("test_over_runs")
        holds = bool(runs and runs["low"] > 0)
        verdict = "PASS" if kept and holds else "FAIL"
        print(f"(c) a study offered it and a decoy: {verdict}: kept {known['kept'] or 'nothing'} "
              f"(best {best.get('id')}: {json.dumps(best.get('changes'))}); dev gain "
              f"{fmt(_est(known['dev_gain']))}; test over runs "
              f"{fmt(_est(runs)) if runs else 'n/a'}")
        summary["known_change_pass"] = verdict == "PASS"
    if "arms" in parts:
        study, _ = known_study(design, args.weak, cache, args.seed, args.model)
        hits, n = keeps_of_real_change(Path(parts["arms"]["directory"]),
                                       design["known_change"], study, args.pseudo)
        print(f"(c) how often the known study's design keeps the change, resampled from the "
              f"arms' real runs: {rate(hits, n)} of {n} pseudo-studies")
        summary["known_change_kept_rate"] = {"hits": hits, "studies": n, "rate": rate(hits, n)}
    if all(k in parts for k in LEGACY):
        pos, null, rnd = (parts[k] for k in LEGACY)
        gain = pos["test_gain"]
        positive_ok = bool(pos["kept"] and pos["dev_gain"] and pos["dev_gain"]["low"] > 0
                           and gain and gain["low"] > 0)
        head = paired(_best_row(root / "pos-tpe"), _best_row(root / "pos-random"), "test")
        print(f"positive control ({args.weak} weak in the base): "
              f"{'PASS' if positive_ok else 'FAIL'}: kept {pos['kept'] or 'nothing'}; dev gain "
              f"{fmt(_est(pos['dev_gain']))}; test gain {fmt(_est(gain))}")
        print(f"null control (base config under other seeds): "
              f"{'PASS' if not null['kept'] else 'FAIL'}: kept {null['kept'] or 'nothing'}")
        print(f"TPE vs random search, same budget: test, TPE best - random best (paired): "
              f"{fmt(head)}")
        summary.update({"positive_control_pass": positive_ok, "null_control_pass":
                        not null["kept"], "tpe_minus_random_test": head and head.as_dict()})
    summary["seconds_this_invocation"] = round(time.time() - started, 1)
    if args.smoke:
        summary["note"] = "smoke sizes: the pipeline ran end to end; the verdicts mean nothing"
        print("smoke sizes: the pipeline ran end to end; these verdicts mean nothing")
    summary_path.write_text(json.dumps(summary, indent=2))
    print(f"\n{time.time() - started:.0f} s; loadavg "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; summary: {summary_path}")
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
