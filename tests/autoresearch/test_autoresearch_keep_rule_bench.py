"""The keep-rule benchmark decides its simulated studies with the runner's own decision code
(`confirmation.next_decision`): a large planted gain is kept, equal configs are not."""

from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np

from autoresearch.study.decisions import keep_rule_for
from autoresearch.study.spec import Study


def _bench(name: str = "bench_keep_rule"):
    """A benchmark module of the `bench` package."""
    return importlib.import_module(f"bench.{name}")


STUDY = Study(name="bench", budget={"max_trials": 4, "confirm_seeds": 2,
                                    "max_confirm_trials": 8})


def test_a_large_planted_gain_is_kept_through_the_runners_decisions():
    bench = _bench()
    world = bench.World(np.random.default_rng(0), 200, -1.0, [0.0, 0.0, 3.0, 0.0])
    assert bench.new_study(world, 3, STUDY) == 2
    # the re-runs it asked for are those the runner would queue: both contenders, fresh seeds
    assert {(config, seed) for config, seed in world.runs
            if seed in bench.CONFIRM_SEEDS} == {(0, 1), (0, 2), (2, 1), (2, 2)}
    assert {(config, seed) for config, seed in world.runs if seed in bench.BANK_SEEDS} == {
        (0, 5000), (0, 5001)}  # the seed bank: the base config on two more seeds


def test_equal_configs_keep_the_baseline():
    bench = _bench()
    kept = [bench.new_study(bench.World(np.random.default_rng(seed), 96, -1.0, [0.0] * 4), 3,
                            STUDY) for seed in range(20)]
    assert sum(k != 0 for k in kept) <= 2


def test_bank_pseudo_studies_use_each_run_once_and_find_a_large_spiked_effect():
    bench = _bench("bench_seed_bank")
    rng = np.random.default_rng(1)
    runs = [{f"dev-{i:02d}": bool(rng.random() < 0.2) for i in range(48)} for _ in range(12)]
    world = bench.BankWorld(np.random.default_rng(0), runs)
    served = [world.run(c, s) for c, s in [(0, 0), (1, 0), (0, 1), (1, 1)]]
    assert len({id(r) for r in served}) == 4 and world.run(0, 0) is served[0]
    more = [world.run(c, s) for c, s in [(2, 0), (3, 0)] + [(4, s) for s in range(8)]]
    seen = [tuple(sorted(r.items())) for r in served + more]
    assert sorted(seen[:12]) == sorted(tuple(sorted(r.items())) for r in runs)  # each once,
    assert set(seen[12:]) <= set(seen[:12])  # then again in a fresh order, never a crash
    false_keeps, n = bench.pseudo_studies(runs, 100, 3, 0.0, True, seed=0)
    assert n == 100 and false_keeps <= 10
    # Found in most studies; the misses are studies whose one confirmation went to a null
    # candidate judged before the planted one (first looks only select).
    found, _ = bench.pseudo_studies(runs, 100, 3, 0.5, True, seed=0)
    assert found >= 70


def _trained_space(study):
    """The study's space as its runner holds it once every declared warm-up has a checkpoint
    (stand-in paths): warm-up names resolve only then."""
    return study.space(None, {name: f"tinker://{name}/weights/final"
                              for name in ("default", *study.warmup_choices)})


def test_the_arms_study_runs_each_arm_on_its_own_seeds_and_admits_only_them(tmp_path):
    bench = _bench("bench_study")
    design = bench.DESIGNS["full"]
    study, proposer = bench.arms_study(design, "rl-lr-high", tmp_path, 0, None, seeds=10)
    arm_b = [c for c, _ in proposer.jobs if bench._has(c, design["known_change"])]
    arm_a = [c for c, _ in proposer.jobs if not bench._has(c, design["known_change"])]
    # with the baseline, ten runs per arm, each on a seed of its own
    assert (len(arm_a) + 1, len(arm_b)) == (10, 10)
    assert len({c["seed"] for c in arm_a}) == 9 and len({c["seed"] for c in arm_b}) == 10
    assert study.budget.max_trials == 20 and study.budget.confirm_seeds == 0
    assert study.pruning.kind == "none"
    space = _trained_space(study)
    for changes, _ in proposer.jobs:  # every listed run is inside the declared space
        space.validate(changes)
    # the change is the declared longer warm-up; the base arm forks from the study's own
    assert study.search_space["warmup"].choices == ["long"]
    assert study.warmup_choices["long"].sft.steps > study.warmup.sft.steps
    assert not any("warmup" in c for c in arm_a)
    # the warm-ups are the design's, a short run never waits for a long one, and a study that
    # decides nothing reads no test tasks
    assert study.warmup.sft.steps == design["warmup"]["sft"]["steps"]
    assert study.executor.schedule == "asap"
    assert study.base_trial.eval.test_tasks == 0


