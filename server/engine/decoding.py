"""Token choice where the logits are, and stop rules matched on token ids.

Decoding a batch must not copy `[rows, vocabulary]` logits to the host every step, nor loop over
rows in Python, nor decode text to look for stop strings. Here temperature, top-k, top-p and
the draw itself run as batched tensor operations on the logits' device; only the chosen ids and
their logprobs come back (one host synchronisation per step).

Reproducible draws without a generator per row: each row has a 64-bit key (from its request's
seed and its index in the request) and step `s` of that row uses a uniform hashed from
`(key, s)` on the device (a counter-based scheme), so a row's samples never depend on which
other rows share its batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from server.engine import fused_head

_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """`x * constant mod 2**32` for `x < 2**32` in int64, without signed overflow."""
    low, high = constant & 0xFFFF, constant >> 16
    return (x * low + (((x * high) & 0xFFFF) << 16)) & _MASK32


def _hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mix (the "lowbias32" finaliser) on int64 tensors holding 32-bit values."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def row_key(seed: int, index: int) -> tuple[int, int]:
    """Two 32-bit words that name sample `index` of a request seeded with `seed`."""
    mixed = (int(seed) * 1_000_003 + index) % 2**63
    words = torch.tensor([mixed & _MASK32, (mixed >> 32) & _MASK32], dtype=torch.int64)
    low = _hash32(words[0] ^ _hash32(words[1]))
    high = _hash32(low ^ _GOLDEN ^ words[1])
    return int(low), int(high)


def uniforms(keys: torch.Tensor, step: int) -> torch.Tensor:
    """One float32 uniform in [0, 1) per row for this step, from `[rows, 2]` int64 keys."""
    counter = _hash32(torch.full_like(keys[:, 0], step & _MASK32) ^ keys[:, 1])
    bits = _hash32(keys[:, 0] ^ counter)
    return (bits >> 8).to(torch.float32) * (1.0 / 2**24)


@dataclass
class RowParams:
    """Per-row sampling parameters as tensors on the logits' device."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    keys: torch.Tensor
    sampled: bool
    """Host-side facts about the rows (kept when rows leave), so a step needs no device read:
    some row samples (temperature > 0), the largest top-k, some row has top-p < 1."""
    k_max: int
    nucleus: bool
    greedy: bool
    """Some row is greedy (temperature 0)."""

    def select(self, index: torch.Tensor) -> RowParams:
        return RowParams(
            self.temperature[index],
            self.top_k[index],
            self.top_p[index],
            self.keys[index],
            self.sampled,
            self.k_max,
            self.nucleus,
            self.greedy,
        )


def row_params(
    temperatures: Sequence[float],
    top_ks: Sequence[int],
    top_ps: Sequence[float],
    keys: Sequence[tuple[int, int]],
    device: torch.device | str,
) -> RowParams:
    sampled = [t > 0 for t in temperatures]
    return RowParams(
        torch.tensor(temperatures, dtype=torch.float32, device=device),
        torch.tensor(top_ks, dtype=torch.long, device=device),
        torch.tensor(top_ps, dtype=torch.float32, device=device),
        torch.tensor(keys, dtype=torch.int64, device=device).reshape(-1, 2),
        any(sampled),
        max((k for k, s in zip(top_ks, sampled) if s and k > 0), default=0),
        any(p < 1.0 for p, s in zip(top_ps, sampled) if s),
        not all(sampled),
    )


CDF_BLOCK = 1024
"""Vocabulary block of the two-level draw: the inverse CDF is found among block sums first,
then inside one block, so no `[rows, vocabulary]` cumulative sum is ever built."""


