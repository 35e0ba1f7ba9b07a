"""The keep rule's error rates when every run has luck of its own: simulated studies, three
rules side by side on the same simulated worlds, in one run.

Each simulated study has a baseline and several candidates, scored on a fixed set of dev tasks.
The NEW rule is the product's own, applied by the study runner's own decision code
(`autoresearch.study.confirmation.next_decision`, with the `KeepRule` that `keep_rule_for`
builds from the study budget) to simulated trial rows: the baseline's seed bank, candidates
decided in order, a promising one and the best re-run with fresh seeds, the best's re-runs
reused; a confirmation must pass per task and per run (Welch's t, each side's own spread).
POOLED is the same code with one run-to-run spread pooled over every config
(`KeepRule.own_spreads=False`), the run-level test before. TASKS is the same code with the
run-level test off (`KeepRule.run_level=False`): the rule before runs were the unit. OLD is the
rule before that: a normal (Wald) interval on paired differences, seeds pooled as if they were
new tasks, the selecting look pooled into the confirmation, and a significant single look kept
when no budget is left.

The world is simulated as real dev scores behave:
    P(task i right | config c, run r) = sigmoid(difficulty_i + quality_c + interaction_ci + seed_r)
- difficulty_i ~ N(mu, 1.5): tasks differ a lot (many are always or never solved), so the two
  configs' outcomes on a task are strongly correlated; mu puts the base accuracy at `--base`.
- interaction_ci ~ N(0, 0.5): a change helps some tasks and hurts others.
- seed_r ~ N(0, s): a run's own luck (training seed), shared by all its tasks; each (run, task)
  outcome is then a fresh draw. `--run-sds` gives the SDs of a run's dev accuracy that this
  luck causes, in accuracy points (s is solved for each); 0 is no run luck at all.
- quality_c: 0 for the baseline and the null candidates; for the planted candidate, the shift
  whose expected dev accuracy gain (over tasks, interactions and seeds) is the effect.
- `--noisy-candidates R` gives every candidate R times the baseline's run luck (a learning rate
  that sometimes wrecks a run), its shift solved so that its expected accuracy is still the
  baseline's (null) or the effect above it: what pooling the spread over configs assumes away.

Reported per run-to-run SD, dev size and planted effect: the false-keep rate per study (no
candidate better; target <= alpha = 5%) and the power (the planted candidate ends as the
study's best).

    python -m bench.bench_keep_rule [--studies 400] [--candidates 6] [--base 0.15]
        [--run-sds 0 2 3 4] [--sizes 48 96 200] [--effects 0 0.05 0.10] [--noisy-candidates 3]
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
import time
from collections.abc import Callable

import numpy as np

from autoresearch.evaluation.stats import Estimate
from autoresearch.study.confirmation import (
    EvidenceSeeds,
    QueueSeedBank,
    Rerun,
    Verdict,
    held_out_gain,
    missing_test_runs,
    next_decision,
    test_arms,
)
from autoresearch.study.decisions import KeepRule, keep_rule_for
from autoresearch.study.spec import Budget, Study

Z95 = 1.959963984540054
SIGMA_TASK, SIGMA_INTERACTION, SIGMA_SEED = 1.5, 0.5, 0.1
BASE_SEED = 0
"""The first look's seed; confirmation re-runs use the seeds after it, as in a study."""


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


_NOISE = np.random.default_rng(12345).normal(size=(3, 200_000))
"""Common random numbers for calibration: tasks, interactions and seeds of a large population."""


def _mean_accuracy(mu: float, shift: float, seed_sd: float = SIGMA_SEED) -> float:
    logits = (mu + SIGMA_TASK * _NOISE[0] + SIGMA_INTERACTION * _NOISE[1]
              + seed_sd * _NOISE[2] + shift)
    return float(sigmoid(logits).mean())


def seed_sd_for(points: float, mu: float) -> float:
    """The logit SD of a run's luck that moves its dev accuracy by `points` (SD, in accuracy
    points) at base logit `mu`: the luck shifts every task's logit at once."""
    h = 0.05
    slope = (_mean_accuracy(mu, h, 0.0) - _mean_accuracy(mu, -h, 0.0)) / (2 * h)
    return points / 100 / slope


def _solve(target: float, f: Callable[[float], float], lo: float = -8, hi: float = 8) -> float:
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
    return (lo + hi) / 2


