"""The output head one vocabulary block at a time: logits, log-sum-exp and their gradient.

Gemma's head has 262k rows. Scored the plain way, every position gets a `[vocabulary]` fp32
LoRA delta, its add, a log-softmax and a gradient of the same size (about 1 MiB per position
each), none of which the loss reads beyond one entry. Here each block of `VOCAB_BLOCK` rows is
multiplied (the base product in the model's dtype), gets its LoRA delta added in the same fp32
block, soft-capped, and reduced to a maximum and a sum of exponentials; only those two numbers
per block and position, and the targets' logits, survive the block. Backward recomputes each
block from the hidden states and the saved log-sum-exp (a checkpoint that keeps 8 bytes per
position) and adds its share to the hidden states' and the adapter's gradients.

Every path that turns hidden states into logits or logprobs uses these blocks: the LoRA head
layer (prefill and decode steps), the sampler's logprob (`normalised`) and training. So a
sampled token's logprob and the trainer's agree to the bit wherever a row's logits do.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from server.engine import invariance

VOCAB_BLOCK = 4096
"""Vocabulary rows per block: a block's fp32 tensors are 16 KiB per position, 8 MiB for a chunk
of 512 positions, so a block's passes run from cache. On Gemma 3's head (2 cores of an AMD
EPYC, bf16, 512 positions, forward and backward, `bench/bench_fused_head.py`) 4096 took 2.18 s,
2048 2.17 s, 1024 2.23 s, 16384 3.17 s, the whole vocabulary at once 5.50 s; its three GEMMs
alone 1.61 s."""


def vocab_blocks(vocab: int) -> list[tuple[int, int]]:
    """The `[first, stop)` blocks every caller cuts the vocabulary into (the same everywhere,
    so that reductions over it add the same numbers in the same order)."""
    return [(first, min(vocab, first + VOCAB_BLOCK)) for first in range(0, vocab, VOCAB_BLOCK)]


@dataclass(frozen=True)
class HeadDelta:
    """One routed group of rows and its adapter's head factors (`scale * B(A(x))`)."""

    start: int
    stop: int
    a: torch.Tensor
    b: torch.Tensor
    scale: float


def low_rank(x: torch.Tensor, deltas: list[HeadDelta]) -> list[torch.Tensor]:
    """Each group's `scale * A(x)` (`[rows, rank]`, fp32): computed once for every block."""
    lows = []
    for d in deltas:
        rows = x[d.start : d.stop].to(d.a.dtype)
        if invariance.rows_are_invariant():
            lows.append(invariance.tiled_matmul(rows, d.a.T) * d.scale)
        else:
            lows.append((rows @ d.a.T) * d.scale)
    return lows


def block_logits(
    x: torch.Tensor,
    weight: torch.Tensor,
    first: int,
    stop: int,
    deltas: list[HeadDelta],
    lows: list[torch.Tensor],
) -> torch.Tensor:
    """fp32 logits of vocabulary rows `[first, stop)` for 2-D `x`: the base product in the
    weight's dtype (rows tiled under invariance), each group's LoRA delta added in fp32."""
    block = weight[first:stop]
    if x.dtype == block.dtype:
        out = invariance.linear(x, block, None).float()
    else:
        out = invariance.linear(x.to(block.dtype), block, None).float()
    for d, low in zip(deltas, lows, strict=True):
        b = d.b[first:stop].T
        out[d.start : d.stop] += (
            invariance.tiled_matmul(low, b) if invariance.rows_are_invariant() else low @ b
        )
    return out


def head_logits(
    x: torch.Tensor, weight: torch.Tensor, deltas: list[HeadDelta], lows: list[torch.Tensor]
) -> torch.Tensor:
    """fp32 logits of the whole vocabulary for 2-D `x`, with the bits of `block_logits` block
    by block: one product over the whole vocabulary where this machine's kernels give every
    block its own product's bits (`whole_head_matches_blocks`) or where no bit is promised
    (outside invariance), else block by block into one tensor."""
    vocab = weight.shape[0]
    if torch.is_grad_enabled():
        return torch.cat([block_logits(x, weight, a, b, deltas, lows)
                          for a, b in vocab_blocks(vocab)], -1)
    ranks = tuple(sorted({d.a.shape[0] for d in deltas}))
    if not invariance.rows_are_invariant() or whole_head_matches_blocks(
            x.shape[1], vocab, weight.dtype, x.device, torch.get_num_threads(), ranks,
            VOCAB_BLOCK):
        return block_logits(x, weight, 0, vocab, deltas, lows)
    out = torch.empty((x.shape[0], vocab), dtype=torch.float32, device=x.device)
    for a, b in vocab_blocks(vocab):
        out[:, a:b] = block_logits(x, weight, a, b, deltas, lows)
    return out


PROBE_ROWS = 16
"""Rows of the probe's products: under invariance a row's bits do not depend on the row count
(`invariance`), so one count stands for all."""


