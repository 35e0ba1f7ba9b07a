"""Log-probabilities through the vocabulary-wide output head, a chunk of positions at a time.

Gemma's output head (262k tokens) costs more than the whole body of a small model, and its
`[positions, vocabulary]` tensors are about 1 MiB per position each. Every path that scores
tokens (training's losses, packed rows, prompt logprobs) goes through here, so each position's
log-softmax is computed once, in chunks, and recomputed in backward instead of kept.
"""

from __future__ import annotations

import numpy as np
import torch

from server.engine import invariance
from server.engine.invariant_attention import take_columns
from server.engine.lora import RowGroup, routing

HEAD_CHUNK = 512
"""Positions per output-head chunk (bounds the vocabulary-wide tensors: about 1 MiB per
position each on Gemma's 262k vocabulary)."""
UNSCORED_TARGET = -1
"""An internal scoring job's target at a position nobody asked about: the pair is dropped, and
a position no pair reads skips the output head. Users' targets are checked against the
vocabulary, so theirs never carry it."""


class HeadScoring:
    """Mixin of `Engine`: scoring through the (LoRA-routed, soft-capped) output head."""

    _head: torch.nn.Module
    _body: torch.nn.Module
    _softcap: float | None
    device: torch.device

    # ------------------------------------------------------------- training
    def _head_logprobs(
        self, hidden: torch.Tensor, targets: torch.Tensor, groups: list[RowGroup]
    ) -> torch.Tensor:
        """log p(target) from final hidden states, through the (LoRA-routed) output head.

        `log_softmax` then `gather`: one fused pass each way over the vocabulary, where
        `gather - logsumexp` makes several (about 1.6x the time for the same peak memory).
        """
        return torch.gather(self._vocab_logprobs(hidden, groups), -1, targets)

    def _vocab_logprobs(self, hidden: torch.Tensor, groups: list[RowGroup]) -> torch.Tensor:
        """Log-softmax over the vocabulary of the (LoRA-routed, soft-capped) output head: the
        formula `decoding.choose` reports a sampled token's logprob with."""
        with routing(groups):
            logits = self._head(hidden).float()
        if self._softcap:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return torch.log_softmax(logits, dim=-1)

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
        """`_head_logprobs` with gradients for `[P, H]` positions, a chunk of them at a time.

        Each chunk's vocabulary-wide logits are recomputed in backward instead of kept, so
        memory holds one chunk's `[chunk, V]` tensors rather than every position's (for
        Gemma's 262k vocabulary, about 1 MiB per position per tensor).
        """
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
            parts.append(
                invariance.checkpoint(
                    self._head_logprobs, hidden[first:stop], targets[first:stop], local
                )
            )
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
            checkpointed=with_grad,
        )
        index = on_subset.nonzero(as_tuple=True)[0].to(self.device)
        return torch.index_put(values, (index,), scored)

    def _pair_logprobs(
        self,
        hidden: torch.Tensor,
        pos: torch.Tensor,
        targets: torch.Tensor,
        groups: list[RowGroup],
        checkpointed: bool,
    ) -> torch.Tensor:
        """log p(targets[m] | position pos[m]) for `[P, H]` positions, HEAD_CHUNK at a time.

        Each position's vocabulary-wide log-softmax is computed once however many targets read
        it. With `checkpointed`, a chunk's logits are recomputed in backward instead of kept.
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
            if checkpointed:
                parts.append(
                    invariance.checkpoint(self._gather_head, *args)
                )
            else:
                parts.append(self._gather_head(*args))
        values = torch.cat(parts)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(len(order))
        return values[inverse.to(self.device)]

    def _gather_head(
        self, hidden: torch.Tensor, pos: torch.Tensor, targets: torch.Tensor, groups: list[RowGroup]
    ) -> torch.Tensor:
        """Log-softmax over the vocabulary for `hidden`, read at `(pos, targets)` pairs.

        Samples of one prompt often share their first token, so a pair can repeat: read as the
        attention views read repeated keys (`take_columns`), whose backward adds repeats in
        index order rather than with advanced indexing's parallel atomic adds."""
        logprobs = self._vocab_logprobs(hidden, groups)
        return take_columns(logprobs, pos, targets[:, None])[:, 0]

