"""Shared-prefix forward_backward equals the unshared computation.

Datums that start with the same prompt are packed into one row with the prompt computed once.
Each case below runs the same jobs with sharing on and off on the tiny random Gemma 3 (its
sliding window is 32 tokens) and compares the loss, every returned per-token logprob, every
adapter gradient and the adapter after the next optimizer step.

Tolerance: float32 with the attention computed over differently shaped rows, so sums happen
in another order: logprobs and losses to 1e-5 relative (1e-5 absolute); gradients and stepped
weights to 1e-4 relative plus 1e-5 of the tensor's largest entry (at least 1e-5) absolute.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from server.engine import packed_attention, prefix_sharing
from server.engine.engine import AdamParams, Engine, ForwardBackwardJob
from server.engine.lora import LoraSpec
from server.engine.model_loading import load_base_model
from server.protocol.codec import Datum

RTOL_LP, ATOL_LP = 1e-5, 1e-5
RTOL_GRAD, ATOL_GRAD = 1e-4, 1e-5


@pytest.fixture(scope="module", params=[True, False], ids=["invariant", "fused"])
def engine(tiny_model_dir, request) -> Engine:
    """Both attention paths: the batch-invariant one (the default) and SDPA on packed rows."""
    return Engine(load_base_model(str(tiny_model_dir), device="cpu", dtype="float32"),
                  batch_invariant=request.param)


def rl_group(rng, vocab: int, prompt_len: int, sizes: list[int]) -> list[Datum]:
    """GRPO-shaped datums: one prompt, several completions, advantages on completions only."""
    prompt = rng.integers(5, vocab, size=prompt_len)
    data = []
    for size in sizes:
        completion = rng.integers(5, vocab, size=size)
        full = np.concatenate([prompt, completion])
        n = len(full) - 1
        advantages = np.zeros(n, np.float32)
        advantages[prompt_len - 1 :] = rng.normal()
        logprobs = np.zeros(n, np.float32)
        logprobs[prompt_len - 1 :] = rng.normal(-2.0, 0.3, size=size)
        data.append(
            Datum(
                full[:-1],
                {"target_tokens": full[1:], "logprobs": logprobs, "advantages": advantages},
            )
        )
    return data


def sft_data(rng, vocab: int, prompt_len: int, sizes: list[int]) -> list[Datum]:
    """Cross-entropy datums sharing a prompt, weighted on part of the prompt too."""
    prompt = rng.integers(5, vocab, size=prompt_len)
    data = []
    for size in sizes:
        full = np.concatenate([prompt, rng.integers(5, vocab, size=size)])
        weights = np.ones(len(full) - 1, np.float32)
        weights[: prompt_len // 2] = 0.0
        data.append(Datum(full[:-1], {"target_tokens": full[1:], "weights": weights}))
    return data


def new_state(engine: Engine, seed: int, rank: int = 4):
    state = engine.create_run(LoraSpec(rank=rank), seed=seed)
    with torch.no_grad():  # a non-zero B, so every LoRA path carries gradient
        generator = torch.Generator().manual_seed(seed + 100)
        for b in state.adapter.b.values():
            b.normal_(0, 0.05, generator=generator)
    return state


def run(engine: Engine, share: bool, make_jobs):
    """Run the jobs once; return results, gradients and adapters after one optimizer step."""
    engine.share_prefixes = share
    jobs = make_jobs()
    results = engine.forward_backward(jobs)
    grads, stepped = [], []
    for job in jobs:
        if job.forward_only:
            grads.append(None)
            stepped.append(None)
            continue
        adapter = job.state.adapter
        grads.append({name: t.grad.clone() for name, t in _named(adapter)})
        engine.optim_step(job.state, AdamParams(learning_rate=1e-2))
        stepped.append({name: t.detach().clone() for name, t in _named(adapter)})
    return results, grads, stepped


def _named(adapter):
    for name in sorted(adapter.a):
        yield f"{name}.a", adapter.a[name]
        yield f"{name}.b", adapter.b[name]


def assert_same(engine: Engine, make_jobs) -> None:
    shared = run(engine, True, make_jobs)
    plain = run(engine, False, make_jobs)
    for got, want in zip(shared[0], plain[0], strict=True):
        assert got.metrics["loss:sum"] == pytest.approx(
            want.metrics["loss:sum"], rel=RTOL_LP, abs=ATOL_LP
        )
        for a, b in zip(got.outputs, want.outputs, strict=True):
            assert a["logprobs"].shape == b["logprobs"].shape
            np.testing.assert_allclose(a["logprobs"], b["logprobs"], rtol=RTOL_LP, atol=ATOL_LP)
    for got_all, want_all in ((shared[1], plain[1]), (shared[2], plain[2])):
        for got, want in zip(got_all, want_all, strict=True):
            if want is None:
                continue
            assert got.keys() == want.keys()
            for name in want:
                scale = float(want[name].abs().max())
                torch.testing.assert_close(
                    got[name], want[name], rtol=RTOL_GRAD, atol=ATOL_GRAD * max(scale, 1.0)
                )
    assert any(float(g.abs().sum()) > 0 for g in plain[1][0].values())


def test_a_group_shares_its_prompt_and_matches(engine):
    rng = np.random.default_rng(0)
    data = rl_group(rng, engine.vocab_size, 20, [6, 9, 4, 7])
    twin = data[0]  # two equal samples (a peaked model draws them): one datum is all prefix
    data.append(
        Datum(twin.tokens.copy(), {**twin.inputs, "advantages": -twin.inputs["advantages"] * 0.5})
    )
    assert_same(
        engine,
        lambda: [ForwardBackwardJob(new_state(engine, 1), data, "importance_sampling", {}, False)],
    )


@pytest.mark.parametrize("loss_fn", ["ppo", "cispo", "dro"])
def test_mixed_groups_singletons_and_losses_match(engine, loss_fn):
    rng = np.random.default_rng(1)
    vocab = engine.vocab_size
    data = (
        rl_group(rng, vocab, 16, [5, 8, 3])
        + rl_group(rng, vocab, 12, [7])  # a group of one
        + rl_group(rng, vocab, 24, [2, 6])
    )
    rng.shuffle(data)  # group members need not be adjacent
    config = {"beta": 0.1} if loss_fn == "dro" else {}
    assert_same(
        engine, lambda: [ForwardBackwardJob(new_state(engine, 2), data, loss_fn, config, False)]
    )


def test_cross_entropy_weighted_on_shared_prompt_positions_matches(engine):
    rng = np.random.default_rng(2)
    data = sft_data(rng, engine.vocab_size, 18, [5, 7, 9])
    assert_same(
        engine, lambda: [ForwardBackwardJob(new_state(engine, 3), data, "cross_entropy", {}, False)]
    )


def test_fused_runs_share_only_within_their_own_adapter(engine):
    """Two runs train on the very same prompts, a third only runs forward: each run's gradient
    and step equal its unshared one (sharing across adapters would mix them)."""
    rng = np.random.default_rng(3)
    vocab = engine.vocab_size
    first = rl_group(rng, vocab, 20, [5, 6, 7])
    second = [
        Datum(
            d.tokens.copy(),
            {k: v * -0.5 for k, v in d.inputs.items() if k != "target_tokens"}
            | {"target_tokens": d.inputs["target_tokens"]},
        )
        for d in first
    ] + rl_group(rng, vocab, 15, [4, 4])
    third = sft_data(rng, vocab, 20, [3, 4])

    def jobs():
        return [
            ForwardBackwardJob(new_state(engine, 4), first, "importance_sampling", {}, False),
            ForwardBackwardJob(new_state(engine, 5), second, "importance_sampling", {}, False),
            ForwardBackwardJob(new_state(engine, 6), third, "cross_entropy", {}, True),
        ]

    assert_same(engine, jobs)


def test_prefixes_longer_than_the_sliding_window_match(engine):
    window = engine.model.config.sliding_window
    rng = np.random.default_rng(4)
    data = rl_group(rng, engine.vocab_size, window + 25, [window + 10, 12, 3])
    assert_same(
        engine,
        lambda: [ForwardBackwardJob(new_state(engine, 7), data, "importance_sampling", {}, False)],
    )


def test_groups_too_long_for_one_row_are_split_and_still_match(engine, monkeypatch):
    monkeypatch.setattr(prefix_sharing, "ROW_TOKENS", 60)
    rng = np.random.default_rng(5)
    data = rl_group(rng, engine.vocab_size, 30, [12, 15, 11, 14, 13])
    assert_same(
        engine,
        lambda: [ForwardBackwardJob(new_state(engine, 8), data, "importance_sampling", {}, False)],
    )


@pytest.fixture(scope="module")
def fused_engine(tiny_model_dir) -> Engine:
    return Engine(load_base_model(str(tiny_model_dir), device="cpu", dtype="float32"),
                  batch_invariant=False)


def test_rows_of_many_query_chunks_match_and_their_masks_stay_linear(fused_engine, monkeypatch):
    """With 16-query chunks a row of ~200 columns takes 13 attention calls per layer; each mask
    is at most `chunk x width` (never `width x width`) and skips the other continuations (the
    SDPA path; the batch-invariant one has its own tests)."""
    engine = fused_engine
    monkeypatch.setattr(packed_attention, "QUERY_CHUNK", 16)
    calls: list[tuple[int, int, int]] = []
    real_sdpa = packed_attention.scaled_dot_product_attention

    def recording(query, key, value, attn_mask=None, **kwargs):
        calls.append((query.shape[2], key.shape[2], attn_mask.shape[-1]))
        return real_sdpa(query, key, value, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(packed_attention, "scaled_dot_product_attention", recording)
    window = engine.model.config.sliding_window
    rng = np.random.default_rng(6)
    data = rl_group(rng, engine.vocab_size, window + 9, [40, 37, 45, 33])
    assert_same(
        engine,
        lambda: [ForwardBackwardJob(new_state(engine, 9), data, "importance_sampling", {}, False)],
    )
    prompt = window + 9
    width = prompt + sum(len(d.tokens) - prompt for d in data)
    assert calls, "packed rows did not go through packed_attention"
    assert max(q for q, _, _ in calls) <= 16
    assert all(k == m for _, k, m in calls)
    # A chunk spans at most two continuations: it sees the prompt and those, never the row.
    assert max(k for _, k, _ in calls) <= prompt + 2 * 45 < width
    pairs_per_layer = sum(q * k for q, k, _ in calls) / engine.model.config.num_hidden_layers
    assert pairs_per_layer < 0.75 * width * (width + 1) / 2  # fewer than causal dense pairs


def test_a_packed_layout_lets_a_continuation_see_the_prompt_and_itself_only():
    # columns: prompt (0, 1), member 1 (2, 3), member 2 (4), padding (5)
    segments = torch.tensor([[0, 0, 1, 1, 2, -1]])
    positions = torch.tensor([[0, 1, 2, 3, 2, 3]])
    layout = packed_attention.PackedLayout(segments, positions, window=None)
    keys = torch.arange(6)
    seen = layout.allowed(0, 6, keys)[0, 0].int().tolist()
    assert seen == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 0, 0, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]
    assert layout.needed_keys(4, 5).tolist() == [0, 1, 4]
    sliding = packed_attention.PackedLayout(segments, positions, window=2)
    # member 2's column (position 2) is two positions from the prompt's first token: out.
    assert sliding.allowed(4, 5, keys)[0, 0, 0].int().tolist() == [0, 1, 0, 0, 1, 0]


def test_the_plan_computes_a_shared_prompt_once_per_adapter():
    prompt = np.arange(100, 140)
    sequences = [np.concatenate([prompt, np.full(5 + i, 7 + i)]) for i in range(4)]
    sequences.append(np.arange(500, 520))
    rows = prefix_sharing.plan_rows(sequences + sequences[:2], ["a"] * 5 + ["b"] * 2)
    by_key = {}
    for row in rows:
        by_key.setdefault(row.key, []).append(row)
    # Adapter "a": one row for the group (prompt once, then 4 continuations) and one singleton.
    group_row = next(r for r in by_key["a"] if len(r.members) == 4)
    assert len(group_row.tokens) == 40 + sum(5 + i for i in range(4))
    # Adapter "b" gets its own row even though its prompts equal "a"'s.
    assert [sorted(r.members) for r in by_key["b"]] == [[5, 6]]
    for row in rows:
        for member, columns in zip(row.members, row.columns, strict=True):
            index = member if member < 5 else member - 5
            np.testing.assert_array_equal(row.tokens[columns], sequences[index])
            np.testing.assert_array_equal(row.positions[columns], np.arange(len(columns)))


def test_short_common_prefixes_are_not_shared():
    a = np.array([1, 2, 3, 10, 11, 12, 13, 14, 15, 16])
    b = np.array([1, 2, 3, 20, 21, 22, 23, 24, 25, 26])
    rows = prefix_sharing.plan_rows([a, b], ["k", "k"])
    assert sorted(len(r.members) for r in rows) == [1, 1]


def test_prompt_logprobs_of_many_sequences_are_scored_together_and_match(engine):
    """Reference scoring (compute_logprobs) of a group's samples shares their prompt too."""
    from server.engine.engine import SampleJob, SamplingParams

    rng = np.random.default_rng(6)
    window = engine.model.config.sliding_window
    prompt = list(rng.integers(5, engine.vocab_size, size=window + 9))
    adapter = new_state(engine, 9).adapter
    sequences = [prompt + list(rng.integers(5, engine.vocab_size, size=n)) for n in (4, 7, 1)]
    jobs = [
        SampleJob(owner, seq, 1, SamplingParams(max_tokens=0), prompt_logprobs=True)
        for owner in (None, adapter)
        for seq in sequences
    ] + [SampleJob(None, [7], 1, SamplingParams(max_tokens=0), prompt_logprobs=True)]
    engine.share_prefixes = True
    together = engine.sample(jobs)
    for job, result in zip(jobs, together, strict=True):
        alone, _ = engine.prompt_logprobs(job.adapter, job.prompt)
        assert np.isnan(result.prompt_logprobs[0])
        np.testing.assert_allclose(
            result.prompt_logprobs[1:], alone[1:], rtol=RTOL_LP, atol=ATOL_LP
        )


