"""The trial loop against the real server on a tiny model: rewards flow, checkpoints are
written, the record is complete, and a trial killed mid-way resumes to the same record."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from autoresearch.rl.config import TrialConfig
from autoresearch.rl.record import TrialRecord
from autoresearch.rl.trial import behaviour_logprobs, rl_datum, run_trial, supervised_datum

REPO_ROOT = Path(__file__).resolve().parents[2]
DETERMINISTIC_STEP_FIELDS = (
    "phase",
    "step",
    "reward_mean",
    "accuracy",
    "completion_tokens",
    "groups_used",
    "groups_dropped",
    "loss",
    "loss_per_token",
)


def tiny_config(model_dir: Path, **changes) -> TrialConfig:
    base = {
        "name": "tiny",
        "base_model": str(model_dir),
        "tokenizer": str(model_dir),
        "lora_rank": 4,
        "seed": 3,
        "sft": {"steps": 2, "batch_size": 2, "adam": {"learning_rate": 1e-3}},
        "rl": {
            "steps": 3,
            "prompts_per_step": 2,
            "group_size": 3,
            "max_tokens": 12,
            "temperature": 1.0,
            "drop_constant_groups": False,
            "adam": {"learning_rate": 1e-3},
        },
        "eval": {"every": 0, "dev_tasks": 3, "test_tasks": 3, "max_tokens": 12},
        "checkpoint_every": 1,
    }
    base.update(changes)
    return TrialConfig.model_validate(base)


def test_supervised_datum_trains_only_the_completion():
    datum = supervised_datum([1, 2, 3], [4, 5])
    assert datum.model_input.to_ints() == [1, 2, 3, 4]
    assert datum.loss_fn_inputs["target_tokens"].tolist() == [2, 3, 4, 5]
    assert datum.loss_fn_inputs["weights"].tolist() == [0.0, 0.0, 1.0, 1.0]


def test_rl_datum_aligns_sampler_logprobs_and_advantages_with_the_sampled_tokens():
    datum = rl_datum([1, 2, 3], [7, 8], [-0.5, -1.5], np.array([0.25, 0.25]))
    assert datum.loss_fn_inputs["target_tokens"].tolist() == [2, 3, 7, 8]
    assert datum.loss_fn_inputs["logprobs"].tolist() == [0.0, 0.0, -0.5, -1.5]
    assert datum.loss_fn_inputs["advantages"].tolist() == [0.0, 0.0, 0.25, 0.25]


class _ScoringSampler:
    """Answers compute_logprobs like a server that honours prompt_logprobs_last_n, and counts."""

    def __init__(self):
        self.asked: list[tuple[list[int], int | None]] = []

    def compute_logprobs(self, prompt, prompt_logprobs_last_n=None):
        from concurrent.futures import Future

        tokens = prompt.to_ints()
        self.asked.append((tokens, prompt_logprobs_last_n))
        n = prompt_logprobs_last_n or len(tokens) - 1
        future: Future = Future()
        future.set_result([None] * (len(tokens) - n) + [-0.1 * t for t in tokens[-n:]])
        return future


class _Seq:
    def __init__(self, tokens):
        self.tokens, self.logprobs = tokens, [-9.0] * len(tokens)


def test_behaviour_logprobs_rescore_only_the_completions_of_groups_that_train():
    """Away from T = 1 the old-policy logprobs are re-scored: only completions (the prompt's
    positions are never read) and only of groups not dropped for constant rewards."""
    sampler = _ScoringSampler()
    prompts = [[1, 2, 3], [4, 5]]
    groups = [[_Seq([7, 8]), _Seq([])], [_Seq([9])]]
    out = behaviour_logprobs(sampler, prompts, groups, 0.7, used=[True, False])  # type: ignore[arg-type]
    assert sampler.asked == [([1, 2, 3, 7, 8], 2)]
    assert out[0][0] == pytest.approx([-0.7, -0.8])
    assert out[0][1] == [] and out[1] == [[]]
    # At T = 1 with no filter the sampler's own logprobs are the T = 1 ones: nothing is asked.
    assert behaviour_logprobs(sampler, prompts, groups, 1.0)[1] == [[-9.0]]  # type: ignore[arg-type]
    assert len(sampler.asked) == 1


def test_a_trial_runs_end_to_end_and_records_every_step(
    sql_model_dir, sql_server, reward_pool, tmp_path
):
    events = []
    sessions_before = set(sql_server.service.sessions)
    result = run_trial(
        tiny_config(sql_model_dir),
        tmp_path / "trial",
        sql_server.url,
        "tml-tests",
        events.append,
        reward_pool,
    )
    # The trial's client session ended with it: nothing of it heartbeats on.
    own = [s for sid, s in sql_server.service.sessions.items() if sid not in sessions_before]
    assert own and all(s.finished == "success" for s in own)
    record = TrialRecord(tmp_path / "trial")
    steps = record.of_type("step")
    assert [(s["phase"], s["step"]) for s in steps] == [
        ("sft", 0),
        ("sft", 1),
        ("rl", 0),
        ("rl", 1),
        ("rl", 2),
    ]
    for step in steps[2:]:
        assert 0.0 <= step["reward_mean"] <= 1.1
        assert set(step["components"]) >= {"executes", "result", "format"}
        assert step["completion_tokens"] > 0
        assert step["groups_used"] + step["groups_dropped"] == 2
        assert "kl_sample_train_k3" in step and step["kl_sample_train_k3"] >= 0
        # The sampler's and the trainer's logprobs of the same tokens agree before the update.
        assert step["kl_sample_train_k1"] == pytest.approx(0.0, abs=1e-3)
    checkpoints = record.of_type("checkpoint")
    assert [(c["phase"], c["step"]) for c in checkpoints] == [
        ("sft", 1),
        ("sft", 2),
        ("rl", 1),
        ("rl", 2),
        ("rl", 3),
    ]
    assert all(c["path"].startswith("tinker://") for c in checkpoints)
    final = record.final()
    assert final is not None and result.checkpoint == final["checkpoint"]
    assert final["dev"]["accuracy"]["n"] == 3 and final["test"]["accuracy"]["n"] == 3
    assert 0 <= final["dev"]["accuracy"]["low"] <= final["dev"]["accuracy"]["high"] <= 1
    assert len(final["dev"]["verdicts"]) == 3
    assert any(e.get("type") == "step" for e in events)
    # Running it again does nothing: the trial is finished and its result is read back.
    again = run_trial(
        tiny_config(sql_model_dir),
        tmp_path / "trial",
        sql_server.url,
        "tml-tests",
        pool=reward_pool,
    )
    assert again.checkpoint == result.checkpoint
    assert len(TrialRecord(tmp_path / "trial").of_type("step")) == 5


def _wait_for(predicate, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise TimeoutError("condition not met in time")


def test_a_trial_killed_mid_way_resumes_to_the_record_it_would_have_had(
    sql_model_dir, sql_server, reward_pool, tmp_path
):
    config = tiny_config(
        sql_model_dir,
        rl={
            "steps": 4,
            "prompts_per_step": 2,
            "group_size": 3,
            "max_tokens": 12,
            "drop_constant_groups": False,
            "adam": {"learning_rate": 1e-3},
        },
        checkpoint_every=2,
    )
    reference = tmp_path / "reference"
    run_trial(config, reference, sql_server.url, "tml-tests", pool=reward_pool)

    interrupted = tmp_path / "interrupted"
    config_file = tmp_path / "trial.yaml"
    config_file.write_text(config.to_yaml())
    env = {**os.environ, "TINKER_API_KEY": "tml-tests"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "autoresearch",
            "trial",
            "--config",
            str(config_file),
            "--server-url",
            sql_server.url,
            "--out",
            str(interrupted),
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    record = TrialRecord(interrupted)
    try:
        # Kill it once an RL checkpoint exists and the step after it has been recorded.
        _wait_for(
            lambda: any(s["phase"] == "rl" and s["step"] >= 2 for s in record.of_type("step")),
            timeout=240,
        )
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
    assert record.final() is None

    run_trial(config, interrupted, sql_server.url, "tml-tests", pool=reward_pool)
    resumed = TrialRecord(interrupted)
    events = [e for e in resumed.of_type("event") if "resumed" in e["message"]]
    # Where it resumes depends on how far it got before the kill landed; what matters is that
    # it resumed from an RL checkpoint and redid exactly the steps after it.
    assert len(events) == 1 and events[0]["phase"] == "rl" and events[0]["step"] in (2, 4, 6)

    def comparable(rec: TrialRecord) -> list[dict]:
        return [{k: s.get(k) for k in DETERMINISTIC_STEP_FIELDS} for s in rec.of_type("step")]

    # Every step exactly once, in order, and equal to the uninterrupted run's.
    assert comparable(resumed) == comparable(TrialRecord(reference))
    final, ref_final = resumed.final(), TrialRecord(reference).final()
    assert final["dev"]["verdicts"] == ref_final["dev"]["verdicts"]
    assert json.dumps(final["test"]["accuracy"]) == json.dumps(ref_final["test"]["accuracy"])


def test_a_trial_can_start_from_a_shared_checkpoint(
    sql_model_dir, sql_server, reward_pool, tmp_path
):
    """An RL trial built on another trial's weights starts exactly there, not from scratch."""
    import tinker

    from tests.server.server_helpers import forward_logprobs

    warmup = run_trial(
        tiny_config(sql_model_dir, rl={"steps": 0}),
        tmp_path / "warmup",
        sql_server.url,
        "tml-tests",
        pool=reward_pool,
    )
    built_on = tiny_config(
        sql_model_dir,
        sft={"steps": 0},
        rl={"steps": 1, "prompts_per_step": 2, "group_size": 2, "max_tokens": 8,
            "adam": {"learning_rate": 1e-12}},
        init_checkpoint=warmup.checkpoint,
    )
    result = run_trial(built_on, tmp_path / "rl", sql_server.url, "tml-tests", pool=reward_pool)
    record = TrialRecord(tmp_path / "rl")
    assert any(e["message"] == f"started from {warmup.checkpoint}"
               for e in record.of_type("event"))
    assert [(s["phase"], s["step"]) for s in record.of_type("step")] == [("rl", 0)]

    service = tinker.ServiceClient(base_url=sql_server.url, api_key="tml-tests")
    probe = [supervised_datum([5, 6, 7, 8], [9, 10, 11])]
    start = forward_logprobs(service.create_training_client_from_state(warmup.checkpoint)
                             .result(), probe)[0]
    after = forward_logprobs(service.create_training_client_from_state(result.checkpoint)
                             .result(), probe)[0]
    fresh = forward_logprobs(service.create_lora_training_client(
        base_model=str(sql_model_dir), rank=4, seed=3).result(), probe)[0]
    np.testing.assert_allclose(after, start, atol=1e-5)  # a negligible step from the warm-up
    assert np.abs(start - fresh).max() > 1e-3  # ...which is not where a new adapter starts

    with pytest.raises(ValueError, match="rank-4 adapter"):
        run_trial(built_on.with_changes({"lora_rank": 8}), tmp_path / "mismatch",
                  sql_server.url, "tml-tests", pool=reward_pool)