class World:
    """One study's dev tasks, configs and the runs drawn so far (cached per config and seed)."""

    def __init__(self, rng: np.random.Generator, tasks: int, mu: float, qualities: list[float],
                 seed_sd: float = SIGMA_SEED, candidate_sd: float | None = None):
        self.rng = rng
        self.mu, self.qualities, self.tasks = mu, qualities, tasks
        self.luck: dict[tuple[int, int], float] = {}
        """Each run's own luck, shared by its dev and test answers (a lucky run is lucky on
        both splits: the reason a test check must not reuse the runs that kept a change)."""
        self._test: tuple[np.random.Generator, list[np.ndarray]] | None = None
        # The baseline's run luck, and the candidates' (a noisier config: `--noisy-candidates`)
        self.seed_sds = [seed_sd] + [seed_sd if candidate_sd is None else candidate_sd
                                     for _ in qualities[1:]]
        self.ids = [f"dev-{i:03d}" for i in range(tasks)]
        self.difficulty = rng.normal(mu, SIGMA_TASK, tasks)
        # The baseline's own interaction is folded into difficulty; candidates get theirs.
        self.logits = [self.difficulty + q + (rng.normal(0, SIGMA_INTERACTION, tasks) if c else 0)
                       for c, q in enumerate(qualities)]
        self.runs: dict[tuple[int, int], dict[str, bool]] = {}

    def run(self, config: int, seed: int) -> dict[str, bool]:
        key = (config, seed)
        if key not in self.runs:
            self.luck[key] = self.rng.normal(0, self.seed_sds[config])
            p = sigmoid(self.logits[config] + self.luck[key])
            right = self.rng.random(len(self.ids)) < p
            self.runs[key] = dict(zip(self.ids, right.tolist()))
        return self.runs[key]

    def run_test(self, config: int, seed: int) -> dict[str, bool]:
        """The run's answers on a test split of its own tasks (drawn like dev's), with the luck
        it had on dev; a run never made on dev (a fresh run) gets luck of its own. Test draws
        come from a generator of their own, so the dev draws are those of a study without a
        test check."""
        if self._test is None:
            digest = hashlib.sha256(self.logits[0].tobytes()).digest()
            rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
            difficulty = rng.normal(self.mu, SIGMA_TASK, self.tasks)
            self._test = (rng, [difficulty + q + (rng.normal(0, SIGMA_INTERACTION, self.tasks)
                                                  if c else 0)
                                for c, q in enumerate(self.qualities)])
        rng, logits = self._test
        key = (config, seed)
        if key not in self.luck:
            self.luck[key] = rng.normal(0, self.seed_sds[config])
        right = rng.random(self.tasks) < sigmoid(logits[config] + self.luck[key])
        return {f"test-{i:03d}": bool(r) for i, r in enumerate(right)}


# ------------------------------------------------------------------ the rules
def _trial(number: int, role: str, config: int, seed: int, verdicts: dict[str, bool]) -> dict:
    """A journal trial row with what the runner's decision code reads."""
    return {"id": f"t{number:04d}", "role": role, "status": "done", "decision": None,
            "finished": number, "config_key": f"config-{config}", "seed": seed,
            "config_index": config, "dev": {"verdicts": verdicts}, "checkpoint": "simulated"}


BANK_SEEDS = [5000 + k for k in range(64)]
CONFIRM_SEEDS = [1 + k for k in range(16)]
TEST_SEEDS = [9000 + k for k in range(16)]


def new_study(world: World, candidates: int, study: Study, run_level: bool = True,
              own_spreads: bool = True) -> int:
    """The product's keep rule, applied by the study runner's own decision code
    (`confirmation.next_decision`) to simulated trials: the baseline and its seed bank, the
    candidates, each run once with the base seed, and the confirmation re-runs it asks for."""
    best, _ = decided_study(world, candidates, study, run_level, own_spreads)
    return 0 if best is None else best["config_index"]