@functools.cache
def whole_head_matches_blocks(features: int, vocab: int, dtype: torch.dtype,
                              device: torch.device, threads: int,
                              ranks: tuple[int, ...], block: int) -> bool:
    """Whether, under invariance, `block_logits` over the whole vocabulary gives every block
    the bits of that block's own `block_logits` (the base product in `dtype`, LoRA deltas of
    these ranks in fp32). A GEMM sums each output over K in an order its micro-kernel fixes, so
    cutting N into blocks should change nothing; measured once per shape, dtype, device,
    thread count, ranks and block size, on random operands (the weight a random block
    repeated)."""
    del threads, block  # part of the cache key: the kernel's threading can change its order
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(PROBE_ROWS, features, generator=generator).to(device=device, dtype=dtype)
    block = torch.randn(min(vocab, 1024), features, generator=generator).to(device, dtype)
    weight = block.repeat(-(-vocab // block.shape[0]), 1)[:vocab]
    deltas = []
    for k, rank in enumerate(ranks):
        rows = slice(k * PROBE_ROWS // len(ranks), (k + 1) * PROBE_ROWS // len(ranks))
        a = torch.randn(rank, features, generator=generator).to(device)
        b = torch.randn(vocab, rank, generator=generator).to(device)
        deltas.append(HeadDelta(rows.start, rows.stop, a, b, 2.0))
    with torch.no_grad(), invariance.row_invariant():
        lows = low_rank(x, deltas)
        whole = block_logits(x, weight, 0, vocab, deltas, lows)
        return all(torch.equal(whole[:, a:b], block_logits(x, weight, a, b, deltas, lows))
                   for a, b in vocab_blocks(vocab))


def soft_cap(logits: torch.Tensor, cap: float | None, inplace: bool = False) -> torch.Tensor:
    """Gemma's final-logit soft cap, `cap * tanh(logits / cap)` (the same operations, so the same
    bits, in place or not)."""
    if not cap:
        return logits
    if inplace:
        return logits.div_(cap).tanh_().mul_(cap)
    return torch.tanh(logits / cap) * cap


def _block_stats(z: torch.Tensor, inplace: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A block's row maxima and sums of `exp(z - max)`; a block with nothing allowed (all
    `-inf`, as top-k leaves) sums to 0. `inplace` overwrites `z` (the same bits, no copy)."""
    top = z.amax(-1)
    shift = torch.where(torch.isfinite(top), top, torch.zeros_like(top))[:, None]
    shifted = z.sub_(shift) if inplace else z - shift
    return top, shifted.exp_().sum(-1)


def _combine(stats: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    """The row maximum and `log(sum exp(z - max))` from per-block statistics, added block by
    block in a fixed order (elementwise, so no row depends on another)."""
    top = stats[0][0]
    for block_top, _ in stats[1:]:
        top = torch.maximum(top, block_top)
    total = torch.zeros_like(top)
    for block_top, block_sum in stats:
        total = total + block_sum * torch.exp(block_top - top)
    return top, torch.log(total)


def normaliser(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`(max, log sum exp(z - max))` of each row of `[rows, vocabulary]` fp32 logits, by the
    blocks training uses, so `(z - max) - log_sum` has the trainer's bits. Where the blocks
    tile the vocabulary evenly, every block's statistics come from one pass over a
    `[rows, blocks, block]` view (each block reduced alone, as training reduces it)."""
    rows, vocab = logits.shape
    if vocab % VOCAB_BLOCK or vocab == VOCAB_BLOCK or not logits.is_contiguous():
        return _combine([_block_stats(logits[:, a:b]) for a, b in vocab_blocks(vocab)])
    tops, sums = _block_stats(logits.view(rows * (vocab // VOCAB_BLOCK), VOCAB_BLOCK))
    tops, sums = tops.view(rows, -1), sums.view(rows, -1)
    return _combine([(tops[:, k], sums[:, k]) for k in range(tops.shape[1])])


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """Log-softmax of `[rows, vocabulary]` fp32 logits with the trainer's bits (`normaliser`)."""
    top, log_sum = normaliser(logits)
    return (logits - top[:, None]) - log_sum[:, None]


def picked_logprob(logits: torch.Tensor, picks: torch.Tensor) -> torch.Tensor:
    """Each row's `picks` under `log_softmax(logits)`, computed as training computes it."""
    top, log_sum = normaliser(logits)
    return (logits.gather(-1, picks[:, None])[:, 0] - top) - log_sum


def head_deltas(groups: list, name: str) -> list[HeadDelta]:
    """The routed groups (`lora.RowGroup`) whose adapter covers the head `name`."""
    return [
        HeadDelta(g.start, g.stop, g.adapter.a[name], g.adapter.b[name], g.adapter.spec.scale)
        for g in groups
        if g.adapter is not None and name in g.adapter.a
    ]


class _FusedHead(torch.autograd.Function):
    """log p(tgt[m] | hidden[pos[m]]) through the blocked head, with a blocked backward."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: torch.autograd.function.FunctionCtx,
        hidden: torch.Tensor,
        pos: torch.Tensor,
        tgt: torch.Tensor,
        weight: torch.Tensor,
        cap: float | None,
        spans: list[tuple[int, int, float]],
        *factors: torch.Tensor,
    ) -> torch.Tensor:
        deltas = _deltas(spans, factors)
        lows = low_rank(hidden, deltas)
        picked = torch.zeros(len(pos), dtype=torch.float32, device=hidden.device)
        stats = []
        for first, stop in vocab_blocks(weight.shape[0]):
            z = soft_cap(block_logits(hidden, weight, first, stop, deltas, lows), cap, True)
            inside, column = _in_block(tgt, first, stop)
            picked = torch.where(inside, z[pos, column], picked)
            stats.append(_block_stats(z, inplace=True))
        top, log_sum = _combine(stats)
        ctx.save_for_backward(hidden, pos, tgt, weight, top, log_sum, *factors, *lows)
        ctx.cap, ctx.spans = cap, spans
        ctx.invariant = invariance.rows_are_invariant()
        return (picked - top[pos]) - log_sum[pos]

    @staticmethod
    def backward(ctx: torch.autograd.function.FunctionCtx, grad: torch.Tensor):  # type: ignore[override]
        hidden, pos, tgt, weight, top, log_sum, *rest = ctx.saved_tensors
        count = 2 * len(ctx.spans)
        factors, lows = rest[:count], rest[count:]
        deltas = _deltas(ctx.spans, factors)
        needs = ctx.needs_input_grad
        # The backward of a softmax: every position pays its total weight times p, its
        # targets get their own weight back. Repeated pairs add in index order.
        per_position = torch.zeros(hidden.shape[0], dtype=torch.float32, device=hidden.device)
        per_position.index_add_(0, pos, grad.float())
        log_norm = top + log_sum
        one = torch.ones((), dtype=torch.float32, device=hidden.device)
        d_hidden = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
        d_low = [torch.zeros_like(low) for low in lows]
        d_b = [torch.zeros_like(d.b) if needs[7 + 2 * k] else None for k, d in enumerate(deltas)]
        with invariance.row_invariant(ctx.invariant):
            for first, stop in vocab_blocks(weight.shape[0]):
                z = soft_cap(block_logits(hidden, weight, first, stop, deltas, list(lows)),
                             ctx.cap, True)
                # d(capped)/d(logit) = 1 - tanh^2, read off the capped logits before they go.
                slope = torch.addcmul(one, z, z, value=-1.0 / ctx.cap**2) if ctx.cap else None
                dz = z.sub_(log_norm[:, None]).exp_().mul_(-per_position[:, None])
                inside, column = _in_block(tgt, first, stop)
                dz.index_put_((pos, column), torch.where(inside, grad.float(), 0.0),
                              accumulate=True)
                if slope is not None:
                    dz.mul_(slope)
                if needs[0]:
                    block = weight[first:stop]
                    d_hidden += (dz.to(block.dtype) @ block).float()
                for k, d in enumerate(deltas):
                    rows = dz[d.start : d.stop]
                    d_low[k] += rows @ d.b[first:stop]
                    if d_b[k] is not None:
                        d_b[k][first:stop] = rows.T @ lows[k]
        grads: list[torch.Tensor | None] = []
        for k, d in enumerate(deltas):
            scaled = d_low[k] * d.scale
            rows = hidden[d.start : d.stop].to(d.a.dtype)
            if needs[0]:
                d_hidden[d.start : d.stop] += scaled @ d.a
            grads += [(scaled.T @ rows).to(d.a.dtype) if needs[6 + 2 * k] else None,
                      None if d_b[k] is None else d_b[k].to(d.b.dtype)]
        d_x = d_hidden.to(hidden.dtype) if needs[0] else None
        return (d_x, None, None, None, None, None, *grads)


def _in_block(tgt: torch.Tensor, first: int, stop: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which targets fall in vocabulary rows `first:stop`, and each target's column there
    (clamped into the block for those that do not, whose reads and writes are masked): masks
    instead of `nonzero`, so no block waits for the device to tell the host a count."""
    inside = (tgt >= first) & (tgt < stop)
    return inside, (tgt - first).clamp_(0, stop - first - 1)


def _deltas(
    spans: list[tuple[int, int, float]], factors: tuple[torch.Tensor, ...]
) -> list[HeadDelta]:
    return [
        HeadDelta(start, stop, factors[2 * k], factors[2 * k + 1], scale)
        for k, (start, stop, scale) in enumerate(spans)
    ]


def fused_logprobs(
    hidden: torch.Tensor,
    pos: torch.Tensor,
    tgt: torch.Tensor,
    weight: torch.Tensor,
    cap: float | None,
    deltas: list[HeadDelta],
) -> torch.Tensor:
    """`log p(tgt[m] | hidden[pos[m]])` for 2-D `hidden`, one vocabulary block at a time.

    Nothing of `[positions, vocabulary]` size is kept: backward recomputes each block from the
    hidden states and the per-position log-sum-exp. Gradients reach `hidden` and each delta's
    `a` and `b` where they require them; the base weight stays frozen."""
    spans = [(d.start, d.stop, d.scale) for d in deltas]
    factors = [t for d in deltas for t in (d.a, d.b)]
    return _FusedHead.apply(hidden, pos, tgt, weight.detach(), cap, spans, *factors)
