"""The fused output head: the plain head's logprobs and gradients, a vocabulary block at a time.

Checked against the plain computation (full logits, LoRA delta, soft cap, log-softmax, gather,
autograd) on random weights cut into several uneven blocks, with two adapters and unrouted rows
in one batch and repeated pairs; that no `[positions, vocabulary]` fp32 tensor is ever made in
forward or backward; and, on the tiny Gemma with small blocks, that the sampler's logprob of each
drawn token is still bitwise what the trainer computes for it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from server.engine import fused_head
from server.engine.engine import Engine, ForwardBackwardJob, SampleJob, SamplingParams
from server.engine.invariance import row_invariant
from server.engine.lora import LoraSpec
from server.engine.model_loading import load_base_model
from server.protocol.codec import Datum

VOCAB, HIDDEN, RANK, POSITIONS = 1000, 48, 4, 20
CAP = 30.0


def operands(dtype: torch.dtype):
    """Hidden states, a head weight, two adapters' head factors, pairs (some repeated)."""
    g = torch.Generator().manual_seed(0)
    hidden = (torch.randn(POSITIONS, HIDDEN, generator=g) * 2).to(dtype).requires_grad_(True)
    weight = torch.randn(VOCAB, HIDDEN, generator=g).to(dtype)
    factors = [
        (
            (torch.randn(RANK, HIDDEN, generator=g) * 0.2).requires_grad_(True),
            (torch.randn(VOCAB, RANK, generator=g) * 0.2).requires_grad_(True),
        )
        for _ in range(2)
    ]
    # Rows 0-7 on the first adapter, 8-14 on the second, 15-19 on none.
    deltas = [
        fused_head.HeadDelta(0, 8, *factors[0], 2.0),
        fused_head.HeadDelta(8, 15, *factors[1], 8.0),
    ]
    pos = torch.tensor([0, 0, 0, 3, 5, 9, 9, 12, 14, 15, 19, 19, 7])
    tgt = torch.tensor([1, 1, 999, 500, 17, 0, 640, 640, 123, 321, 998, 2, 77])
    return hidden, weight, deltas, pos, tgt


def reference(hidden, weight, deltas, pos, tgt):
    """The plain head: every position's full fp32 logits, as the engine computed it before."""
    logits = F.linear(hidden, weight).float()
    pieces = []
    for d in deltas:
        delta = ((hidden[d.start : d.stop].float() @ d.a.T) * d.scale) @ d.b.T
        pieces.append(F.pad(delta, (0, 0, d.start, POSITIONS - d.stop)))
    logits = logits + sum(pieces)
    logits = torch.tanh(logits / CAP) * CAP
    return torch.log_softmax(logits, -1)[pos, tgt]


def gradients(values, hidden, deltas):
    weights = torch.linspace(-1.0, 2.0, len(values))
    (values * weights).sum().backward()
    grads = [hidden.grad.float().clone()] + [t.grad.clone() for d in deltas for t in (d.a, d.b)]
    hidden.grad = None
    for d in deltas:
        d.a.grad = d.b.grad = None
    return grads


