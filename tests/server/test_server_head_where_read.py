"""The output head runs only where the loss reads it, and nothing the loss sees changes.

`forward_backward` skips Gemma's vocabulary-wide head at positions its loss gives no weight
(an SFT prompt, an RL prompt) and returns 0.0 there; `forward` still scores every position.
Each loss is run with the reference (`head_where_read=False`, every position scored) from the
same adapter: the loss, the gradients and the logprobs the loss reads are the same (to the bit
on the invariant path), and the head saw only the positions read.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from server.engine import losses
from server.engine.engine import Engine, ForwardBackwardJob
from server.engine.lora import LoraSpec
from server.engine.loss_positions import loss_positions
from server.engine.model_loading import load_base_model
from server.protocol.codec import Datum

PROMPT, COMPLETIONS = 24, (7, 11, 5)
LOSS_CONFIGS = {"dro": {"beta": 0.05}}


@pytest.fixture(scope="module", params=["invariant", "packed", "padded"])
def engine(tiny_model_dir, request) -> Engine:
    """The three training paths: invariant packed rows (the CPU default), fused packed rows
    with shared prefixes, and padded micro-batches."""
    engine = Engine(
        load_base_model(str(tiny_model_dir), device="cpu", dtype="float32"),
        batch_invariant=request.param == "invariant",
    )
    engine.share_prefixes = request.param == "packed"
    return engine


def datums(vocab: int, loss_fn: str, seed: int = 0) -> list[Datum]:
    """A shared prompt with no weight, then each completion's tokens, as the cookbook sends:
    SFT weights on the completion; RL advantages and sampled logprobs on it, 0 on the prompt."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(5, vocab, size=PROMPT)
    data = []
    for size in COMPLETIONS:
        full = np.concatenate([prompt, rng.integers(5, vocab, size=size)])
        n = len(full) - 1
        sampled = np.zeros(n, np.float32)
        sampled[PROMPT - 1 :] = 1.0
        if loss_fn == "cross_entropy":
            inputs = {"weights": sampled}
        else:
            inputs = {
                "logprobs": sampled * rng.normal(-2.0, 0.3, size=n).astype(np.float32),
                "advantages": sampled * np.float32(rng.normal()),
            }
            if loss_fn in losses.NEEDS_SAMPLING_RECORD:
                inputs[losses.RECORDED_LOGPROBS] = inputs.pop("logprobs")
                inputs[losses.RECORDED_MASK] = sampled
        data.append(Datum(full[:-1], {"target_tokens": full[1:], **inputs}))
    return data


def train(engine: Engine, loss_fn: str, where_read: bool, monkeypatch, forward_only=False):
    """One forward_backward from a fixed adapter: result, gradients, head positions scored."""
    state = engine.create_run(LoraSpec(rank=4), seed=3)
    with torch.no_grad():  # a non-zero B, so every LoRA path carries gradient
        generator = torch.Generator().manual_seed(103)
        for b in state.adapter.b.values():
            b.normal_(0, 0.05, generator=generator)
    scored: list[int] = []
    original = engine._gather_head

    def counting(hidden, *rest):
        scored.append(hidden.shape[0])
        return original(hidden, *rest)

    monkeypatch.setattr(engine, "_gather_head", counting)
    monkeypatch.setattr(engine, "head_where_read", where_read)
    data = datums(engine.vocab_size, loss_fn)
    job = ForwardBackwardJob(state, data, loss_fn, LOSS_CONFIGS.get(loss_fn, {}), forward_only)
    result = engine.forward_backward([job])[0]
    grads = {
        f"{name}.{side}": getattr(state.adapter, side)[name].grad
        for name in sorted(state.adapter.a)
        for side in ("a", "b")
    }
    monkeypatch.undo()
    return result, grads, sum(scored), data


@pytest.mark.parametrize("loss_fn", sorted(losses.LOSSES))
def test_every_loss_trains_the_same_with_the_head_only_where_read(engine, loss_fn, monkeypatch):
    got, got_grads, got_scored, data = train(engine, loss_fn, True, monkeypatch)
    want, want_grads, want_scored, _ = train(engine, loss_fn, False, monkeypatch)
    exact = engine.batch_invariant
    assert got.metrics["loss:sum"] == pytest.approx(
        want.metrics["loss:sum"], rel=0 if exact else 1e-5, abs=0 if exact else 1e-5
    )
    read_total = 0
    for datum, a, b in zip(data, got.outputs, want.outputs, strict=True):
        read, _ = loss_positions(loss_fn, datum.inputs, np.ones(len(datum.tokens), dtype=bool))
        read_total += int(read.sum())
        assert (a["logprobs"][~read] == 0.0).all()
        if exact:
            np.testing.assert_array_equal(a["logprobs"][read], b["logprobs"][read])
        else:
            np.testing.assert_allclose(a["logprobs"][read], b["logprobs"][read], atol=1e-5)
    for name, want_grad in want_grads.items():
        assert want_grad is not None and float(want_grad.abs().sum()) > 0, name
        if exact:
            torch.testing.assert_close(got_grads[name], want_grad, rtol=0, atol=0)
        else:
            torch.testing.assert_close(got_grads[name], want_grad, rtol=1e-4, atol=1e-6)
    if loss_fn == "dro":  # its quadratic term reads every position: nothing to skip
        assert got_scored == want_scored
    else:
        assert got_scored < want_scored
        assert read_total < sum(len(d.tokens) for d in data)


def test_the_head_sees_only_the_positions_read(engine, monkeypatch):
    """An SFT batch whose prompt weighs 0: the head scores each weighted position once (the
    shared prompt's last position once per packed row), and once more in backward where its
    chunk is checkpointed; never an unweighted one."""
    _, _, scored, data = train(engine, "cross_entropy", True, monkeypatch)
    distinct = sum(int((d.inputs["weights"] != 0).sum()) for d in data)
    if engine.share_prefixes:
        distinct -= len(data) - 1  # the prompt's last position predicts each first token
    assert scored in (distinct, 2 * distinct)


def test_forward_still_scores_every_position(engine, monkeypatch):
    result, _, scored, data = train(engine, "cross_entropy", True, monkeypatch, forward_only=True)
    for datum, output in zip(data, result.outputs, strict=True):
        assert (output["logprobs"] < 0).all() and len(output["logprobs"]) == len(datum.tokens)
    distinct = sum(len(d.tokens) for d in data)
    if engine.share_prefixes:
        distinct -= (len(data) - 1) * PROMPT
    assert scored == distinct


def test_a_batch_its_loss_reads_nowhere_skips_the_head_and_trains_nothing(engine, monkeypatch):
    state = engine.create_run(LoraSpec(rank=4), seed=4)
    data = [
        Datum(d.tokens, {**d.inputs, "weights": np.zeros_like(d.inputs["weights"])})
        for d in datums(engine.vocab_size, "cross_entropy")
    ]
    scored: list[int] = []
    original = engine._gather_head
    monkeypatch.setattr(
        engine, "_gather_head", lambda h, *rest: scored.append(h.shape[0]) or original(h, *rest)
    )
    result = engine.forward_backward([ForwardBackwardJob(state, data, "cross_entropy", {}, False)])
    assert scored == [] and result[0].metrics["loss:sum"] == 0.0
    assert all((out["logprobs"] == 0.0).all() for out in result[0].outputs)
    grads = [t.grad for t in (*state.adapter.a.values(), *state.adapter.b.values())]
    assert all(g is None or float(g.abs().sum()) == 0.0 for g in grads)