def test_the_known_change_study_offers_the_change_and_a_decoy_under_the_default_rule(tmp_path):
    bench = _bench("bench_study")
    design = bench.DESIGNS["full"]
    study, proposer = bench.known_study(design, "rl-lr-high", tmp_path, 0, None)
    changes = [c for c, _ in proposer.jobs]
    assert changes[0] == design["known_change"] and changes[1]["seed"] != study.base_trial.seed
    assert study.budget.max_trials == 3 and study.budget.seed_bank == 3
    assert study.budget.confirm_seeds == 4 and study.budget.max_confirm_trials == 8
    # both candidates run in the first round: interim evaluations for pruning would cost every
    # run and could save at most one step of one
    assert study.pruning.kind == "none" and study.trial_base().eval.every == 0
    # one confirmation at the study's whole alpha; its test check reads the design's tasks
    assert keep_rule_for(study.budget).budget.confirmations == 1
    assert study.base_trial.eval.test_tasks == design["known_test_tasks"]
    for c in changes:
        _trained_space(study).validate(c)


def test_the_demo_rl_bench_forks_each_variant_from_the_demos_warmup_and_decides_nothing():
    bench = _bench("bench_demo_rl")
    variants = [{"rl.adam.learning_rate": 3e-5}, {"rl.temperature": 0.7}]
    study, proposer = bench.variants_study({"reward.weights.executes": 0.0}, variants, 3,
                                           {"sft.steps": 20})
    assert study.base_trial.reward.weights.executes == 0.0
    assert study.warmup.sft.steps == 20
    assert study.budget.max_trials == 3 and study.budget.confirm_seeds == 0
    assert study.executor.max_parallel_trials == 3 and study.pruning.kind == "none"
    assert [c for c, _ in proposer.jobs] == variants
    for changes in variants:
        study.space().validate(changes)


def test_real_runs_of_a_large_change_are_kept_and_runs_of_the_same_config_are_not():
    bench = _bench("bench_study")
    rng = np.random.default_rng(3)
    tasks = [f"dev-{i:02d}" for i in range(96)]
    base = [{t: bool(rng.random() < 0.1) for t in tasks} for _ in range(10)]
    better = [{t: bool(rng.random() < 0.5) for t in tasks} for _ in range(10)]
    study, _ = bench.known_study(bench.DESIGNS["full"], "rl-lr-high", Path("unused"), 0, None)
    world = bench.ArmsWorld(np.random.default_rng(0), base, better, changed=1)
    assert world.run(1, 0) in better and world.run(0, 0) in base and world.run(2, 0) in base
    assert world.run(1, 0) is world.run(1, 0)  # one run per (config, seed)
    hits = sum(bench.new_study(bench.ArmsWorld(np.random.default_rng(k), base, better, 1), 2,
                               study) == 1 for k in range(20))
    assert hits >= 18
    same = sum(bench.new_study(bench.ArmsWorld(np.random.default_rng(k), base, base[::-1], 1), 2,
                               study) != 0 for k in range(20))
    assert same <= 2


def test_noisier_candidates_keep_the_baselines_expected_accuracy_and_their_own_spread():
    bench = _bench()
    mu = bench._solve(0.2, lambda m: bench._mean_accuracy(m, 0.0, 0.0))
    base_sd, noisy_sd = bench.seed_sd_for(3.0, mu), bench.seed_sd_for(9.0, mu)
    shift = bench._solve(bench._mean_accuracy(mu, 0.0, base_sd),
                         lambda s: bench._mean_accuracy(mu, s, noisy_sd))
    assert abs(bench._mean_accuracy(mu, shift, noisy_sd)
               - bench._mean_accuracy(mu, 0.0, base_sd)) < 1e-3
    world = bench.World(np.random.default_rng(0), 400, mu, [0.0, shift], base_sd, noisy_sd)
    spread = [np.std([np.mean(list(world.run(c, s).values())) for s in range(60)])
              for c in (0, 1)]
    assert 2.0 < spread[1] / spread[0] < 4.5  # about 3x the run-to-run spread