def test_a_trial_with_a_kl_reference_and_no_head_lora_trains_what_it_declares(
    sql_model_dir, sql_server, reward_pool, tmp_path
):
    """KL reference logprobs are fetched for every sample of the step (all requests in flight
    together), and `train_unembed: false` reaches the server."""
    import tinker

    config = tiny_config(
        sql_model_dir,
        train_unembed=False,
        sft={"steps": 0},
        rl={**tiny_config(sql_model_dir).rl.model_dump(), "steps": 1, "kl_coef": 0.1},
    )
    result = run_trial(config, tmp_path / "trial", sql_server.url, "tml-tests", pool=reward_pool)
    step = TrialRecord(tmp_path / "trial").of_type("step")[0]
    assert step["seconds"]["reference_s"] >= 0
    assert step["groups_used"] == 2 and step["loss"] is not None
    rest = tinker.RestClient(base_url=sql_server.url, api_key="tml-tests")
    info = rest.get_weights_info_by_tinker_path(result.checkpoint).result()
    assert info.train_unembed is False


def test_train_unembed_changes_a_config_fingerprint_only_when_it_leaves_the_default(
    sql_model_dir,
):
    default = tiny_config(sql_model_dir)
    assert default.with_changes({"train_unembed": True}).fingerprint() == default.fingerprint()
    assert default.with_changes({"train_unembed": False}).fingerprint() != default.fingerprint()


