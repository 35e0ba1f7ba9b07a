"""forward_backward on packed rows: a shared prompt prefix computed once per group.

The body runs once over rows planned by `prefix_sharing` (attention through
`packed_attention`); the output head scores each distinct packed position once, and every
datum's targets are gathered from it and laid out again as `[datum, time]`, so the losses see
exactly what they see without sharing.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

from server.engine import invariant_attention, losses, packed_attention, prefix_sharing
from server.engine.invariance import row_invariant
from server.engine.jobs import ForwardBackwardJob
from server.engine.lora import RowGroup, routing
from server.engine.loss_positions import loss_positions
from server.engine.scoring import UNSCORED_TARGET
from server.engine.training import _pad, _routed_adapter, padded_batches


class PackedTraining:
    """Mixin of `Engine`: the shared-prefix twin of `Training._run_microbatch`."""

    tokens_per_microbatch: int
    share_prefixes: bool
    batch_invariant: bool
    head_where_read: bool
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
        packed = prefix_sharing.plan_rows(
            [jobs[j].data[i].tokens for j, i in rows],
            [(id(_routed_adapter(jobs[j])), jobs[j].forward_only) for j, _ in rows],
            row_tokens=min(prefix_sharing.ROW_TOKENS, self.tokens_per_microbatch),
            # Invariance trains on packed rows even with sharing off, one datum per row.
            min_shared=prefix_sharing.MIN_SHARED_TOKENS if self.share_prefixes else sys.maxsize,
        )
        lengths = [len(row.tokens) for row in packed]
        # Backward runs inside too: the head's checkpointed chunks recompute under the same rule.
        with row_invariant(self.batch_invariant):
            for part in padded_batches(packed, lengths, self.tokens_per_microbatch):
                self._run_packed(jobs, rows, part, per_row_lp, per_row_loss, last_hidden)

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
        dev = self.device
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
        pos, tgt = flat["pos"], flat["tgt"]
        needs_grad = any(not jobs[rows[d][0]].forward_only for _, _, d in members)

        with torch.set_grad_enabled(needs_grad):
            with routing(row_groups):
                hidden = self._body(
                    input_ids=tokens.to(dev),
                    attention_mask=layouts,
                    position_ids=positions.to(dev),
                    use_cache=False,
                ).last_hidden_state
            hidden = hidden.reshape(n_rows * width, -1)[flat_real.to(dev)]
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
            if needs_grad and total.requires_grad:
                total.backward()