def count_head_positions(engine, monkeypatch) -> list[int]:
    """From now on, the number of positions each output-head call scores, in call order."""
    scored: list[int] = []
    original = engine._gather_head

    def counting(hidden, *rest):
        scored.append(hidden.shape[0])
        return original(hidden, *rest)

    monkeypatch.setattr(engine, "_gather_head", counting)
    return scored


@pytest.mark.parametrize("where_read", [True, False], ids=["where-read", "every-position"])
def test_the_output_head_scores_each_distinct_position_once(engine, monkeypatch, where_read):
    """A group's prompt positions (no advantage, no sampled logprob) skip the vocabulary-wide
    head in forward_backward; with the reference `head_where_read=False` they go through it
    once, not once per sample. No position is scored twice either way."""
    rng = np.random.default_rng(7)
    sizes = [6, 9, 4, 7]
    data = rl_group(rng, engine.vocab_size, 30, sizes)
    scored = count_head_positions(engine, monkeypatch)
    engine.share_prefixes = True
    monkeypatch.setattr(engine, "head_where_read", where_read)
    engine.forward_backward(
        [ForwardBackwardJob(new_state(engine, 10), data, "importance_sampling", {}, False)]
    )
    # model_input is prompt + completion[:-1]: 30 shared positions (the last one, which predicts
    # each sample's first token, carries advantage), then each sample's own.
    distinct = 30 + sum(size - 1 for size in sizes)
    active = 1 + sum(size - 1 for size in sizes)
    # Each position read goes through the head once (backward recomputes inside the head).
    assert sum(scored) == (active if where_read else distinct)