def decided_study(world: World, candidates: int, study: Study, run_level: bool = True,
                  own_spreads: bool = True) -> tuple[dict | None, list[dict]]:
    """`new_study`'s decisions: the kept trial (None: the baseline stays) and every trial row."""
    rule, budget = keep_rule_for(study.budget), study.budget
    if not (run_level and own_spreads):
        rule = KeepRule(rule.budget, rule.select_p, run_level=run_level, own_spreads=own_spreads)
    seeds = EvidenceSeeds(BANK_SEEDS[:max(0, budget.seed_bank - 1)],
                          CONFIRM_SEEDS[:budget.confirm_seeds])
    trials = [_trial(n, "baseline" if n == 0 else "explore", n, BASE_SEED, world.run(n, BASE_SEED))
              for n in range(candidates + 1)]
    best: dict | None = None
    while (decision := next_decision(trials, best and best["id"], rule, budget,
                                     seeds)) is not None:
        if isinstance(decision, QueueSeedBank):
            trials += [_trial(len(trials) + k, "bank", 0, s, world.run(0, s))
                       for k, s in enumerate(decision.seeds)]
            continue
        if isinstance(decision, Rerun):
            for contender, seed in decision.missing:
                config = contender["config_index"]
                trials.append(_trial(len(trials), "confirm", config, seed,
                                     world.run(config, seed)))
            continue
        if not isinstance(decision, Verdict):
            raise RuntimeError(f"every simulated trial has finished, yet: {decision}")
        decision.candidate["decision"] = {"kept": decision.kept, "rule": decision.rule}
        if decision.kept:
            best = decision.candidate
    if best is not None and best["role"] == "baseline":
        best = None
    return best, trials


def test_check(world: World, trials: list[dict], best: dict, study: Study,
               fresh: bool) -> Estimate:
    """The study's test check of a kept change, by the product's own code: the arms
    `confirmation.test_arms` names (fresh runs on the study's test seeds, `missing_test_runs`,
    or, without them, the confirmation re-runs and the base config's runs), each read on the
    test split, and the estimate the report prints (`confirmation.held_out_gain`)."""
    rows = list(trials)
    if fresh:
        seeds = EvidenceSeeds([], [], TEST_SEEDS[:study.budget.test_seeds])
        for contender, seed in missing_test_runs(rows, best["id"], seeds):
            rows.append(_trial(len(rows), "fresh", contender["config_index"], seed, {}))
    arms = test_arms(rows, best["id"])
    kept, base = ([world.run_test(t["config_index"], t["seed"]) for t in arm] for arm in arms)
    return held_out_gain(kept, base)[0]


def pooled_study(world: World, candidates: int, study: Study) -> int:
    """The same decision code with one run-to-run spread pooled over every config."""
    return new_study(world, candidates, study, own_spreads=False)


def task_level_study(world: World, candidates: int, study: Study) -> int:
    """The same decision code with the run-level test off."""
    return new_study(world, candidates, study, run_level=False)


def _wald_low(pairs: list[tuple[dict[str, bool], dict[str, bool]]]) -> tuple[float, float]:
    """Old `compare`: every (seed, task) pair as one item, normal interval; (mean, low)."""
    d = np.array([float(a[t]) - float(b[t]) for a, b in pairs for t in a])
    mean = float(d.mean())
    half = Z95 * math.sqrt(d.var(ddof=1) / len(d)) if len(d) > 1 else 1.0
    return mean, mean - half


def old_study(world: World, candidates: int, study: Study) -> int:
    """The rule this replaced, with the same budget."""
    budget = study.budget
    seeds = list(range(1, budget.confirm_seeds + 1))
    best, spent = 0, 0
    for cand in range(1, candidates + 1):
        first = [(world.run(cand, 0), world.run(best, 0))]
        mean, low = _wald_low(first)
        significant = low > 0
        if mean <= 0 and not significant:
            continue
        missing = len(seeds) + sum((best, s) not in world.runs for s in seeds)
        if not seeds or spent + missing > budget.max_confirm_trials:
            if significant:
                best = cand  # "significant on one seed; no budget left to replicate it"
            continue
        spent += missing
        fresh = [(world.run(cand, s), world.run(best, s)) for s in seeds]
        _, pooled_low = _wald_low(first + fresh)
        replication, _ = _wald_low(fresh)
        if pooled_low > 0 and replication > 0:
            best = cand
    return best


# ---------------------------------------------------------------- the bench
RULES = (("old", old_study), ("tasks", task_level_study), ("pooled", pooled_study),
         ("new", new_study))