@pytest.mark.parametrize("temperature", [0.6, 1.3])
def test_ratios_and_kl_compare_one_distribution_at_any_sampling_temperature(
    sql_model_dir, sql_server, reward_pool, tmp_path, temperature
):
    # The sampler draws from log_softmax(logits / T) but the trainer scores at T = 1: the
    # behaviour logprobs sent for the importance ratio are the T = 1 ones, so before the first
    # update the sampler-trainer KL is ~0 whatever the temperature.
    config = tiny_config(
        sql_model_dir,
        sft={"steps": 0},
        rl={
            "steps": 1,
            "prompts_per_step": 2,
            "group_size": 3,
            "max_tokens": 12,
            "temperature": temperature,
            "drop_constant_groups": False,
            "loss_fn": "ppo",
        },
        eval={"every": 0, "dev_tasks": 2, "test_tasks": 0, "max_tokens": 4},
    )
    run_trial(config, tmp_path / "trial", sql_server.url, "tml-tests", pool=reward_pool)
    (step,) = TrialRecord(tmp_path / "trial").of_type("step")
    assert step["completion_tokens"] > 0
    assert step["kl_sample_train_k1"] == pytest.approx(0.0, abs=1e-3)
    assert step["kl_sample_train_k3"] == pytest.approx(0.0, abs=1e-3)


