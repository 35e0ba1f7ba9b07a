"""Sampling semantics through the SDK, checked against the tiny model run by plain transformers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tinker import types

from server.engine.sampling import (
    PREFILL_PADDING,
    SHARED_PREFIX_TOKENS,
    prefill_groups,
    shared_prefixes,
)


@pytest.fixture
def base_sampler(service_client, base_model):
    return service_client.create_sampling_client(base_model=base_model).result()


def _reference_logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0].float()


def _sample(sampler, prompt: list[int], n: int = 1, **params) -> list[types.SampledSequence]:
    params.setdefault("stop", [])
    result = sampler.sample(types.ModelInput.from_ints(prompt), n, types.SamplingParams(**params))
    return result.result().sequences


def test_sampled_logprobs_are_under_the_tempered_distribution(
    base_sampler, reference_model, sequences
):
    prompt = sequences[0][:4]
    temperature = 0.5
    for seq in _sample(base_sampler, prompt, n=2, max_tokens=10, temperature=temperature, seed=1):
        tokens = list(seq.tokens)
        logits = _reference_logits(reference_model, prompt + tokens)
        rows = logits[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]
        picked = torch.tensor(tokens)[:, None]
        tempered = torch.log_softmax(rows / temperature, -1).gather(-1, picked)[:, 0].numpy()
        plain = torch.log_softmax(rows, -1).gather(-1, picked)[:, 0].numpy()
        np.testing.assert_allclose(seq.logprobs, tempered, atol=1e-4)
        assert np.max(np.abs(tempered - plain)) > 1e-2  # the two really differ here


def test_greedy_sampling_is_deterministic_and_follows_the_argmax(
    base_sampler, reference_model, sequences
):
    prompt = sequences[1][:5]
    first = _sample(base_sampler, prompt, max_tokens=12, temperature=0.0)[0]
    second = _sample(base_sampler, prompt, max_tokens=12, temperature=0.0, seed=99)[0]
    assert list(first.tokens) == list(second.tokens)
    assert list(first.logprobs) == list(second.logprobs)

    tokens, logprobs = list(prompt), []
    for _ in range(12):
        logp = torch.log_softmax(_reference_logits(reference_model, tokens)[-1], -1)
        tokens.append(int(logp.argmax()))
        logprobs.append(float(logp.max()))
    assert list(first.tokens) == tokens[len(prompt) :]
    np.testing.assert_allclose(first.logprobs, logprobs, atol=1e-4)


def test_same_seed_gives_the_same_samples_and_another_seed_does_not(base_sampler, sequences):
    prompt = sequences[2][:3]

    def draw(seed: int) -> list[list[int]]:
        return [list(s.tokens) for s in _sample(base_sampler, prompt, n=3, max_tokens=16,
                                                temperature=1.0, seed=seed)]

    assert draw(11) == draw(11)
    assert draw(11) != draw(12)
    # The samples of one request share a prefill but not a random stream.
    assert len({tuple(tokens) for tokens in draw(11)}) == 3


def test_max_tokens_is_honoured_with_stop_reason_length(base_sampler, sequences):
    for seq in _sample(base_sampler, sequences[0][:3], n=3, max_tokens=5, temperature=1.0, seed=2):
        assert len(seq.tokens) == len(seq.logprobs) == 5
        assert seq.stop_reason == "length"


def _seeded_reference(base_sampler, prompt: list[int], seed: int) -> list[int]:
    """16 tokens drawn at temperature 1 with `seed` and no stop condition.

    The same seed draws the same tokens, so a request that adds a stop condition must return
    exactly a prefix of this (the tiny model's greedy output just repeats one token).
    """
    seq = _sample(base_sampler, prompt, max_tokens=16, temperature=1.0, seed=seed)[0]
    return list(seq.tokens)


def test_stop_token_ids_end_the_sample_with_stop_reason_stop(base_sampler, sequences):
    prompt = sequences[0][:6]
    for seed in range(20):
        reference = _seeded_reference(base_sampler, prompt, seed)
        late = [t for i, t in enumerate(reference) if i >= 3 and t not in reference[:i]]
        if late:
            break
    stop_token = late[0]
    cut = reference.index(stop_token) + 1
    seq = _sample(base_sampler, prompt, max_tokens=16, temperature=1.0, seed=seed,
                  stop=[stop_token])[0]
    assert list(seq.tokens) == reference[:cut]
    assert seq.stop_reason == "stop"


def _first_cut(tokenizer, tokens: list[int], stop: str) -> int | None:
    """How many tokens it takes for the decoded text to contain `stop`."""
    return next((m for m in range(1, len(tokens) + 1) if stop in tokenizer.decode(tokens[:m])),
                None)


def test_stop_strings_end_the_sample_with_stop_reason_stop(
    base_sampler, tiny_tokenizer, sequences
):
    prompt = sequences[1][:3]
    found = None
    for seed in range(20):
        reference = _seeded_reference(base_sampler, prompt, seed)
        text = tiny_tokenizer.decode(reference)
        for piece in (text[i : i + 2] for i in range(len(text) - 1)):
            if not (piece.isascii() and piece.isprintable() and piece.strip()):
                continue
            cut = _first_cut(tiny_tokenizer, reference, piece)
            if cut is not None and cut >= 3:
                found = seed, reference, piece, cut
                break
        if found:
            break
    assert found, "no seed gave a usable stop string"
    seed, reference, stop, cut = found

    seq = _sample(base_sampler, prompt, max_tokens=16, temperature=1.0, seed=seed,
                  stop=[stop])[0]
    assert list(seq.tokens) == reference[:cut]
    assert seq.stop_reason == "stop"
    assert stop in tiny_tokenizer.decode(list(seq.tokens))


@pytest.mark.parametrize("lengths", [[300, 12, 290, 260, 14, 299, 13, 150], [5], [7, 7, 7],
                                     list(range(1, 60))])
def test_prefill_groups_take_every_prompt_once_with_little_padding(lengths):
    groups = prefill_groups(lengths)
    assert sorted(j for group in groups for j in group) == list(range(len(lengths)))
    for group in groups:
        width = lengths[group[0]]
        assert width == max(lengths[j] for j in group)
        real = sum(lengths[j] for j in group)
        assert len(group) == 1 or width * len(group) * (1 - PREFILL_PADDING) <= real


def test_shared_prefixes_group_prompts_of_one_adapter_that_begin_alike():
    schema = list(range(100, 100 + SHARED_PREFIX_TOKENS + 20))
    prompts = [schema + [1, 2], [7] * 80, schema + [3], schema[:SHARED_PREFIX_TOKENS] + [9, 9],
               schema + [1, 2], schema[:10] + [4] * 40, schema]
    one, other = object(), object()
    adapters = [one, one, one, one, other, one, one]
    groups = [(set(g.members), g.length) for g in shared_prefixes(prompts, adapters)]
    # the other adapter's prompt and the ones that share too little stay alone
    assert groups == [({0, 2, 3, 6}, SHARED_PREFIX_TOKENS)]
    whole = shared_prefixes([schema + [1], schema + [2], schema], [one] * 3)
    # every member keeps at least its last token to run
    assert [(g.members, g.length) for g in whole] == [((2, 0, 1), len(schema) - 1)]