def simulate(tasks: int, effect: float, studies: int, candidates: int, base: float,
             study: Study, seed: int, run_points: float, noisier: float = 1.0
             ) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    mu = _solve(base, lambda m: _mean_accuracy(m, 0.0, 0.0))
    seed_sd = seed_sd_for(run_points, mu)
    candidate_sd = seed_sd_for(run_points * noisier, mu)
    # Candidates' shifts are solved with their own run luck, so that a null candidate's expected
    # accuracy is the baseline's whatever its spread, and the planted one's is `effect` above.
    null_shift = 0.0 if noisier == 1.0 else _solve(
        _mean_accuracy(mu, 0.0, seed_sd), lambda s: _mean_accuracy(mu, s, candidate_sd))
    planted_shift = (_solve(base + effect, lambda s: _mean_accuracy(mu, s, candidate_sd))
                     if effect else null_shift)
    outcome = dict.fromkeys((name for name, _ in RULES), 0)
    for _ in range(studies):
        planted = int(rng.integers(1, candidates + 1)) if effect else 0
        qualities = [0.0] + [planted_shift if c == planted else null_shift
                             for c in range(1, candidates + 1)]
        state = rng.bit_generator.state
        for name, decide in RULES:
            rng.bit_generator.state = state  # every rule sees the same tasks, configs and runs
            world = World(rng, tasks, mu, qualities, seed_sd, candidate_sd)
            best = decide(world, candidates, study)
            outcome[name] += best != 0 if not effect else best == planted
    return {name: hits / studies for name, hits in outcome.items()}


def simulate_test_check(tasks: int, effect: float, studies: int, candidates: int, base: float,
                        study: Study, seed: int, run_points: float) -> dict[str, float]:
    """After every change the NEW rule keeps, its test check read for the confirmation re-runs
    (the way before) and for fresh runs (now), on the same worlds: how often the check claims
    an improvement (its interval above 0) when the kept change is no better, whether its
    interval covers the kept change's true gain, and its bias."""
    rng = np.random.default_rng(seed)
    mu = _solve(base, lambda m: _mean_accuracy(m, 0.0, 0.0))
    seed_sd = seed_sd_for(run_points, mu)
    planted_shift = (_solve(base + effect, lambda s: _mean_accuracy(mu, s, seed_sd))
                     if effect else 0.0)
    found = {"kept": 0, "null kept": 0}
    for way in ("reused", "fresh"):
        found |= {f"{way} claims": 0, f"{way} covers": 0, f"{way} error": 0.0}
    for _ in range(studies):
        planted = int(rng.integers(1, candidates + 1)) if effect else 0
        qualities = [0.0] + [planted_shift if c == planted else 0.0
                             for c in range(1, candidates + 1)]
        world = World(rng, tasks, mu, qualities, seed_sd)
        best, trials = decided_study(world, candidates, study)
        if best is None:
            continue
        true_gain = effect if best["config_index"] == planted and effect else 0.0
        found["kept"] += 1
        found["null kept"] += true_gain == 0.0
        for way in ("reused", "fresh"):
            estimate = test_check(world, trials, best, study, fresh=way == "fresh")
            found[f"{way} claims"] += true_gain == 0.0 and estimate.low > 0
            found[f"{way} covers"] += estimate.low <= true_gain <= estimate.high
            found[f"{way} error"] += estimate.value - true_gain
    return found


def share(hits: float, n: int) -> str:
    return f"{hits / n:.1%}" if n else "-"


