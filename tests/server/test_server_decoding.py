"""Sampling on the device: per-row seeded draws, top-k/top-p, incremental stop strings."""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats

from server.engine import decoding
from server.engine.engine import Engine, SampleJob, SamplingParams


def _tokens(engine: Engine, jobs: list[SampleJob]) -> list[list[list[int]]]:
    return [[list(s.tokens) for s in r.sequences] for r in engine.sample(jobs)]


def test_a_seeded_request_samples_the_same_alone_and_among_batch_mates(engine):
    prompt = [5, 17, 42, 9]
    mine = SampleJob(None, prompt, 3, SamplingParams(max_tokens=12, temperature=1.0, seed=7,
                                                     stop=[]))
    alone = _tokens(engine, [mine])[0]
    others = [
        SampleJob(None, [8, 8, 30], 5, SamplingParams(max_tokens=3, temperature=0.7, seed=1,
                                                      stop=[])),
        SampleJob(None, [11, 2], 2, SamplingParams(max_tokens=20, temperature=1.3, top_k=5,
                                                   seed=2, stop=[])),
    ]
    crowded = _tokens(engine, [others[0], mine, others[1]])[1]
    assert crowded == alone
    assert len({tuple(t) for t in alone}) > 1  # the three samples differ from each other


def test_top_k_one_and_a_tiny_top_p_are_greedy(engine):
    prompt = [5, 17, 42, 9]
    greedy = _tokens(engine, [SampleJob(None, prompt, 1, SamplingParams(
        max_tokens=10, temperature=0.0, stop=[]))])[0][0]
    top_k = _tokens(engine, [SampleJob(None, prompt, 2, SamplingParams(
        max_tokens=10, temperature=1.5, top_k=1, seed=3, stop=[]))])[0]
    top_p = _tokens(engine, [SampleJob(None, prompt, 2, SamplingParams(
        max_tokens=10, temperature=1.5, top_p=1e-6, seed=4, stop=[]))])[0]
    assert top_k == [greedy, greedy]
    assert top_p == [greedy, greedy]


def test_top_k_draws_stay_among_the_k_most_likely_tokens():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    params = decoding.row_params(
        [1.0] * 6, [3, 3, 0, 0, 5, 1], [1.0, 1.0, 0.3, 1.0, 1.0, 1.0],
        [decoding.row_key(11, k) for k in range(6)], "cpu",
    )
    for step in range(200):
        picks, _ = decoding.choose(logits, params, step)
        for row, k in ((0, 3), (1, 3), (4, 5), (5, 1)):
            assert int(picks[row]) in torch.topk(logits[row], k).indices.tolist()


def test_the_row_uniforms_are_uniform_and_differ_by_key_and_step():
    keys = torch.tensor([decoding.row_key(seed, k) for seed in range(4) for k in range(50)])
    draws = torch.stack([decoding.uniforms(keys, step) for step in range(50)])
    assert stats.kstest(draws.flatten().numpy(), "uniform").pvalue > 1e-3
    assert len(set(draws.flatten().tolist())) > 0.99 * draws.numel()
    assert float(draws.min()) >= 0.0 and float(draws.max()) < 1.0


def test_a_stop_string_spanning_tokens_stops_without_decoding_every_step(tiny_tokenizer):
    text = "SELECT name FROM t;\n\nmore text after the stop"
    tokens = tiny_tokenizer.encode(text, add_special_tokens=False)
    calls = {"n": 0}

    def counting_decode(ids):
        calls["n"] += 1
        return tiny_tokenizer.decode(ids)

    anchor = tiny_tokenizer.encode("a", add_special_tokens=False)[0]
    pieces = decoding.TokenPieces(tiny_tokenizer.decode, anchor)
    assert not any(";\n\n" in pieces(t) for t in tokens)  # the stop spans several tokens
    rule = decoding.StopStrings([";\n\n"], pieces, counting_decode)
    cut = next(m for m in range(1, len(tokens) + 1) if rule.hit(tokens[:m]))
    assert ";\n\n" in tiny_tokenizer.decode(tokens[:cut])
    assert ";\n\n" not in tiny_tokenizer.decode(tokens[: cut - 1])
    assert calls["n"] <= 1  # decoded only to confirm the candidate


def test_the_host_side_reference_sampler_still_works_behind_its_switch(engine):
    """`device_sampling=False` keeps the old host loop (for benchmarks): greedy output equals
    the device sampler's, and its seeded rows are independent of batch-mates too."""
    prompt = [5, 17, 42, 9]
    greedy = SampleJob(None, prompt, 1, SamplingParams(max_tokens=10, temperature=0.0, stop=[]))
    seeded = SampleJob(None, prompt, 2, SamplingParams(max_tokens=8, temperature=1.0, seed=5,
                                                       stop=["zz"]))
    mate = SampleJob(None, [8, 30], 3, SamplingParams(max_tokens=4, temperature=1.0, seed=9,
                                                      stop=[]))
    on_device = _tokens(engine, [greedy])[0]
    engine.device_sampling = False
    try:
        assert _tokens(engine, [greedy])[0] == on_device
        assert _tokens(engine, [seeded])[0] == _tokens(engine, [mate, seeded])[1]
    finally:
        engine.device_sampling = True


def test_the_two_level_draw_follows_the_distribution():
    """The block-wise inverse CDF over a vocabulary of several blocks draws each token with
    its softmax probability (chi-square over 40,000 draws)."""
    vocab = 4 * decoding.CDF_BLOCK
    generator = torch.Generator().manual_seed(0)
    logits = torch.full((1, vocab), -30.0)
    chosen = torch.tensor([3, 1500, 2047, 2048, 4095])  # at block edges, across blocks
    logits[0, chosen] = torch.randn(len(chosen), generator=generator)
    probs = torch.softmax(logits[0, chosen].double(), -1).numpy()
    rows = 40_000
    params = decoding.row_params(
        [1.0] * rows, [0] * rows, [1.0] * rows,
        [decoding.row_key(9, k) for k in range(rows)], "cpu",
    )
    picks, picked_lp = decoding.choose(logits.expand(rows, vocab), params, 0)
    counts = np.array([(picks == c).sum().item() for c in chosen])
    assert counts.sum() == rows  # nothing drawn off the support
    assert stats.chisquare(counts, probs / probs.sum() * rows).pvalue > 1e-3
    expected = torch.log_softmax(logits[0], -1)[picks]
    torch.testing.assert_close(picked_lp, expected, atol=1e-5, rtol=0)