def test_a_seeded_trial_gives_the_same_bits_twice_also_beside_another_trial(
    sql_model_dir, sql_server, reward_pool, tmp_path
):
    """The server is batch-invariant: the same trial run alone and then while another trial
    shares the server's batches records the same numbers, every field but the clock's."""
    from concurrent.futures import ThreadPoolExecutor

    from autoresearch.study.compare import comparable

    config = tiny_config(sql_model_dir)
    other = tiny_config(sql_model_dir, name="other", seed=11,
                        rl={**config.rl.model_dump(), "group_size": 2, "max_tokens": 9})
    run_trial(config, tmp_path / "alone", sql_server.url, "tml-tests", pool=reward_pool)
    with ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(run_trial, c, tmp_path / name, sql_server.url, "tml-tests",
                               None, reward_pool)
                   for c, name in ((config, "again"), (other, "beside"))]
        for future in futures:
            future.result()

    def numbers(directory: Path) -> list:
        record = TrialRecord(directory)
        return [comparable(e) for e in record.of_type("step") + record.of_type("eval")]

    alone, again = numbers(tmp_path / "alone"), numbers(tmp_path / "again")
    assert len(alone) == 7 and alone == again
    assert TrialRecord(tmp_path / "alone").final()["dev"] == TrialRecord(
        tmp_path / "again").final()["dev"]
    steps = TrialRecord(tmp_path / "alone").of_type("step")
    # Sampler and trainer give the sampled tokens the same bits: on-policy ratios are exactly 1.
    assert all(s["kl_sample_train_k1"] == 0.0 for s in steps if s["phase"] == "rl")


class TextDigestPool:
    """A reward pool whose training verdicts are a fixed function of the completion's text
    (about a quarter right), so a tiny random model's groups carry signals; evaluation goes to
    the real pool. Same text, same reward: reproducibility still rests on the samples' bits."""

    def __init__(self, real) -> None:
        self.real = real

    def submit(self, text, task, config):
        import hashlib
        from concurrent.futures import Future

        from rewards import ScoreResult
        from rewards.components import Components

        right = hashlib.sha1(text.encode()).digest()[0] % 4 == 0
        future: Future = Future()
        future.set_result(ScoreResult(float(right), Components(result=float(right)), right,
                                      "ok", task_id=task.id))
        return future

    def score_many(self, items, config):
        return self.real.score_many(items, config)