def test_check_table(args: argparse.Namespace, study: Study) -> None:
    """`--test-check`: the test check after a keep, reused runs against fresh ones."""
    print("| run SD | dev and test tasks | planted effect | kept | no-better kept | test claims "
          "a gain for a no-better change: reused / fresh | interval covers the true gain: "
          "reused / fresh | bias, points: reused / fresh |")
    print("|---|---|---|---|---|---|---|---|")
    for run_points in args.run_sds:
        for tasks in args.sizes:
            for k, effect in enumerate(args.effects):
                r = simulate_test_check(tasks, effect, args.studies, args.candidates, args.base,
                                        study, seed=1000 * tasks + k, run_points=run_points)
                kept, null = int(r["kept"]), int(r["null kept"])
                bias = {way: f"{100 * r[f'{way} error'] / kept:+.1f}" if kept else "-"
                        for way in ("reused", "fresh")}
                print(f"| {run_points:g} pts | {tasks} | "
                      f"{'none' if not effect else f'+{effect * 100:.0f} pts'} | {kept} | {null} | "
                      f"{share(r['reused claims'], null)} / {share(r['fresh claims'], null)} | "
                      f"{share(r['reused covers'], kept)} / {share(r['fresh covers'], kept)} | "
                      f"{bias['reused']} / {bias['fresh']} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--studies", type=int, default=400)
    parser.add_argument("--candidates", type=int, default=6)
    parser.add_argument("--base", type=float, default=0.15, help="baseline dev accuracy")
    parser.add_argument("--sizes", type=int, nargs="+", default=[48, 96, 200])
    parser.add_argument("--effects", type=float, nargs="+", default=[0.0, 0.05, 0.10])
    parser.add_argument("--run-sds", type=float, nargs="+", default=[0.0, 2.0, 3.0, 4.0],
                        help="run-to-run SDs of dev accuracy, in points (add a seed bank's)")
    defaults = Budget()  # the product's own budget unless told otherwise
    parser.add_argument("--confirm-seeds", type=int, default=defaults.confirm_seeds)
    parser.add_argument("--max-confirm-trials", type=int, default=defaults.max_confirm_trials)
    parser.add_argument("--seed-bank", type=int, default=defaults.seed_bank)
    parser.add_argument("--test-seeds", type=int, default=2,
                        help="fresh runs per arm for the test check (with --test-check)")
    parser.add_argument("--test-check", action="store_true",
                        help="instead of the keep rates: the test check after each keep, read "
                             "for the confirmation re-runs and for fresh runs")
    parser.add_argument("--noisy-candidates", type=float, default=1.0,
                        help="every candidate's run-to-run SD as a multiple of the baseline's "
                             "(its expected accuracy unchanged): the pooled spread's blind spot")
    args = parser.parse_args()
    study = Study(name="bench", budget={"max_trials": args.candidates + 1,
                                        "confirm_seeds": args.confirm_seeds,
                                        "max_confirm_trials": args.max_confirm_trials,
                                        "seed_bank": args.seed_bank,
                                        "test_seeds": args.test_seeds})
    rule = keep_rule_for(study.budget)
    print("command: python -m bench.bench_keep_rule " + " ".join(sys.argv[1:]))
    print(f"{args.studies} simulated studies per cell; baseline + {args.candidates} candidates; "
          f"base dev accuracy {args.base}; confirm_seeds={args.confirm_seeds}, "
          f"max_confirm_trials={args.max_confirm_trials}, seed_bank={args.seed_bank}; "
          f"candidates' run SD {args.noisy_candidates:g}x the baseline's")
    print(rule.budget.describe())
    se = math.sqrt(0.05 * 0.95 / args.studies)
    print(f"(a rate of 5% is measured to +-{1.96 * se:.1%} at this many studies)\n")
    started = time.time()
    if args.test_check:
        print(f"test check of each kept change, {args.test_seeds} fresh run(s) a side; "
              "intervals two-sided 95%, a claim is an interval above 0\n")
        test_check_table(args, study)
        print(f"\n{time.time() - started:.0f}s")
        return
    print("| run SD | dev tasks | planted effect | measures | OLD | TASKS | POOLED | NEW | "
          "NEW / POOLED |")
    print("|---|---|---|---|---|---|---|---|---|")
    for run_points in args.run_sds:
        for tasks in args.sizes:
            for k, effect in enumerate(args.effects):
                r = simulate(tasks, effect, args.studies, args.candidates, args.base, study,
                             seed=1000 * tasks + k, run_points=run_points,
                             noisier=args.noisy_candidates)
                what = "false keeps per study" if not effect else "power (planted kept)"
                ratio = f"{r['new'] / r['pooled']:.2f}" if r["pooled"] else "-"
                print(f"| {run_points:g} pts | {tasks} | "
                      f"{'none' if not effect else f'+{effect * 100:.0f} pts'} | {what} | "
                      f"{r['old']:.1%} | {r['tasks']:.1%} | {r['pooled']:.1%} | "
                      f"{r['new']:.1%} | {ratio} |",
                      flush=True)
    print(f"\n{time.time() - started:.0f}s")


if __name__ == "__main__":
    main()
