"""A run's numbers are bitwise the same alone and batched with other runs.

On the tiny random Gemma 3 in float32 (its fp32 matmuls are the ones whose bits depend on the
row count), and in the CUDA and MPS layouts emulated on the CPU (wholly bf16), with invariance
on: one run's forward_backward (losses,
every logprob, every gradient, the weights after a step) and one request's samples (tokens and
logprobs) are computed alone, then fused with one to three other runs of other shapes, prompt
lengths, sample counts and losses, and compared with `torch.equal` / `np.array_equal`. With
invariance off the same comparison differs, so these tests can fail.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from server.engine.engine import AdamParams, Engine, ForwardBackwardJob, SampleJob
from server.engine.invariant_attention import QUERY_CHUNK
from server.engine.jobs import SamplingParams
from server.engine.model_loading import load_base_model
from server.engine.sampling import SHARED_PREFIX_TOKENS, shared_prefixes
from server.protocol.codec import Datum
from tests.server.test_server_prefix_sharing import _named, new_state, rl_group, sft_data


@pytest.fixture(scope="module", params=["cpu", "cuda", "mps"])
def engine(tiny_model_dir, request) -> Engine:
    """The CPU's engine in float32, and each accelerator's layout emulated on the CPU (the
    model wholly in bf16) with the invariant path forced on: the bits hold there on the CPU's
    kernels, which is what the emulation can show; on the devices themselves nothing
    guarantees them, and the engine says so (`test_server_device_emulation`)."""
    if request.param == "cpu":
        engine = Engine(load_base_model(str(tiny_model_dir), device="cpu", dtype="float32"))
    else:
        engine = Engine(load_base_model(str(tiny_model_dir), emulate=request.param),
                        batch_invariant=True)
        assert engine.activation_dtype == torch.bfloat16
    assert engine.batch_invariant
    engine.fuse_invariant_runs = True  # the CPU's default is off (slower there); its bits hold
    return engine


def training_jobs(engine: Engine, others: int) -> list[ForwardBackwardJob]:
    """The run under test first, then `others` runs of other shapes and losses."""
    vocab = engine.vocab_size
    rng = np.random.default_rng(0)
    jobs = [
        ForwardBackwardJob(new_state(engine, 1), rl_group(rng, vocab, 12, [5, 9, 3, 7]),
                           "importance_sampling", {}, False)
    ]
    shapes = [(40, [2, 30]), (6, [11]), (20, [4, 4, 4, 4, 4, 4])]
    for k, (prompt, sizes) in enumerate(shapes[:others]):
        other_rng = np.random.default_rng(10 + k)
        data = (sft_data if k % 2 else rl_group)(other_rng, vocab, prompt, sizes)
        loss = "cross_entropy" if k % 2 else "ppo"
        jobs.append(ForwardBackwardJob(new_state(engine, 20 + k), data, loss, {}, False))
    return jobs


def train_first(engine: Engine, others: int):
    jobs = training_jobs(engine, others)
    result = engine.forward_backward(jobs)[0]
    state = jobs[0].state
    grads = {name: t.grad.clone() for name, t in _named(state.adapter)}
    engine.optim_step(state, AdamParams(learning_rate=1e-2))
    weights = {name: t.detach().clone() for name, t in _named(state.adapter)}
    for job in jobs[1:]:
        job.state.optimizer.zero_grad(set_to_none=True)
    return result, grads, weights


def assert_training_equal(a, b) -> None:
    assert a[0].metrics["loss:sum"] == b[0].metrics["loss:sum"]
    for x, y in zip(a[0].outputs, b[0].outputs, strict=True):
        assert np.array_equal(x["logprobs"], y["logprobs"])
    for got, want in ((a[1], b[1]), (a[2], b[2])):
        assert got.keys() == want.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), name


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("others", [1, 2, 3])
def test_a_training_run_alone_and_fused_is_bitwise_equal(engine, share, others):
    engine.share_prefixes = share
    try:
        alone = train_first(engine, 0)
        passes = engine.stats.fused_passes
        assert_training_equal(alone, train_first(engine, others))
        assert engine.stats.fused_passes > passes  # the runs did share a body pass
        assert_training_equal(alone, train_first(engine, 0))  # and again alone
    finally:
        engine.share_prefixes = True


def test_fused_passes_give_every_run_the_bits_of_its_own_passes(engine):
    """Four runs' micro-batches in shared body passes against each on its own pass (the
    engine's reference): every run's loss, logprobs and gradients."""
    outcomes = []
    for fuse in (False, True):
        engine.fuse_invariant_runs = fuse
        jobs = training_jobs(engine, 3)
        passes = engine.stats.fused_passes
        try:
            results = engine.forward_backward(jobs)
        finally:
            engine.fuse_invariant_runs = True
        assert (engine.stats.fused_passes > passes) == fuse
        grads = [[t.grad for t in job.state.adapter.parameters()] for job in jobs]
        outcomes.append((results, grads))
    (unfused, grads_a), (fused, grads_b) = outcomes
    for a, b in zip(unfused, fused, strict=True):
        assert a.metrics == b.metrics
        for x, y in zip(a.outputs, b.outputs, strict=True):
            assert np.array_equal(x["logprobs"], y["logprobs"])
    for run_a, run_b in zip(grads_a, grads_b, strict=True):
        assert all(torch.equal(x, y) for x, y in zip(run_a, run_b, strict=True))


def sample_jobs(engine: Engine, others: int, temperature: float = 1.0,
                first_length: int = 14) -> list[SampleJob]:
    rng = np.random.default_rng(3)
    vocab = engine.vocab_size
    first = SampleJob(
        new_state(engine, 1).adapter.detached(),
        rng.integers(5, vocab, size=first_length).tolist(),
        6,
        SamplingParams(max_tokens=24, temperature=temperature, seed=7, stop=[]),
        prompt_logprobs=True,
    )
    shapes = [(45, 3, 40), (5, 9, 8), (20, 1, 30)]  # prompt length, samples, max tokens
    jobs = [first]
    for k, (length, samples, max_tokens) in enumerate(shapes[:others]):
        adapter = new_state(engine, 30 + k).adapter.detached() if k != 1 else first.adapter
        jobs.append(
            SampleJob(
                adapter,
                rng.integers(5, vocab, size=length).tolist(),
                samples,
                # stop on EOS, so rows finish at different steps and leave the batch
                SamplingParams(max_tokens=max_tokens, temperature=0.8 + 0.3 * k, seed=k),
                prompt_logprobs=k == 2,
            )
        )
    return jobs


def sample_first(engine: Engine, others: int, temperature: float = 1.0,
                 first_length: int = 14):
    result = engine.sample(sample_jobs(engine, others, temperature, first_length))[0]
    return (
        [s.tokens for s in result.sequences],
        [np.asarray(s.logprobs, dtype=np.float64) for s in result.sequences],
        result.prompt_logprobs,
    )


def assert_samples_equal(a, b) -> None:
    assert a[0] == b[0]
    for x, y in zip(a[1], b[1], strict=True):
        assert np.array_equal(x, y)
    assert np.array_equal(a[2], b[2], equal_nan=True)


@pytest.mark.parametrize("temperature", [1.0, 0.0])
@pytest.mark.parametrize("others", [1, 2, 3])
def test_a_sampling_request_alone_and_fused_is_bitwise_equal(engine, others, temperature):
    alone = sample_first(engine, 0, temperature)
    assert all(len(t) == 24 for t in alone[0])
    assert_samples_equal(alone, sample_first(engine, others, temperature))


@pytest.mark.parametrize("others", [0, 3])
def test_a_long_prompt_gets_the_same_bits_alone_beside_others_and_in_training(engine, others):
    """A prompt longer than `QUERY_CHUNK` is prefilled a chunk of queries at a time, in a
    prefill group of its own length (`prefill_groups`); its samples are what it samples alone,
    and the trainer, which takes the same queries in its own chunks, gives them their bits."""
    length = QUERY_CHUNK + 44
    alone = sample_first(engine, 0, first_length=length)
    assert_samples_equal(alone, sample_first(engine, others, first_length=length))
    first, result, fb = sampled_then_trained(engine, others, first_length=length)
    for seq, out in zip(result.sequences, fb.outputs, strict=True):
        assert np.array_equal(out["logprobs"][length - 1 :],
                              np.asarray(seq.logprobs, dtype=np.float32))


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_prompts_that_share_a_prefix_get_the_bits_of_their_own_prefill(engine, temperature):
    """Requests of one adapter on one long prefix (questions on one schema) compute it once
    (`shared_prefixes`); each gets the bits it gets alone, and the trainer gives its samples
    the sampler's bits."""
    rng = np.random.default_rng(5)
    vocab = engine.vocab_size
    adapter = new_state(engine, 1).adapter.detached()
    prefix = rng.integers(5, vocab, size=SHARED_PREFIX_TOKENS + 70).tolist()
    other = rng.integers(5, vocab, size=SHARED_PREFIX_TOKENS + 28).tolist()
    prompts = [prefix + rng.integers(5, vocab, size=n).tolist() for n in (9, 3, 30, 1)]
    # a second prefix: continuations that start at other positions share forwards
    prompts += [other + rng.integers(5, vocab, size=n).tolist() for n in (8, 2)]
    prompts.append(prefix[:40] + rng.integers(5, vocab, size=4).tolist())  # shares too little
    params = SamplingParams(max_tokens=12, temperature=temperature, seed=3, stop=[])

    def job(prompt: list[int]) -> SampleJob:
        return SampleJob(adapter, prompt, 3, params)

    groups = shared_prefixes(prompts, [adapter] * len(prompts))
    assert sorted(sorted(g.members) for g in groups) == [[0, 1, 2, 3], [4, 5]]
    together = engine.sample([job(p) for p in prompts])
    engine.shared_prefill = False  # every prompt whole, all in one padded forward
    try:
        plain = engine.sample([job(p) for p in prompts])
    finally:
        engine.shared_prefill = True
    for a_result, b_result in zip(plain, together, strict=True):
        for a, b in zip(a_result.sequences, b_result.sequences, strict=True):
            assert a.tokens == b.tokens and np.array_equal(a.logprobs, b.logprobs)
    for prompt, got in zip(prompts, together, strict=True):
        alone = engine.sample([job(prompt)])[0]
        for a, b in zip(alone.sequences, got.sequences, strict=True):
            assert a.tokens == b.tokens and np.array_equal(a.logprobs, b.logprobs)
    prompt, result = prompts[2], together[2]
    data = []
    for seq in result.sequences:
        full = np.asarray(prompt + seq.tokens, dtype=np.int64)
        advantages = np.ones(len(full) - 1, np.float32)
        data.append(Datum(full[:-1], {"target_tokens": full[1:],
                                      "logprobs": np.zeros(len(full) - 1, np.float32),
                                      "advantages": advantages}))
    fb = engine.forward_backward([ForwardBackwardJob(new_state(engine, 1), data,
                                                     "importance_sampling", {}, True)])[0]
    for seq, out in zip(result.sequences, fb.outputs, strict=True):
        assert np.array_equal(out["logprobs"][len(prompt) - 1 :],
                              np.asarray(seq.logprobs, dtype=np.float32))


