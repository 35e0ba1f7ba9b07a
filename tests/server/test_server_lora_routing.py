"""Per-row adapter routing in one layer: every path equals each row through its own adapter.

`MultiLoRALinear` has two ways to apply several adapters in one batch (per-group deltas added
out of place when gradients are needed, per-group in-place adds when decoding). Each must give
every row `base(x) + scale * B(A(x))` with its own adapter (none for base rows), gradients that
land only in the adapter that produced them, and nothing at all from another row's adapter,
not even when that adapter is NaN.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from server.engine.lora import AdapterWeights, LoraSpec, MultiLoRALinear, RowGroup, routing

NAME = "layer"


def adapter(rank: int, fan_in: int, fan_out: int, seed: int) -> AdapterWeights:
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(rank, fan_in, generator=generator, dtype=torch.float64).requires_grad_()
    b = torch.randn(fan_out, rank, generator=generator, dtype=torch.float64).requires_grad_()
    return AdapterWeights(LoraSpec(rank=rank), {NAME: a}, {NAME: b})


def reference(base: nn.Linear, x: torch.Tensor, groups: list[RowGroup]) -> torch.Tensor:
    rows = []
    for group in groups:
        for r in range(group.start, group.stop):
            out = base(x[r])
            if group.adapter is not None:
                a, b = group.adapter.a[NAME], group.adapter.b[NAME]
                out = out + group.adapter.spec.scale * (x[r] @ a.T) @ b.T
            rows.append(out)
    return torch.stack(rows)


def scenario(fan_in: int, ranks: tuple[int, int]):
    torch.manual_seed(0)
    base = nn.Linear(fan_in, 12, dtype=torch.float64)
    base.requires_grad_(False)
    first, second = (adapter(r, fan_in, 12, seed=k) for k, r in enumerate(ranks))
    groups = [RowGroup(first, 0, 2), RowGroup(None, 2, 3), RowGroup(second, 3, 6),
              RowGroup(first, 6, 7)]
    x = torch.randn(7, 5, fan_in, dtype=torch.float64)
    return MultiLoRALinear(base, NAME), base, (first, second), groups, x


@pytest.mark.parametrize(("fan_in", "ranks"), [(16, (2, 3)), (8, (3, 4))])
def test_each_row_goes_through_its_own_adapter_and_only_it_gets_gradients(fan_in, ranks):
    layer, base, adapters, groups, x = scenario(fan_in, ranks)
    weights = torch.randn(7, 5, 12, dtype=torch.float64)
    with routing(groups):
        got = layer(x)
    (got * weights).sum().backward()
    got_grads = [t.grad.clone() for a in adapters for t in (a.a[NAME], a.b[NAME])]
    for a in adapters:
        a.a[NAME].grad = a.b[NAME].grad = None
    want = reference(base, x, groups)
    (want * weights).sum().backward()
    torch.testing.assert_close(got, want)
    for g, w in zip(got_grads, (t.grad for a in adapters for t in (a.a[NAME], a.b[NAME])),
                    strict=True):
        torch.testing.assert_close(g, w)
    # The base row is the base layer exactly.
    torch.testing.assert_close(got[2], base(x[2]))


@pytest.mark.parametrize(("fan_in", "ranks"), [(16, (2, 3)), (8, (3, 4))])
def test_decoding_without_gradients_matches_the_reference(fan_in, ranks):
    layer, base, _, groups, x = scenario(fan_in, ranks)
    with torch.no_grad(), routing(groups):
        got = layer(x)
    with torch.no_grad():
        want = reference(base, x, groups)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("grad", [False, True], ids=["decoding", "training"])
def test_a_nan_adapter_reaches_no_other_row_and_no_other_gradient(grad):
    layer, base, (first, second), groups, x = scenario(16, (2, 3))
    with torch.no_grad():
        second.a[NAME].fill_(float("nan"))
    clean = AdapterWeights(first.spec, {NAME: first.a[NAME].detach().clone().requires_grad_()},
                           {NAME: first.b[NAME].detach().clone().requires_grad_()})
    with torch.set_grad_enabled(grad), routing(groups):
        got = layer(x)
    if grad:
        got[[0, 1, 2, 6]].sum().backward()
    nan_rows = torch.isnan(got).flatten(1).any(1).tolist()
    assert nan_rows == [False, False, False, True, True, True, False]
    with torch.set_grad_enabled(grad):
        want = reference(base, x, [RowGroup(clean, 0, 2), RowGroup(None, 2, 3),
                                   RowGroup(None, 3, 6), RowGroup(clean, 6, 7)])
    torch.testing.assert_close(got[[0, 1, 2, 6]], want[[0, 1, 2, 6]])
    if grad:
        want[[0, 1, 2, 6]].sum().backward()
        assert torch.isfinite(first.a[NAME].grad).all()
        torch.testing.assert_close(first.a[NAME].grad, clean.a[NAME].grad)
        torch.testing.assert_close(first.b[NAME].grad, clean.b[NAME].grad)


def test_an_adapter_that_skips_a_layer_leaves_its_rows_on_the_base_layer():
    layer, base, (first, _), groups, x = scenario(16, (2, 3))
    skipping = AdapterWeights(LoraSpec(rank=2))  # covers no module at all
    groups = [RowGroup(first, 0, 3), RowGroup(skipping, 3, 7)]
    with torch.no_grad(), routing(groups):
        got = layer(x)
        want = reference(base, x, [RowGroup(first, 0, 3), RowGroup(None, 3, 7)])
    torch.testing.assert_close(got, want)


# ------------------------------------------------------ output head in chunks
@pytest.mark.parametrize("weighted", ["all positions", "a few positions"])
def test_the_output_head_in_checkpointed_chunks_gives_the_same_loss_and_gradients(
        tiny_model_dir, monkeypatch, weighted):
    """Long batches go through the vocabulary-wide head a chunk at a time, recomputed in
    backward; losses, logprobs and every adapter gradient equal one pass over all positions."""
    import numpy as np

    import server.engine.scoring as scoring_module
    from server.engine.engine import Engine, ForwardBackwardJob
    from server.engine.model_loading import load_base_model
    from server.protocol.codec import Datum

    engine = Engine(load_base_model(str(tiny_model_dir), device="cpu", dtype="float32"))
    rng = np.random.default_rng(0)
    data = []
    for length in (90, 70, 60):  # 220 positions: several chunks of 64
        tokens = rng.integers(5, engine.vocab_size, size=length + 1)
        weights = np.ones(length, np.float32)
        if weighted == "a few positions":
            weights[: length - 30] = 0.0  # 90 weighted positions: two passes, chunked
        data.append(Datum(tokens[:-1], {"target_tokens": tokens[1:], "weights": weights}))

    def run(chunk: int):
        monkeypatch.setattr(scoring_module, "HEAD_CHUNK", chunk)
        state = engine.create_run(LoraSpec(rank=4), seed=3)
        with torch.no_grad():  # a non-zero B, so the head's LoRA path carries gradient to A
            for b in state.adapter.b.values():
                b.normal_(0, 0.02, generator=torch.Generator().manual_seed(1))
        result = engine.forward_backward([ForwardBackwardJob(state, data, "cross_entropy", {},
                                                             False)])[0]
        grads = {name: t.grad.clone() for name, t in state.adapter.a.items()}
        grads.update({f"{name}.b": t.grad.clone() for name, t in state.adapter.b.items()})
        return result, grads

    chunked, chunked_grads = run(64)
    whole, whole_grads = run(10_000)
    assert chunked.metrics["loss:sum"] == pytest.approx(whole.metrics["loss:sum"], rel=1e-6)
    for got, want in zip(chunked.outputs, whole.outputs, strict=True):
        np.testing.assert_allclose(got["logprobs"], want["logprobs"], rtol=1e-5, atol=1e-6)
    assert chunked_grads.keys() == whole_grads.keys()
    for name, grad in whole_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-4, atol=1e-6)
    assert any(float(g.abs().sum()) > 0 for g in whole_grads.values())
