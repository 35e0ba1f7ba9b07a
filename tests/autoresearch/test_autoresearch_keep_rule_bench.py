"""The keep-rule benchmark decides its simulated studies with the runner's own decision code
(`confirmation.next_decision`): a large planted gain is kept, equal configs are not."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

from autoresearch.study.spec import Study

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bench_keep_rule.py"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_keep_rule", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("bench_keep_rule", module)
    spec.loader.exec_module(module)
    return module


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


def _seed_bank_bench():
    path = BENCH.with_name("bench_seed_bank.py")
    spec = importlib.util.spec_from_file_location("bench_seed_bank", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bank_pseudo_studies_use_each_run_once_and_find_a_large_spiked_effect():
    bench = _seed_bank_bench()
    rng = np.random.default_rng(1)
    runs = [{f"dev-{i:02d}": bool(rng.random() < 0.2) for i in range(48)} for _ in range(12)]
    world = bench.BankWorld(np.random.default_rng(0), runs)
    served = [world.run(c, s) for c, s in [(0, 0), (1, 0), (0, 1), (1, 1)]]
    assert len({id(r) for r in served}) == 4 and world.run(0, 0) is served[0]
    false_keeps, n = bench.pseudo_studies(runs, 100, 3, 0.0, True, seed=0)
    assert n == 100 and false_keeps <= 10
    found, _ = bench.pseudo_studies(runs, 100, 3, 0.5, True, seed=0)
    assert found >= 80
