"""Log-probabilities through the vocabulary-wide output head, a chunk of positions at a time.

Gemma's output head (262k tokens) costs more than the whole body of a small model. Every path
that scores tokens (training's losses, packed rows, prompt logprobs) goes through here, so each
position is scored once, in chunks of positions, each chunk through the fused head
(`fused_head`: a vocabulary block at a time, recomputed in backward instead of kept).
"""

from __future__ import annotations

import numpy as np
import torch

from server.engine import fused_head, invariance
from server.engine.invariant_attention import take_columns
from server.engine.lora import MultiLoRALinear, Routing, RowGroup, routing

HEAD_CHUNK = 512
"""Positions per output-head chunk: each chunk reads the head's weight once, and a vocabulary
block's fp32 tensors are `HEAD_CHUNK x fused_head.VOCAB_BLOCK` (32 MiB)."""
UNSCORED_TARGET = -1
"""An internal scoring job's target at a position nobody asked about: the pair is dropped, and
a position no pair reads skips the output head. Users' targets are checked against the
vocabulary, so theirs never carry it."""


class HeadScoring:
    """Mixin of `Engine`: scoring through the (LoRA-routed, soft-capped) output head."""

    _head: MultiLoRALinear
    _body: torch.nn.Module
    _softcap: float | None
    device: torch.device
    fused_head_pass: bool

    # ------------------------------------------------------------- training
    def _head_logprobs(
        self, hidden: torch.Tensor, targets: torch.Tensor, groups: list[RowGroup]
    ) -> torch.Tensor:
        """log p(target) for `[P, K]` targets from `[P, H]` final hidden states, through the
        (LoRA-routed, soft-capped) output head a vocabulary block at a time (`fused_head`)."""
        positions, depth = targets.shape
        pos = torch.arange(positions, device=targets.device).repeat_interleave(depth)
        return self._gather_head(hidden, pos, targets.reshape(-1), groups).view(positions, depth)

    def _vocab_logprobs(self, hidden: torch.Tensor, groups: list[RowGroup]) -> torch.Tensor:
        """Log-softmax over the whole vocabulary (for top-k prompt logprobs), from the head's
        blocked fp32 logits and normalised by the same blocks as training and sampling."""
        with routing(groups):
            logits = fused_head.soft_cap(self._head(hidden), self._softcap)
        flat = logits.reshape(-1, logits.shape[-1])
        return fused_head.log_softmax(flat).view(logits.shape)

    def _target_logprobs(
        self,
        tokens: torch.Tensor,
        mask: torch.Tensor,
        targets: torch.Tensor,
        groups: list[RowGroup],
        active: torch.Tensor | None,
        read: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """log p(target | prefix) for `[B, T, K]` targets, 0.0 where `read` is False.

        The output head over Gemma's 262k-token vocabulary costs more than the whole body of a
        small model. So only the positions a loss reads (`read`, default: every real one) go
        through it, in chunks, never holding `[B, T, V]` logits: the `active` ones (a non-zero
        weight or advantage) with gradients, the rest of `read` without. Positions whose loss
        term is zero get no gradient either way, so the gradient is unchanged.
        """
        with routing(groups):
            hidden = self._body(input_ids=tokens, attention_mask=mask, use_cache=False)
            hidden = hidden.last_hidden_state
        read = mask.bool() if read is None else read
        grad = active is not None and torch.is_grad_enabled() and bool(active.any())
        if not grad:
            passes = [(read, False)]
        elif int(active.sum()) * 2 > int(read.sum()):
            # Most read positions carry weight: score them all once, with gradients.
            passes = [(read, True)]
        else:
            passes = [(read & ~active, False), (active, True)]
        scored = torch.zeros(targets.shape, dtype=torch.float32, device=self.device)
        for where, with_grad in passes:
            if not bool(where.any()):
                continue
            rows, cols = where.nonzero(as_tuple=True)  # row-major: a group's rows stay together
            counts = where.sum(dim=1).tolist()
            offsets = [0]
            for count in counts:
                offsets.append(offsets[-1] + count)
            picked_groups = [RowGroup(g.adapter, offsets[g.start], offsets[g.stop]) for g in groups]
            with torch.set_grad_enabled(with_grad):
                source = hidden[rows, cols]
                picked = self._picked_logprobs(
                    source if with_grad else source.detach(), targets[rows, cols], picked_groups
                )
            scored = torch.index_put(scored, (rows, cols), picked)
        return scored

    def _picked_logprobs(
        self, hidden: torch.Tensor, targets: torch.Tensor, groups: list[RowGroup]
    ) -> torch.Tensor:
        """`_head_logprobs` for `[P, H]` positions, `HEAD_CHUNK` of them at a time (each chunk
        reads the head's weight once; its blocks' tensors stay one chunk wide)."""
        positions = hidden.shape[0]
        if positions <= HEAD_CHUNK:
            return self._head_logprobs(hidden, targets, groups)
        parts = []
        for first in range(0, positions, HEAD_CHUNK):
            stop = min(positions, first + HEAD_CHUNK)
            local = [
                RowGroup(g.adapter, max(g.start, first) - first, min(g.stop, stop) - first)
                for g in groups
                if g.start < stop and g.stop > first
            ]
            parts.append(self._head_logprobs(hidden[first:stop], targets[first:stop], local))
        return torch.cat(parts)

    def _subset_logprobs(
        self,
        values: torch.Tensor,
        hidden: torch.Tensor,
        pos: torch.Tensor,
        tgt: torch.Tensor,
        subset: torch.Tensor,
        offsets: list[int],
        row_groups: list[RowGroup],
        with_grad: bool,
    ) -> torch.Tensor:
        """`values` with the pairs on `subset` positions scored through the head."""
        picked = subset.nonzero(as_tuple=True)[0]
        remap = torch.full((len(subset),), -1, dtype=torch.long)
        remap[picked] = torch.arange(len(picked))
        on_subset = subset[pos]
        per_row = [int(subset[a:b].sum()) for a, b in zip(offsets[:-1], offsets[1:])]
        kept = np.concatenate([[0], np.cumsum(per_row)]).tolist()
        groups = [RowGroup(g.adapter, kept[g.start], kept[g.stop]) for g in row_groups]
        source = hidden[picked.to(self.device)]
        scored = self._pair_logprobs(
            source if with_grad else source.detach(),
            remap[pos[on_subset]],
            tgt[on_subset],
            groups,
        )
        index = on_subset.nonzero(as_tuple=True)[0].to(self.device)
        return torch.index_put(values, (index,), scored)

    def _pair_logprobs(
        self,
        hidden: torch.Tensor,
        pos: torch.Tensor,
        targets: torch.Tensor,
        groups: list[RowGroup],
    ) -> torch.Tensor:
        """log p(targets[m] | position pos[m]) for `[P, H]` positions, HEAD_CHUNK at a time.

        Each position's vocabulary-wide normaliser is computed once however many targets read
        it; backward recomputes a chunk's logits block by block instead of keeping them.
        """
        order = torch.argsort(pos, stable=True)
        pos_sorted, tgt_sorted = pos[order], targets[order]
        positions = hidden.shape[0]
        starts = torch.arange(0, positions + HEAD_CHUNK, HEAD_CHUNK)
        bounds = torch.searchsorted(pos_sorted, starts).tolist()
        parts = []
        for c, first in enumerate(range(0, positions, HEAD_CHUNK)):
            stop = min(positions, first + HEAD_CHUNK)
            a, b = bounds[c], bounds[c + 1]
            local = [
                RowGroup(g.adapter, max(g.start, first) - first, min(g.stop, stop) - first)
                for g in groups
                if g.start < stop and g.stop > first
            ]
            args = (
                hidden[first:stop],
                (pos_sorted[a:b] - first).to(self.device),
                tgt_sorted[a:b].to(self.device),
                local,
            )
            parts.append(self._gather_head(*args))
        values = torch.cat(parts)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(len(order))
        return values[inverse.to(self.device)]

    def _gather_head(
        self, hidden: torch.Tensor, pos: torch.Tensor, targets: torch.Tensor, groups: list[RowGroup]
    ) -> torch.Tensor:
        """log p(targets[m] | hidden[pos[m]]) through the (LoRA-routed, soft-capped) output head,
        fused per vocabulary block: no `[positions, vocabulary]` tensor in forward or backward,
        and repeated pairs (samples of one prompt sharing a first token) add their gradients in
        index order."""
        deltas = fused_head.head_deltas(list(Routing(groups).routed), self._head.name)
        if not self.fused_head_pass:
            if torch.is_grad_enabled():
                return invariance.checkpoint(self._plain_head, hidden, pos, targets, deltas)
            return self._plain_head(hidden, pos, targets, deltas)
        return fused_head.fused_logprobs(
            hidden, pos, targets, self._head.base.weight, self._softcap, deltas
        )

    def _plain_head(
        self,
        hidden: torch.Tensor,
        pos: torch.Tensor,
        targets: torch.Tensor,
        deltas: list[fused_head.HeadDelta],
    ) -> torch.Tensor:
        """The reference head (`fused_head_pass=False`): the whole vocabulary as one block, so
        `[positions, vocabulary]` fp32 logits, their delta add, soft cap and log-softmax are
        all materialised, then read at the pairs (repeats in index order, `take_columns`)."""
        weight = self._head.base.weight
        lows = fused_head.low_rank(hidden, deltas)
        logits = fused_head.block_logits(hidden, weight, 0, weight.shape[0], deltas, lows)
        logprobs = torch.log_softmax(fused_head.soft_cap(logits, self._softcap), -1)
        return take_columns(logprobs, pos, targets[:, None])[:, 0]
