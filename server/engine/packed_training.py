"""forward_backward on packed rows: a shared prompt prefix computed once per group.

The body runs once over rows planned by `prefix_sharing` (attention through
`packed_attention`); the output head scores each distinct packed position once, and every
datum's targets are gathered from it and laid out again as `[datum, time]`, so the losses see
exactly what they see without sharing.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from server.engine import invariant_attention, losses, packed_attention, prefix_sharing
from server.engine.invariance import row_invariant
from server.engine.jobs import ForwardBackwardJob
from server.engine.lora import RowGroup, routing
from server.engine.loss_positions import loss_positions
from server.engine.scoring import UNSCORED_TARGET
from server.engine.training import _pad, _routed_adapter, padded_batches


@dataclass(frozen=True)
class PackedBatch:
    """One planned micro-batch of packed rows: what its body pass, head and losses need."""

    tokens: torch.Tensor  # [rows, width]
    positions: torch.Tensor  # [rows, width]
    layouts: dict[str, object]  # the attention layout of each layer type
    row_groups: list[RowGroup]  # in rows of `tokens`
    flat_real: torch.Tensor  # row-major indices of the real positions
    offsets: list[int]  # where each row's real positions start among them
    members: list[tuple[int, int, int]]  # (row, member, datum) of every datum
    lengths: list[int]  # each datum's length
    flat: dict[str, torch.Tensor]  # the (position, target) pairs and where they go
    depth: int  # targets per position (2-D cross-entropy targets)
    needs_grad: bool


class PackedTraining:
    """Mixin of `Engine`: the shared-prefix twin of `Training._run_microbatch`."""

    tokens_per_microbatch: int
    share_prefixes: bool
    batch_invariant: bool
    head_where_read: bool
    fuse_invariant_runs: bool
    _windows: dict[str, int | None]

    def _forward_packed(
        self,
        jobs: list[ForwardBackwardJob],
        rows: list[tuple[int, int]],
        per_row_lp: dict[tuple[int, int], np.ndarray],
        per_row_loss: dict[tuple[int, int], float],
        last_hidden: dict[tuple[int, int], torch.Tensor] | None = None,
    ) -> None:
        """All rows through packed micro-batches; datums share a row only within one adapter.
        With `last_hidden`, each row's final hidden state is kept there too (detached)."""
        # Backward runs inside too: the head's checkpointed chunks recompute under the same rule.
        with row_invariant(self.batch_invariant):
            for part in self._micro_batches(jobs, rows):
                self._run_packed(jobs, rows, part, per_row_lp, per_row_loss, last_hidden)

    def _forward_invariant(
        self,
        jobs: list[ForwardBackwardJob],
        parts: list[list[tuple[int, int]]],
        per_row_lp: dict[tuple[int, int], np.ndarray],
        per_row_loss: dict[tuple[int, int], float],
    ) -> None:
        """Each job's rows (`parts[j]`) in the micro-batches it has alone, and the micro-batches
        of several jobs fused into one body pass while their padded tokens fit one micro-batch.

        A job's packing, padding and micro-batch boundaries are set by its own data only, and
        a fused pass gives every micro-batch the bits it has alone (`_run_fused`); its
        micro-batches still run in order, at most one per pass, so its gradient accumulates in
        the same order. Two jobs of one adapter never share a pass (their rows would merge into
        one adapter group). Fusing fills what small micro-batches leave of one; a full one has
        nothing to gain and runs alone.
        """
        queues = [deque((part, batch) for batch in self._micro_batches(jobs, part))
                  for part in parts]
        with row_invariant(True):
            while any(queues):
                step: list[tuple[list[tuple[int, int]], PackedBatch]] = []
                size, adapters = 0, set()
                for queue in queues:
                    if not queue:
                        continue
                    part, batch = queue[0]
                    tokens = len(batch) * max(len(row.tokens) for row in batch)
                    adapter = id(_routed_adapter(jobs[part[0][0]]))
                    full = size + tokens > self.tokens_per_microbatch
                    if step and (full or adapter in adapters or not self.fuse_invariant_runs):
                        continue
                    queue.popleft()
                    step.append((part, self._plan_packed(jobs, part, batch)))
                    size += tokens
                    adapters.add(adapter)
                self.stats.fused_passes += len(step) > 1
                self._run_fused(jobs, step, per_row_lp, per_row_loss)

    def _micro_batches(
        self, jobs: list[ForwardBackwardJob], rows: list[tuple[int, int]]
    ) -> list[list[prefix_sharing.PackedRow]]:
        """These datums' packed rows in micro-batches of at most `tokens_per_microbatch`
        padded tokens: a shared prompt once per row where sharing is on, datums of different
        adapters never in one row."""
        packed = prefix_sharing.plan_rows(
            [jobs[j].data[i].tokens for j, i in rows],
            [(id(_routed_adapter(jobs[j])), jobs[j].forward_only) for j, _ in rows],
            row_tokens=min(prefix_sharing.ROW_TOKENS, self.tokens_per_microbatch),
            # Invariance trains on packed rows even with sharing off, one datum per row.
            min_shared=prefix_sharing.MIN_SHARED_TOKENS if self.share_prefixes else sys.maxsize,
        )
        lengths = [len(row.tokens) for row in packed]
        return padded_batches(packed, lengths, self.tokens_per_microbatch)

    def _packed_inputs(
        self, packed: list[prefix_sharing.PackedRow]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, object]]:
        """Padded `[rows, width]` tokens, positions, real-position mask, and attention layouts."""
        width = max(len(r.tokens) for r in packed)
        tokens = torch.zeros((len(packed), width), dtype=torch.long)
        positions = torch.zeros((len(packed), width), dtype=torch.long)
        segments = torch.full((len(packed), width), -1, dtype=torch.long)
        for k, row in enumerate(packed):
            n = len(row.tokens)
            tokens[k, :n] = torch.from_numpy(row.tokens)
            positions[k, :n] = torch.from_numpy(row.positions)
            segments[k, :n] = torch.from_numpy(row.segments)
            positions[k, n:] = torch.arange(width - n) + int(row.positions.max()) + 1
        real = segments >= 0
        if self.batch_invariant:
            views = invariant_attention.plan_views(segments, positions)
            return tokens, positions, real, {
                layer_type: invariant_attention.InvariantLayout(views, window)
                for layer_type, window in self._windows.items()
            }
        layouts = {
            layer_type: packed_attention.PackedLayout(segments, positions, window)
            .prepared(self.device)
            for layer_type, window in self._windows.items()
        }
        return tokens, positions, real, layouts

    def _run_packed(
        self,
        jobs: list[ForwardBackwardJob],
        rows: list[tuple[int, int]],
        packed: list[prefix_sharing.PackedRow],
        per_row_lp: dict[tuple[int, int], np.ndarray],
        per_row_loss: dict[tuple[int, int], float],
        last_hidden: dict[tuple[int, int], torch.Tensor] | None = None,
    ) -> None:
        """One micro-batch of packed rows: the shared-prefix twin of `_run_microbatch`.

        The body runs once over the packed rows. The output head scores each distinct packed
        position once (a shared prompt position once per row, not once per datum) and every
        datum's targets are gathered from it; the scores are laid out again as `[datum, time]`
        so the losses see exactly what they see without sharing.
        """
        self._run_fused(jobs, [(rows, self._plan_packed(jobs, rows, packed))], per_row_lp,
                        per_row_loss, last_hidden)

    def _run_fused(
        self,
        jobs: list[ForwardBackwardJob],
        batches: list[tuple[list[tuple[int, int]], PackedBatch]],
        per_row_lp: dict[tuple[int, int], np.ndarray],
        per_row_loss: dict[tuple[int, int], float],
        last_hidden: dict[tuple[int, int], torch.Tensor] | None = None,
    ) -> None:
        """Planned micro-batches through one body pass, then each one's head and losses, and
        one backward.

        One micro-batch runs as its `[rows, width]` batch. Several (one per run, under
        invariance) run as one column of their tokens, `[tokens, 1]`, each micro-batch's
        tokens in its own row-major order: every product of the body is row-invariant
        (`invariance.linear`), each adapter's rows are the same contiguous block of tokens as
        alone, and each micro-batch's attention views, output head and losses run on their
        own. So every run's numbers and gradients have the bits they have alone.
        """
        dev = self.device
        needs_grad = any(batch.needs_grad for _, batch in batches)
        if len(batches) == 1:
            batch = batches[0][1]
            tokens, positions = batch.tokens, batch.positions
            layouts, groups = batch.layouts, batch.row_groups
        else:
            tokens = torch.cat([batch.tokens.reshape(-1, 1) for _, batch in batches])
            positions = torch.cat([batch.positions.reshape(-1, 1) for _, batch in batches])
            layouts, groups = _stacked(batch for _, batch in batches)
        with torch.set_grad_enabled(needs_grad):
            with routing(groups):
                hidden = self._body(
                    input_ids=tokens.to(dev),
                    attention_mask=layouts,
                    position_ids=positions.to(dev),
                    use_cache=False,
                ).last_hidden_state
            # One split (its backward joins the pieces' gradients in one tensor).
            pieces = hidden.reshape(tokens.numel(), -1).split(
                [batch.tokens.numel() for _, batch in batches])
            total = torch.zeros((), device=dev)
            for (rows, batch), piece in zip(batches, pieces, strict=True):
                total = total + self._packed_losses(
                    jobs, rows, batch, piece, per_row_lp, per_row_loss, last_hidden)
            if needs_grad and total.requires_grad:
                total.backward()

    def _plan_packed(
        self,
        jobs: list[ForwardBackwardJob],
        rows: list[tuple[int, int]],
        packed: list[prefix_sharing.PackedRow],
    ) -> PackedBatch:
        """A micro-batch's inputs, adapter groups and (position, target) pairs."""
        tokens, positions, real, layouts = self._packed_inputs(packed)
        n_rows, width = tokens.shape
        # Rows of one adapter are adjacent (the planner groups them by key).
        row_groups: list[RowGroup] = []
        for k, row in enumerate(packed):
            adapter = _routed_adapter(jobs[rows[row.members[0]][0]])
            if row_groups and row_groups[-1].adapter is adapter:
                row_groups[-1] = RowGroup(adapter, row_groups[-1].start, k + 1)
            else:
                row_groups.append(RowGroup(adapter, k, k + 1))
        # Every real packed position, row-major, gets a compact index for the output head.
        flat_real = real.flatten().nonzero(as_tuple=True)[0]
        compact = torch.full((n_rows * width,), -1, dtype=torch.long)
        compact[flat_real] = torch.arange(len(flat_real))
        offsets = np.concatenate([[0], np.cumsum(real.sum(1).numpy())]).tolist()

        # The datums of this micro-batch, and one (position, target) pair per scored target.
        members = [(k, m, d) for k, row in enumerate(packed) for m, d in enumerate(row.members)]
        lengths = [len(jobs[rows[d][0]].data[rows[d][1]].tokens) for _, _, d in members]
        pairs: dict[str, list[np.ndarray]] = {
            n: [] for n in ("pos", "tgt", "b", "t", "k", "on", "last")
        }
        depth = 1
        for b, (k, m, d) in enumerate(members):
            j, i = rows[d]
            job, datum = jobs[j], jobs[j].data[i]
            targets = datum.inputs["target_tokens"]
            targets = targets[:, None] if targets.ndim == 1 else targets
            n, kk = targets.shape
            depth = max(depth, kk)
            where = compact[torch.from_numpy(k * width + packed[k].columns[m])].numpy()
            pairs["last"].append(where[-1:])
            flat_targets = targets.reshape(-1).astype(np.int64)
            kept = flat_targets != UNSCORED_TARGET
            if job.forward_only:
                active = np.zeros(n * kk, dtype=bool)
            else:
                read, on = loss_positions(job.loss_fn, datum.inputs, np.ones(n, dtype=bool))
                active = np.repeat(on, kk)
                if self.head_where_read:  # a pair the loss never reads skips the head: 0.0
                    kept &= np.repeat(read, kk)
            pairs["pos"].append(np.repeat(where, kk)[kept])
            pairs["tgt"].append(flat_targets[kept])
            pairs["b"].append(np.full(n * kk, b)[kept])
            pairs["t"].append(np.repeat(np.arange(n), kk)[kept])
            pairs["k"].append(np.tile(np.arange(kk), n)[kept])
            pairs["on"].append(active[kept])
        flat = {name: torch.from_numpy(np.concatenate(parts)) for name, parts in pairs.items()}
        needs_grad = any(not jobs[rows[d][0]].forward_only for _, _, d in members)
        return PackedBatch(tokens, positions, layouts, row_groups, flat_real, offsets, members,
                           lengths, flat, depth, needs_grad)

    def _packed_losses(
        self,
        jobs: list[ForwardBackwardJob],
        rows: list[tuple[int, int]],
        batch: PackedBatch,
        hidden: torch.Tensor,
        per_row_lp: dict[tuple[int, int], np.ndarray],
        per_row_loss: dict[tuple[int, int], float],
        last_hidden: dict[tuple[int, int], torch.Tensor] | None,
    ) -> torch.Tensor:
        """A micro-batch's head and losses from its `[rows * width, hidden]` body output; the
        sum of its training jobs' losses (what backward starts from)."""
        dev = self.device
        members, lengths, flat, depth = batch.members, batch.lengths, batch.flat, batch.depth
        pos, tgt = flat["pos"], flat["tgt"]
        offsets, row_groups, needs_grad = batch.offsets, batch.row_groups, batch.needs_grad
        hidden = hidden[batch.flat_real.to(dev)]
        n_pos = hidden.shape[0]
        if last_hidden is not None:
            for b, (_, _, d) in enumerate(members):
                last_hidden[rows[d]] = hidden[int(flat["last"][b])].detach()
        active = torch.zeros(n_pos, dtype=torch.bool)
        active[pos[flat["on"]]] = True
        if not (needs_grad and bool(active.any())):
            active[:] = False
        read = torch.zeros(n_pos, dtype=torch.bool)
        read[pos] = True
        # Each position goes through the head once without gradients if no loss term reads
        # it, else once with them (checkpointed): never both, never once per datum, and
        # never where no target is scored.
        values = torch.zeros(len(pos), dtype=torch.float32, device=dev)
        for with_grad in (False, True):
            subset = active if with_grad else read & ~active
            if bool(subset.any()):
                with torch.set_grad_enabled(with_grad):
                    values = self._subset_logprobs(
                        values, hidden, pos, tgt, subset, offsets, row_groups, with_grad
                    )
        layout = torch.zeros((len(members), max(lengths), depth), device=dev)
        index = (flat["b"].to(dev), flat["t"].to(dev), flat["k"].to(dev))
        target_lp = torch.index_put(layout, index, values)
        total = torch.zeros((), device=dev)
        by_job: dict[int, list[int]] = {}
        for b, (_, _, d) in enumerate(members):
            by_job.setdefault(rows[d][0], []).append(b)
        for j, batch_rows in by_job.items():
            job = jobs[j]
            datums = [job.data[rows[members[b][2]][1]] for b in batch_rows]
            one_d = datums[0].inputs["target_tokens"].ndim == 1
            kk = 1 if one_d else max(d.inputs["target_tokens"].shape[1] for d in datums)
            lp = target_lp[torch.tensor(batch_rows, device=dev)][:, :, :kk]
            if one_d:
                lp = lp[:, :, 0]
            names = {name for d in datums for name in d.inputs} - {"target_tokens"}
            width_j = max(len(d.tokens) for d in datums)
            lp = lp[:, :width_j]
            inputs = {
                name: _pad([d.inputs[name] for d in datums], width_j, 0, torch.float32).to(dev)
                for name in names
            }
            row_losses = losses.resolve(job.loss_fn)(lp, inputs, job.loss_fn_config)
            if not job.forward_only:
                total = total + row_losses.sum()
            for q, b in enumerate(batch_rows):
                key = rows[members[b][2]]
                per_row_lp[key] = lp[q, : lengths[b]].detach().float().cpu().numpy()
                per_row_loss[key] = float(row_losses[q].detach())
        return total


def _stacked(batches: Iterable[PackedBatch]) -> tuple[dict[str, object], list[RowGroup]]:
    """The attention layouts and adapter groups of invariant micro-batches laid end to end as
    one column of tokens: each one's views and groups moved to where its tokens start."""
    views: dict[str, list[invariant_attention.Views]] = {}
    windows: dict[str, int | None] = {}
    groups: list[RowGroup] = []
    first = 0
    for batch in batches:
        rows, width = batch.tokens.shape
        for layer_type, layout in batch.layouts.items():
            assert isinstance(layout, invariant_attention.InvariantLayout)
            windows[layer_type] = layout.window
            views.setdefault(layer_type, []).extend(v.moved(first, width) for v in layout.views)
        groups += [RowGroup(g.adapter, first + g.start * width, first + g.stop * width)
                   for g in batch.row_groups]
        first += rows * width
    layouts: dict[str, object] = {
        layer_type: invariant_attention.InvariantLayout(tuple(v), windows[layer_type])
        for layer_type, v in views.items()
    }
    return layouts, groups