def test_prompt_logprobs_last_n_scores_only_the_suffix_and_matches(engine, monkeypatch):
    """`prompt_logprobs_last_n` (the SDK's): the last N positions equal a whole-prompt score,
    earlier ones are unscored (NaN, the SDK's None), and only the N positions (once per shared
    prompt, not per sample) go through the vocabulary-wide head."""
    from server.engine.engine import SampleJob, SamplingParams

    rng = np.random.default_rng(8)
    prompt = list(rng.integers(5, engine.vocab_size, size=20))
    adapter = new_state(engine, 11).adapter
    completions = [list(rng.integers(5, engine.vocab_size, size=n)) for n in (5, 3, 8)]

    def jobs(last: bool) -> list[SampleJob]:
        return [SampleJob(adapter, prompt + c, 1, SamplingParams(max_tokens=0),
                          prompt_logprobs=True,
                          prompt_logprobs_last_n=len(c) if last else None)
                for c in completions]

    engine.share_prefixes = True
    whole = engine.sample(jobs(False))
    scored = count_head_positions(engine, monkeypatch)
    suffix = engine.sample(jobs(True))
    # The prompt's last position (it predicts every completion's first token) is shared.
    assert sum(scored) == 1 + sum(len(c) - 1 for c in completions)
    same = (np.testing.assert_array_equal if engine.batch_invariant else
            lambda a, b: np.testing.assert_allclose(a, b, rtol=RTOL_LP, atol=ATOL_LP))
    for c, full, part in zip(completions, whole, suffix, strict=True):
        assert np.isnan(part.prompt_logprobs[: len(prompt)]).all()
        same(part.prompt_logprobs[-len(c):], full.prompt_logprobs[-len(c):])
    # One request alone takes the unpacked path; top-k rows before the suffix are padding.
    job = SampleJob(adapter, prompt + completions[0], 1, SamplingParams(max_tokens=0),
                    prompt_logprobs=True, topk_prompt_logprobs=3, prompt_logprobs_last_n=2)
    alone = engine.sample([job])[0]
    reference, top = engine.prompt_logprobs(adapter, job.prompt, 3)
    assert np.isnan(alone.prompt_logprobs[:-2]).all()
    np.testing.assert_allclose(alone.prompt_logprobs[-2:], reference[-2:], rtol=RTOL_LP,
                               atol=ATOL_LP)
    ids, lps = alone.topk_prompt
    assert (ids[:-2] == 0).all() and (lps[:-2] == -99999.0).all()
    np.testing.assert_array_equal(ids[-2:], top[0][-2:])