def test_without_invariance_fusing_changes_the_bits(tiny_model_dir):
    """The check above can fail: the fused engine gives the same run other bits."""
    fused = Engine(load_base_model(str(tiny_model_dir), device="cpu", dtype="float32"),
                   batch_invariant=False)
    alone, batched = train_first(fused, 0), train_first(fused, 3)
    differ = [name for name in alone[1] if not torch.equal(alone[1][name], batched[1][name])]
    a, b = sample_first(fused, 0), sample_first(fused, 3)
    logprobs_differ = any(not np.array_equal(x, y) for x, y in zip(a[1], b[1]))
    assert differ or logprobs_differ


def sampled_then_trained(engine: Engine, others: int, first_length: int = 14):
    """Sample a request (fused with `others`), then score prompt + each sample in training."""
    jobs = sample_jobs(engine, others, first_length=first_length)
    first = jobs[0]
    result = engine.sample(jobs)[0]
    data = []
    for seq in result.sequences:
        full = np.asarray(first.prompt + seq.tokens, dtype=np.int64)
        n = len(full) - 1
        advantages = np.zeros(n, np.float32)
        advantages[len(first.prompt) - 1 :] = 1.0
        recorded = np.zeros(n, np.float32)
        recorded[len(first.prompt) - 1 :] = seq.logprobs
        data.append(Datum(full[:-1], {"target_tokens": full[1:], "logprobs": recorded,
                                      "advantages": advantages}))
    state = new_state(engine, 1)  # the same weights the request sampled with
    fb = engine.forward_backward([ForwardBackwardJob(state, data, "importance_sampling", {},
                                                     True)])[0]
    return first, result, fb


@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("others", [0, 3])
def test_the_trainer_gives_a_sampled_token_the_samplers_bits(engine, share, others):
    engine.share_prefixes = share
    try:
        first, result, fb = sampled_then_trained(engine, others)
    finally:
        engine.share_prefixes = True
    start = len(first.prompt) - 1
    for seq, out in zip(result.sequences, fb.outputs, strict=True):
        trained = out["logprobs"][start:]
        sampled = np.asarray(seq.logprobs, dtype=np.float32)
        assert np.array_equal(trained, sampled)
        assert np.all(np.exp(trained - sampled) == 1.0)  # on-policy importance ratio: exactly 1