def _dynamic_config(model_dir: Path, **rl_changes) -> TrialConfig:
    rl = {"steps": 3, "prompts_per_step": 2, "group_size": 3, "max_tokens": 12,
          "dynamic_sampling": True, "max_groups_drawn": 6, "prompt_selection": "signal",
          "loss_aggregation": "token_mean", "adam": {"learning_rate": 1e-3}, **rl_changes}
    return tiny_config(model_dir, rl=rl)


def test_dynamic_sampling_fills_each_step_with_informative_groups_reproducibly_and_on_resume(
    sql_model_dir, sql_server, reward_pool, tmp_path
):
    """Every step trains on `prompts_per_step` groups whose rewards differ, or says the cap
    ended it; the record holds what was drawn, kept and dropped; the same seed draws the same
    groups; a trial resumed from a checkpoint rebuilds the picker and redoes the same steps."""
    import shutil

    config = _dynamic_config(sql_model_dir)
    pool = TextDigestPool(reward_pool)
    first = tmp_path / "first"
    run_trial(config, first, sql_server.url, "tml-tests", pool=pool)
    record = TrialRecord(first)
    steps = [s for s in record.of_type("step") if s["phase"] == "rl"]
    capped = {e["step"] for e in record.of_type("event") if "draw cap" in e["message"]}
    for step in steps:
        assert step["groups_drawn"] == len(step["groups"]) <= 6
        assert step["groups_used"] + step["groups_dropped"] == step["groups_drawn"]
        assert step["groups_informative"] == sum(1 for g in step["groups"] if g[3])
        assert step["samples_drawn"] == 3 * step["groups_drawn"]
        if step["draw_capped"]:
            assert step["step"] in capped and step["groups_drawn"] == 6
            assert step["groups_used"] == step["groups_informative"] < 2
        else:
            assert step["groups_used"] == 2 <= step["groups_informative"]
    assert sum(s["groups_used"] for s in steps) > 0

    again = tmp_path / "again"
    run_trial(config, again, sql_server.url, "tml-tests", pool=pool)

    def numbers(directory: Path) -> list:
        from autoresearch.study.compare import comparable

        rec = TrialRecord(directory)
        return [comparable(e) for e in rec.of_type("step") + rec.of_type("eval")]

    assert numbers(again) == numbers(first)
    # Resume: keep the record up to the checkpoint after RL step 1, then run the trial again.
    resumed = tmp_path / "resumed"
    shutil.copytree(first, resumed)
    lines = (resumed / "record.jsonl").read_text().splitlines()
    cut = next(i for i, line in enumerate(lines)
               if '"checkpoint"' in line and '"phase": "rl"' in line and '"step": 1,' in line)
    (resumed / "record.jsonl").write_text("\n".join(lines[: cut + 1]) + "\n")
    run_trial(config, resumed, sql_server.url, "tml-tests", pool=pool)
    assert numbers(resumed) == numbers(first)


def test_a_step_whose_groups_never_differ_ends_at_the_draw_cap_and_says_so(
    sql_model_dir, sql_server, reward_pool, tmp_path
):
    config = tiny_config(sql_model_dir, rl={
        "steps": 1, "prompts_per_step": 2, "group_size": 2, "max_tokens": 4,
        "dynamic_sampling": True, "max_groups_drawn": 5, "adam": {"learning_rate": 1e-3}},
        reward={"weights": {"executes": 0.0, "result": 1.0}})
    run_trial(config, tmp_path / "t", sql_server.url, "tml-tests", pool=reward_pool)
    record = TrialRecord(tmp_path / "t")
    (step,) = [s for s in record.of_type("step") if s["phase"] == "rl"]
    assert step["groups_drawn"] == 5 and step["groups_used"] == 0 and step["draw_capped"]
    assert step["sample_rounds"] >= 2
    messages = [e["message"] for e in record.of_type("event")]
    assert any("draw cap reached: 0 of 2" in m for m in messages)
    assert any("no learning signal" in m for m in messages)