@pytest.mark.parametrize("block", [VOCAB, 333, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_fused_head_gives_the_plain_heads_logprobs_and_gradients(monkeypatch, block, dtype):
    monkeypatch.setattr(fused_head, "VOCAB_BLOCK", block)
    hidden, weight, deltas, pos, tgt = operands(dtype)
    fused = fused_head.fused_logprobs(hidden, pos, tgt, weight, CAP, deltas)
    fused_grads = gradients(fused, hidden, deltas)
    plain = reference(hidden, weight, deltas, pos, tgt)
    plain_grads = gradients(plain, hidden, deltas)
    tight = dtype == torch.float32
    torch.testing.assert_close(fused, plain, rtol=0, atol=2e-5 if tight else 1e-4)
    for mine, theirs in zip(fused_grads, plain_grads, strict=True):
        scale = float(theirs.abs().max())
        assert scale > 0
        torch.testing.assert_close(mine, theirs, rtol=0, atol=(1e-5 if tight else 2e-2) * scale)


def test_rows_of_no_adapter_get_no_delta_and_adapters_only_their_rows_gradient():
    hidden, weight, deltas, pos, tgt = operands(torch.float32)
    values = fused_head.fused_logprobs(hidden, pos, tgt, weight, CAP, deltas[:1])
    values[pos >= 8].sum().backward()  # only rows outside the first adapter's
    assert float(deltas[0].a.grad.abs().sum()) == 0.0 and float(deltas[0].b.grad.abs().sum()) == 0.0
    assert float(hidden.grad[8:].abs().sum()) > 0.0 and float(hidden.grad[:8].abs().sum()) == 0.0


class LargestFloat(TorchDispatchMode):
    """The most elements of any fp32 tensor an operation produced."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.largest = max(self.largest, t.numel())
        return out


def test_no_positions_by_vocabulary_fp32_tensor_in_forward_or_backward(monkeypatch):
    monkeypatch.setattr(fused_head, "VOCAB_BLOCK", 250)
    hidden, weight, deltas, pos, tgt = operands(torch.bfloat16)
    with LargestFloat() as watch:
        values = fused_head.fused_logprobs(hidden, pos, tgt, weight, CAP, deltas)
        values.sum().backward()
    assert watch.largest <= POSITIONS * 250 < POSITIONS * VOCAB
    with LargestFloat() as plain:
        reference(hidden, weight, deltas, pos, tgt).sum().backward()
    assert plain.largest >= POSITIONS * VOCAB  # what the fused pass avoids


def test_the_fused_head_never_waits_on_the_device_in_forward_or_backward(monkeypatch):
    """Per-block target picks and scatters are masked, not `nonzero`-indexed: on a GPU no
    block makes the host wait (the CPU makes the same calls, so they are counted here)."""
    from tools.host_syncs import syncs_during

    monkeypatch.setattr(fused_head, "VOCAB_BLOCK", 250)
    hidden, weight, deltas, pos, tgt = operands(torch.float32)
    with syncs_during() as seen:
        values = fused_head.fused_logprobs(hidden, pos, tgt, weight, CAP, deltas)
        values.sum().backward()
    assert not seen, seen


def test_the_normalisers_one_pass_gives_the_bits_of_block_by_block(monkeypatch):
    monkeypatch.setattr(fused_head, "VOCAB_BLOCK", 100)
    g = torch.Generator().manual_seed(2)
    for rows in (1, 3, 17):
        logits = torch.randn(rows, VOCAB, generator=g) * 4
        one_pass = fused_head.normaliser(logits)
        by_block = fused_head._combine([fused_head._block_stats(logits[:, a:a + 100].clone())
                                        for a in range(0, VOCAB, 100)])
        assert all(torch.equal(x, y) for x, y in zip(one_pass, by_block, strict=True))


def test_the_whole_vocabulary_product_matches_the_blocks_where_the_probe_says_so(monkeypatch):
    monkeypatch.setattr(fused_head, "VOCAB_BLOCK", 128)
    hidden, weight, deltas, _, _ = operands(torch.bfloat16)
    hidden = hidden.detach()
    with row_invariant(), torch.no_grad():
        lows = fused_head.low_rank(hidden, deltas)
        whole = fused_head.head_logits(hidden, weight, deltas, lows)
        blocks = torch.cat([fused_head.block_logits(hidden, weight, a, b, deltas, lows)
                            for a, b in fused_head.vocab_blocks(VOCAB)], -1)
    probe = fused_head.whole_head_matches_blocks(HIDDEN, VOCAB, torch.bfloat16,
                                                 torch.device("cpu"), torch.get_num_threads(),
                                                 (RANK,), 128)
    assert torch.equal(whole, blocks) or not probe


def test_the_blocked_normaliser_handles_blocks_with_nothing_allowed(monkeypatch):
    """Top-k leaves whole blocks at -inf: they add nothing, and no NaN appears."""
    monkeypatch.setattr(fused_head, "VOCAB_BLOCK", 100)
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, VOCAB, generator=g) * 3
    logits[:, 100:] = -torch.inf
    logits[2, :] = torch.randn(VOCAB, generator=g)
    picks = torch.tensor([5, 42, 900])
    mine = fused_head.picked_logprob(logits, picks)
    theirs = torch.log_softmax(logits, -1)[torch.arange(3), picks]
    torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6)
    torch.testing.assert_close(fused_head.log_softmax(logits)[:, :100],
                               torch.log_softmax(logits, -1)[:, :100], rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def bf16_engine(tiny_model_dir) -> Engine:
    return Engine(load_base_model(str(tiny_model_dir), device="cpu", dtype="bfloat16"))


@pytest.mark.parametrize("whole_product", [True, False], ids=["one-product", "block-by-block"])
@pytest.mark.parametrize("even", [True, False], ids=["even-blocks", "uneven-blocks"])
def test_sampler_logprobs_equal_the_trainers_with_many_vocabulary_blocks(
        bf16_engine, monkeypatch, whole_product, even):
    """Blocks on the tiny Gemma: the head layer (prefill and decode; one product over the
    vocabulary where the probe allows it, else block by block), the sampler's normaliser (one
    pass over a view where the blocks are even) and training cut the vocabulary alike, so the
    bits still agree."""
    engine = bf16_engine
    vocab = engine.vocab_size
    block = next(b for b in range(vocab // 4, 0, -1) if vocab % b == 0) if even else vocab // 3 + 7
    monkeypatch.setattr(fused_head, "VOCAB_BLOCK", block)
    if not whole_product:
        monkeypatch.setattr(fused_head, "whole_head_matches_blocks", lambda *args: False)
    state = engine.create_run(LoraSpec(rank=4), seed=3)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(5)
        for b in state.adapter.b.values():
            b.normal_(0, 0.05, generator=generator)
    adapter = state.adapter.frozen_copy()
    prompt = [5, 17, 42, 9, 30, 11]
    for seed in range(3):
        result = engine.sample(
            [SampleJob(adapter, prompt, 2, SamplingParams(max_tokens=24, temperature=1.0,
                                                          seed=seed, stop=[]))]
        )[0]
        for seq in result.sequences:
            full = np.asarray(prompt + list(seq.tokens), dtype=np.int64)
            n = len(full) - 1
            datum = Datum(full[:-1], {"target_tokens": full[1:],
                                      "weights": np.ones(n, np.float32)})
            scored = engine.forward_backward(
                [ForwardBackwardJob(state, [datum], "cross_entropy", {}, False)]
            )[0].outputs[0]["logprobs"][len(prompt) - 1 :]
            assert np.array_equal(scored, np.asarray(seq.logprobs, np.float32)), seed


def test_under_invariance_a_rows_logprob_does_not_depend_on_the_rows_beside_it(monkeypatch):
    monkeypatch.setattr(fused_head, "VOCAB_BLOCK", 333)
    hidden, weight, deltas, pos, tgt = operands(torch.bfloat16)
    hidden = hidden.detach()
    with row_invariant(), torch.no_grad():
        together = fused_head.fused_logprobs(hidden, pos, tgt, weight, CAP, deltas)
        first = [fused_head.HeadDelta(0, 8, deltas[0].a, deltas[0].b, deltas[0].scale)]
        alone = fused_head.fused_logprobs(hidden[:8], pos[pos < 8], tgt[pos < 8], weight, CAP,
                                          first)
    assert torch.equal(together[pos < 8], alone)


@pytest.mark.parametrize("loss_fn", ["cross_entropy", "importance_sampling"])
def test_training_through_the_fused_head_matches_the_plain_reference(bf16_engine, monkeypatch,
                                                                     loss_fn):
    """The engine's step with the fused head against `fused_head_pass=False` (the earlier
    computation) from the same adapter: the same loss and gradients within bf16 rounding."""
    engine = bf16_engine
    monkeypatch.setattr(fused_head, "VOCAB_BLOCK", engine.vocab_size // 4 + 3)
    rng = np.random.default_rng(7)
    data = []
    for length in (9, 14, 6):
        full = rng.integers(1, engine.vocab_size, size=length + 1)
        inputs = {"target_tokens": full[1:]}
        if loss_fn == "cross_entropy":
            inputs["weights"] = (np.arange(length) >= 3).astype(np.float32)
        else:
            inputs["advantages"] = np.where(np.arange(length) >= 3, 0.7, 0.0).astype(np.float32)
            inputs["logprobs"] = np.full(length, -5.0, np.float32)
        data.append(Datum(full[:-1], inputs))
    results = {}
    for fused in (True, False):
        monkeypatch.setattr(engine, "fused_head_pass", fused)
        state = engine.create_run(LoraSpec(rank=4), seed=11)
        with torch.no_grad():
            generator = torch.Generator().manual_seed(13)
            for b in state.adapter.b.values():
                b.normal_(0, 0.05, generator=generator)
        out = engine.forward_backward([ForwardBackwardJob(state, data, loss_fn, {}, False)])[0]
        grads = {name: state.adapter.b[name].grad.clone() for name in sorted(state.adapter.b)}
        results[fused] = (out.metrics["loss:sum"], out.outputs, grads)
    (loss, outputs, grads), (ref_loss, ref_outputs, ref_grads) = results[True], results[False]
    assert loss == pytest.approx(ref_loss, rel=1e-3)
    for mine, theirs in zip(outputs, ref_outputs, strict=True):
        np.testing.assert_allclose(mine["logprobs"], theirs["logprobs"], atol=2e-3)
    assert any(name.endswith("lm_head") for name in grads)
    for name, grad in grads.items():
        scale = float(ref_grads[name].abs().max())
        torch.testing.assert_close(grad, ref_grads[name], rtol=0, atol=0.03 * scale + 1e-7)
