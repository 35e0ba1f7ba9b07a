"""The prompt picker: uniform draws are the ones a step always drew, signal-weighted draws
prefer prompts whose groups carried a signal and tiers where something passes, and the picker
rebuilt from a record draws what the live one would have."""

from __future__ import annotations

import random
from collections import Counter

from autoresearch.rl.prompt_picker import GroupOutcome, PromptPicker, stable_rng
from rewards import Task


def _tasks(n: int = 40) -> list[Task]:
    return [Task(setup_sql=f"CREATE TABLE t{i} (x INTEGER);", question=f"q{i}",
                 gold_sql=f"SELECT x FROM t{i}", tier="filter" if i % 2 else "window")
            for i in range(n)]


def test_uniform_draws_are_the_seeded_sample_a_step_always_drew():
    tasks = _tasks()
    picker = PromptPicker(tasks, "uniform", seed=7)
    # what the trial drew before prompts had a picker: random.Random(stable seed).sample
    assert picker.draw(3, 0, 4) == stable_rng(7, "rl", 3).sample(tasks, k=4)
    assert picker.draw(3, 0, 4) == picker.draw(3, 0, 4)
    assert picker.draw(3, 1, 4) != picker.draw(3, 0, 4)
    assert not {t.id for t in picker.draw(3, 1, 38, exclude={tasks[0].id, tasks[1].id})} & {
        tasks[0].id, tasks[1].id}


def test_signal_weights_follow_what_the_groups_said():
    tasks = _tasks()
    picker = PromptPicker(tasks, "signal", seed=0, revisit=0.1)
    fresh = picker.weight(tasks[0])
    assert fresh == 0.5  # Beta(1, 1) prior on the tier's share of informative groups
    picker.observe([GroupOutcome(tasks[0].id, 4, 8, True), GroupOutcome(tasks[2].id, 0, 8, False),
                    GroupOutcome(tasks[4].id, 8, 8, False), GroupOutcome(tasks[1].id, 1, 8, True)])
    assert picker.weight(tasks[0]) == 1.0                     # p = 0.5: the most signal
    assert picker.weight(tasks[2]) == picker.weight(tasks[4]) == 0.1   # all wrong, all right
    assert 0.5 < picker.weight(tasks[1]) < 1.0
    # tier "window" (even ids) gave 1 informative group of 3, "filter" 1 of 1
    assert picker.weight(tasks[6]) == (1 + 1) / (3 + 2)
    assert picker.weight(tasks[3]) == (1 + 1) / (1 + 2)
    assert picker.informative_share() == 0.5


def test_signal_draws_prefer_informative_prompts_and_tiers_that_pass():
    tasks = _tasks()
    picker = PromptPicker(tasks, "signal", seed=1)
    rng = random.Random(0)
    # Every "window" prompt seen all wrong; half the "filter" ones seen with a signal.
    picker.observe(GroupOutcome(t.id, 0, 8, False) for t in tasks if t.tier == "window")
    picker.observe(GroupOutcome(t.id, rng.randint(1, 7), 8, True)
                   for t in tasks[1:20:2])
    drawn = Counter(t.tier for step in range(200) for t in picker.draw(step, 0, 4))
    assert drawn["filter"] > 4 * drawn["window"]


def test_a_picker_rebuilt_from_the_record_draws_what_the_live_one_would():
    tasks = _tasks()
    live = PromptPicker(tasks, "signal", seed=5)
    steps = []
    for step in range(6):
        drawn = live.draw(step, 0, 3)
        outcomes = [GroupOutcome(t.id, step % 3, 3, step % 3 != 0) for t in drawn]
        live.observe(outcomes)
        steps.append({"phase": "rl", "groups": [o.as_list() for o in outcomes]})
    rebuilt = PromptPicker(tasks, "signal", seed=5)
    rebuilt.observe_record(steps)
    assert [t.id for t in rebuilt.draw(6, 0, 5)] == [t.id for t in live.draw(6, 0, 5)]