def choose(
    logits: torch.Tensor, params: RowParams, step: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's next token and its logprob, on the logits' device.

    Temperature 0 is greedy, with the untempered logprob. Otherwise the token is an inverse-CDF
    draw from the tempered, filtered distribution with the row's uniform, and its logprob is
    under that same distribution (renormalised over the tokens top-k/top-p kept), as vLLM's
    `processed_logprobs` reports it: the q an importance ratio needs, equal across backends.

    Over a 262k vocabulary every pass over `[rows, vocabulary]` costs about as much as a tenth of
    the output head's matmul, so the common case (no top-p) makes five: scale, max with argmax,
    exp, block sums, and the blocked normaliser the logprob is read from (the trainer's blocks,
    so the two agree to the bit). Top-k uses `topk`; only a top-p < 1 sorts.
    """
    vocab = logits.shape[-1]
    greedy = params.temperature <= 0
    if not params.sampled:
        plain = logits.float()
        picks = plain.argmax(-1)
        return picks, _logprob(plain, picks)
    scale = torch.where(greedy, torch.ones_like(params.temperature), params.temperature)
    filtered = torch.div(logits, scale[:, None].to(logits.device))  # float32 out of bf16 in
    if params.k_max > 0:
        k_max = min(params.k_max, vocab)
        limited = (params.top_k > 0) & (params.top_k < vocab)
        top = torch.topk(filtered, k_max, dim=-1).values
        kth = top.gather(-1, (params.top_k.clamp(1, k_max) - 1)[:, None])
        filtered = filtered.masked_fill(limited[:, None] & (filtered < kth), -torch.inf)
    if params.nucleus:
        nucleus = params.top_p < 1.0
        ordered, order = torch.sort(filtered, descending=True, dim=-1)
        probs = torch.softmax(ordered, -1)
        drop = (probs.cumsum(-1) - probs > params.top_p[:, None]) & nucleus[:, None]
        filtered = torch.full_like(filtered, -torch.inf).scatter(
            -1, order, ordered.masked_fill(drop, -torch.inf)
        )
    best, argmax = filtered.max(-1)
    weights = torch.exp(filtered - best[:, None])
    drawn = _inverse_cdf(weights, uniforms(params.keys, step).to(weights.device))
    picks = torch.where(greedy, argmax, drawn)
    picked_lp = _logprob(filtered, picks)
    if params.greedy:
        # A greedy row's logprob is unfiltered, and computed as in an all-greedy batch, so it
        # does not depend on whether rows that sample share its batch.
        picked_lp = torch.where(greedy, _logprob(logits.float(), picks), picked_lp)
    return picks, picked_lp


def _logprob(values: torch.Tensor, picks: torch.Tensor) -> torch.Tensor:
    """Each row's pick under `log_softmax(values)` by the trainer's own blocks and formula
    (`fused_head.picked_logprob`, row-wise, so its bits do not depend on the row count): at
    temperature 1 without top-k or top-p the trainer gives a sampled token the sampler's
    logprob bit for bit."""
    return fused_head.picked_logprob(values, picks)


def _inverse_cdf(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The index where each row's cumulative `weights` first pass `uniform * total`: block
    sums first, then a cumulative sum inside the one block that holds the target.

    The target is kept below the total, so it lands in a block of positive weight; inside it, a
    draw that rounding carries past the block's last kept token steps back onto that token.
    """
    rows, vocab = weights.shape
    block = CDF_BLOCK if vocab % CDF_BLOCK == 0 else vocab
    blocks = weights.view(rows, vocab // block, block)
    running = blocks.sum(-1).cumsum(-1)
    total = running[:, -1]
    target = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    which = torch.searchsorted(running, target[:, None], right=True)[:, 0]
    which = which.clamp_(max=running.shape[1] - 1)
    before = running.gather(-1, (which - 1).clamp(min=0)[:, None])[:, 0]
    before = torch.where(which > 0, before, torch.zeros_like(before))
    inside = blocks[torch.arange(rows, device=weights.device), which]
    rest = (target - before).clamp(min=0)[:, None]
    local = torch.searchsorted(inside.cumsum(-1), rest, right=True)[:, 0]
    last_kept = (inside > 0).to(torch.int64).cumsum(-1).argmax(-1)
    local = torch.minimum(local, last_kept)
    return which * block + local


class TokenPieces:
    """The text each token id adds when appended, computed once per id and kept."""

    def __init__(self, decode: Callable[[list[int]], str], anchor: int):
        self._decode = decode
        self._anchor = anchor
        self._anchor_text = decode([anchor])
        self._pieces: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        piece = self._pieces.get(token)
        if piece is None:
            # Decoding after an anchor keeps leading spaces some decoders strip at the start.
            joined = self._decode([self._anchor, token])
            if joined.startswith(self._anchor_text):
                piece = joined[len(self._anchor_text) :]
            else:
                piece = self._decode([token])
            self._pieces[token] = piece
        return piece


class StopStrings:
    """Incremental stop-string matching for one row, on token ids.

    Each new token appends its piece of text to a short tail; only when a stop string shows up
    in that tail (or a piece is an incomplete character, which the tail cannot judge) is the
    row's last few tokens decoded to confirm, as the whole text would read.
    """

    def __init__(
        self, strings: list[str], pieces: TokenPieces, decode: Callable[[list[int]], str]
    ):
        self.strings = strings
        self.pieces = pieces
        self.decode = decode
        longest = max(len(s) for s in strings)
        self.keep = longest + 16
        self.window = longest + 8
        self.wide = any(not s.isascii() for s in strings)
        self.tail = ""

    def hit(self, tokens: list[int]) -> bool:
        """Has the text of `tokens` (one more than last call) come to contain a stop string?"""
        piece = self.pieces(tokens[-1])
        self.tail = (self.tail + piece)[-self.keep :]
        if not (any(s in self.tail for s in self.strings) or (self.wide and "\ufffd" in piece)):
            return False
        text = self.decode(tokens[-self.window :])
        return any(s in text for s in self.strings)