@pytest.mark.parametrize(("last_n", "logprobs", "message"), [
    (0, True, "between 1 and"),
    (20, True, "between 1 and"),
    (3, False, "applies to prompt logprobs"),
])
def test_a_prompt_logprobs_last_n_outside_the_prompt_is_refused(engine, last_n, logprobs,
                                                                 message):
    from server.engine.engine import SampleJob, SamplingParams, UserError

    job = SampleJob(None, list(range(5, 25)), 1, SamplingParams(max_tokens=0),
                    prompt_logprobs=logprobs, prompt_logprobs_last_n=last_n)
    with pytest.raises(UserError, match=message):
        engine.validate_sample(job)


def test_a_backend_that_scores_the_whole_prompt_is_masked_to_the_suffix():
    """vLLM scores every prompt position; the answer keeps only what was asked for."""
    from server.engine.engine import SampleJob, SamplingParams
    from server.engine.jobs import TOPK_PAD_ID, TOPK_PAD_LOGPROB, mask_unscored
    from server.protocol.codec import SampleResult

    job = SampleJob(None, [1, 2, 3, 4, 5], 1, SamplingParams(max_tokens=0),
                    prompt_logprobs=True, topk_prompt_logprobs=2, prompt_logprobs_last_n=2)
    values = np.array([np.nan, -1.0, -2.0, -3.0, -4.0], np.float32)
    ids = np.arange(10, dtype=np.int32).reshape(5, 2)
    lps = -np.ones((5, 2), np.float32)
    result = mask_unscored(SampleResult([], values, (ids, lps)), job)
    assert np.isnan(result.prompt_logprobs[:3]).all()
    assert result.prompt_logprobs[3:].tolist() == [-3.0, -4.0]
    assert (result.topk_prompt[0][:3] == TOPK_PAD_ID).all()
    assert (result.topk_prompt[1][:3] == TOPK_PAD_LOGPROB).all()
    assert result.topk_prompt[0][3:].tolist() == [[6, 7], [8, 9]]


@pytest.mark.parametrize("device_sampling", [True, False], ids=["device", "host"])
def test_a_one_token_request_with_prompt_logprobs_takes_its_token_from_the_scoring_pass(
        engine, monkeypatch, device_sampling):
    """The SDK's compute_logprobs asks for one token beside the prompt's logprobs. Under
    invariance that token comes from the packed scoring forward (no second prefill), and it
    is the token, logprob and stop flag a plain one-token request draws, bit for bit."""
    from server.engine.engine import SampleJob, SamplingParams

    rng = np.random.default_rng(9)
    adapter = new_state(engine, 12).adapter
    prompt = list(rng.integers(5, engine.vocab_size, size=16))
    sequences = [prompt + list(rng.integers(5, engine.vocab_size, size=n)) for n in (3, 6)]

    def jobs(logprobs: bool) -> list[SampleJob]:
        return [SampleJob(owner, seq, 2, SamplingParams(max_tokens=1, temperature=t, seed=s),
                          prompt_logprobs=logprobs)
                for owner in (None, adapter) for seq in sequences
                for t, s in ((1.0, 3), (0.7, 4))]

    engine.share_prefixes = True
    monkeypatch.setattr(engine, "device_sampling", device_sampling)
    plain = engine.sample(jobs(False))
    prefills = []
    original = engine._prefill_aligned
    monkeypatch.setattr(engine, "_prefill_aligned",
                        lambda batch: prefills.append(len(batch)) or original(batch))
    scored = engine.sample(jobs(True))
    for a, b in zip(plain, scored, strict=True):
        assert not np.isnan(b.prompt_logprobs[1:]).any()
        for x, y in zip(a.sequences, b.sequences, strict=True):
            if engine.batch_invariant:
                assert (x.tokens, x.logprobs, x.stopped) == (y.tokens, y.logprobs, y.stopped)
            assert len(y.tokens) == 1
    if engine.batch_invariant:  # the fused path prefills another way, and keeps doing so
        assert prefills == []
