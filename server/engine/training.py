"""Training jobs: validation, forward_backward over fused micro-batches, optimizer steps.

Several runs' forward_backward work runs as padded micro-batches, each row through its own
LoRA adapter; rows of one job stay contiguous and micro-batches split only between jobs or
rows, so gradient accumulation gives each run exactly the gradient of its own loss sum. With
prefix sharing on, `packed_training` runs the same work on packed rows instead.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import TypeVar

import numpy as np
import torch

from server.engine import losses
from server.engine.dimuon import Dimuon
from server.engine.jobs import (
    AdamParams,
    DimuonParams,
    ForwardBackwardJob,
    ForwardBackwardResult,
    NonFiniteRun,
    RunState,
    UserError,
)
from server.engine.lora import AdapterWeights, RowGroup
from server.engine.loss_positions import loss_positions

T = TypeVar("T")

TOKENS_PER_MICROBATCH = {"cpu": 2048}
"""Padded tokens per training micro-batch, by device type (default 8192, which an accelerator
replaces with a size from its free memory: `microbatch_budget`). Activations kept for
backward cost about 1 MiB per token on Gemma 3 270M, so a CPU box sharing its RAM with
everything else gets small micro-batches; they are large enough to keep its cores busy."""
DEFAULT_TOKENS_PER_MICROBATCH = 8192
TWO_D_INPUTS = frozenset({"target_tokens", "weights"})
"""Loss inputs that may carry several values per position (cross-entropy over several
targets); every other input is one value per position."""


class Training:
    """Mixin of `Engine`: validating and running forward_backward, and optimizer steps."""

    tokens_per_microbatch: int
    max_context: int
    vocab_size: int
    share_prefixes: bool
    batch_invariant: bool
    head_where_read: bool
    _can_pack: bool
    size_microbatches: Callable[[], None]

    # ----------------------------------------------------------- validation
    def validate(self, job: ForwardBackwardJob) -> None:
        loss_fn = losses.resolve(job.loss_fn)
        required = losses.REQUIRED_INPUTS[job.loss_fn]
        if not job.data:
            raise UserError("forward_backward needs at least one datum")
        keys = set(job.data[0].inputs)
        target_dims = job.data[0].inputs.get("target_tokens", np.zeros(0)).ndim
        for i, datum in enumerate(job.data):
            if set(datum.inputs) != keys:
                raise UserError(
                    f"data[{i}] has loss_fn_inputs {sorted(datum.inputs)}, but data[0] has "
                    f"{sorted(keys)}: every datum of one call needs the same inputs"
                )
            dims = datum.inputs.get("target_tokens", np.zeros(0)).ndim
            if dims != target_dims:
                raise UserError(
                    f"data[{i}].target_tokens is {dims}-D but data[0]'s is {target_dims}-D: "
                    "one call's targets are all 1-D or all 2-D"
                )
            n = len(datum.tokens)
            if n == 0:
                raise UserError(f"data[{i}]: empty model_input")
            if n > self.max_context:
                raise UserError(f"data[{i}]: {n} tokens exceed the context of {self.max_context}")
            self._check_vocab(datum.tokens, f"data[{i}].model_input")
            missing = [k for k in required if k not in datum.inputs]
            if missing:
                raise UserError(f"data[{i}]: loss {job.loss_fn!r} needs loss_fn_inputs {missing}")
            for name, arr in datum.inputs.items():
                if arr.ndim not in (1, 2) or (arr.ndim == 2 and name not in TWO_D_INPUTS):
                    raise UserError(
                        f"data[{i}].loss_fn_inputs[{name!r}] is {arr.ndim}-D; only "
                        f"{sorted(TWO_D_INPUTS)} may be 2-D, the rest are 1-D"
                    )
                if arr.shape[0] != n:
                    raise UserError(
                        f"data[{i}].loss_fn_inputs[{name!r}] has length {arr.shape[0]}, "
                        f"but model_input has {n} tokens"
                    )
                if arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
                    raise UserError(f"data[{i}].loss_fn_inputs[{name!r}] has NaN or inf")
            targets = datum.inputs["target_tokens"]
            self._check_vocab(targets, f"data[{i}].target_tokens")
            if targets.ndim == 2 and job.loss_fn != "cross_entropy":
                raise UserError("2-D target_tokens are only supported by cross_entropy")
            if job.loss_fn == "cross_entropy":
                weights = datum.inputs["weights"]
                if weights.shape != targets.shape and weights.shape != targets.shape[:1]:
                    raise UserError(
                        f"data[{i}]: weights shape {weights.shape} does not match "
                        f"target_tokens shape {targets.shape}"
                    )
        del loss_fn

    def forward_backward(self, jobs: list[ForwardBackwardJob]) -> list[ForwardBackwardResult]:
        """Run several runs' forward_backward work as padded micro-batches, fused across jobs
        unless the engine is batch-invariant.

        Rows of one job stay contiguous; micro-batches split only between jobs or between rows,
        so gradient accumulation gives each run exactly the gradient of its own loss sum.
        """
        self.size_microbatches()  # once, on an accelerator: from its free memory
        started = time.perf_counter()
        rows: list[tuple[int, int]] = [
            (j, i) for j, job in enumerate(jobs) for i in range(len(job.data))
        ]
        per_row_lp: dict[tuple[int, int], np.ndarray] = {}
        per_row_loss: dict[tuple[int, int], float] = {}
        if self.batch_invariant:
            # Each job's micro-batches, padding and packed rows are set by its own data, never
            # by the jobs it was batched with; their body passes are shared where
            # `fuse_invariant_runs` is on.
            parts = [[r for r in rows if r[0] == j] for j in range(len(jobs))]
            self._forward_invariant(jobs, parts, per_row_lp, per_row_loss)
        elif self._can_pack and self.share_prefixes:
            self._forward_packed(jobs, rows, per_row_lp, per_row_loss)
        else:
            lengths = [len(jobs[j].data[i].tokens) for j, i in rows]
            for chunk in padded_batches(rows, lengths, self.tokens_per_microbatch):
                self._run_microbatch(jobs, chunk, per_row_lp, per_row_loss)
        results = []
        for j, job in enumerate(jobs):
            outputs = [{"logprobs": per_row_lp[(j, i)]} for i in range(len(job.data))]
            loss = sum(per_row_loss[(j, i)] for i in range(len(job.data)))
            results.append(ForwardBackwardResult(outputs, {"loss:sum": loss}))
        elapsed = time.perf_counter() - started
        self.stats.busy_seconds += elapsed
        self.stats.train_seconds += elapsed
        self.stats.train_batches += 1
        self.stats.last_batch_rows = len(rows)
        self.stats.train_tokens += sum(len(jobs[j].data[i].tokens) for j, i in rows)
        return results

    def _run_microbatch(
        self,
        jobs: list[ForwardBackwardJob],
        chunk: list[tuple[int, int]],
        per_row_lp: dict[tuple[int, int], np.ndarray],
        per_row_loss: dict[tuple[int, int], float],
    ) -> None:
        datums = [jobs[j].data[i] for j, i in chunk]
        width = max(len(d.tokens) for d in datums)
        tokens = _pad([d.tokens for d in datums], width, 0, torch.long).to(self.device)
        mask = _pad([np.ones(len(d.tokens)) for d in datums], width, 0, torch.long).to(self.device)
        two_d = {d.inputs["target_tokens"].ndim == 2 for d in datums}
        if len(two_d) > 1:
            # 1-D and 2-D targets cannot share one tensor; run them apart.
            for flag in sorted(two_d):
                sub = [
                    r
                    for r in chunk
                    if (jobs[r[0]].data[r[1]].inputs["target_tokens"].ndim == 2) == flag
                ]
                self._run_microbatch(jobs, sub, per_row_lp, per_row_loss)
            return
        targets = _pad([d.inputs["target_tokens"] for d in datums], width, 0, torch.long)
        one_d = targets.dim() == 2
        targets = (targets.unsqueeze(-1) if one_d else targets).to(self.device)
        # One row group per job, in chunk order (rows of a job are contiguous).
        spans: list[tuple[int, int, int]] = []
        for k, (j, _) in enumerate(chunk):
            if spans and spans[-1][0] == j:
                spans[-1] = (j, spans[-1][1], k + 1)
            else:
                spans.append((j, k, k + 1))
        groups = [RowGroup(_routed_adapter(jobs[j]), a, b) for j, a, b in spans]
        needs_grad = any(not jobs[j].forward_only for j, _ in chunk)
        padded: dict[int, dict[str, torch.Tensor]] = {}
        active = torch.zeros(tokens.shape, dtype=torch.bool, device=self.device)
        read = mask.bool()
        for j, a, b in spans:
            job, members = jobs[j], chunk[a:b]
            names = {name for _, i in members for name in job.data[i].inputs}
            names.discard("target_tokens")
            padded[j] = {
                name: _pad(
                    [job.data[i].inputs[name] for _, i in members], width, 0, torch.float32
                ).to(self.device)
                for name in names
            }
            padded[j][losses.TOKEN_MASK] = mask[a:b].to(torch.float32)
            if not job.forward_only:
                loss_read, active[a:b] = loss_positions(job.loss_fn, padded[j], mask[a:b].bool())
                if self.head_where_read:
                    read[a:b] = loss_read
        with torch.set_grad_enabled(needs_grad):
            target_lp = self._target_logprobs(tokens, mask, targets, groups, active, read)
            if one_d:
                target_lp = target_lp.squeeze(-1)
            total = torch.zeros((), device=self.device)
            for j, a, b in spans:
                job, members = jobs[j], chunk[a:b]
                row_losses = losses.resolve(job.loss_fn)(
                    target_lp[a:b], padded[j], job.loss_fn_config
                )
                if not job.forward_only:
                    total = total + row_losses.sum()
                for k, (_, i) in enumerate(members):
                    n = len(job.data[i].tokens)
                    per_row_lp[(j, i)] = target_lp[a + k, :n].detach().float().cpu().numpy()
                    per_row_loss[(j, i)] = float(row_losses[k].detach())
            if needs_grad and total.requires_grad:
                total.backward()

    def optim_step(self, state: RunState,
                   params: AdamParams | DimuonParams) -> dict[str, float]:
        """One step of the run's own optimizer (AdamW or Dimuon, chosen when the run was
        created) on this run only; its gradient norm is clipped on its own gradients.

        A step is all or nothing: gradients that are not finite are refused before anything
        moves, and a step whose result is not finite anyway is undone, so weights and AdamW
        state stay as they were and the run can go on from its last good state. Both refusals
        are the client's error.
        """
        started = time.perf_counter()
        if state.nonfinite is not None:
            raise NonFiniteRun(state.nonfinite)
        dimuon = isinstance(state.optimizer, Dimuon)
        if dimuon != isinstance(params, DimuonParams):
            made, sent = ("Dimuon", "AdamW") if dimuon else ("AdamW", "Dimuon")
            wanted = "DimuonParams" if dimuon else "AdamParams"
            raise UserError(
                f"optim_step refused: this run was created with the {made} optimizer and the "
                f"step sent {sent} parameters; send {wanted} (the optimizer is fixed when the "
                "training client is created)"
            )
        tensors = state.adapter.parameters()
        grads = [t for t in tensors if t.grad is not None]
        clip = params.grad_clip_norm if params.grad_clip_norm > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(grads, clip)) if grads else 0.0
        if not math.isfinite(norm):
            state.optimizer.zero_grad(set_to_none=True)
            raise UserError(
                f"optim_step refused: the accumulated gradient norm is {norm} (a loss that is "
                "not finite, e.g. logprobs far from the model's); the gradients were dropped and "
                "the weights and optimizer state are unchanged"
            )
        # AdamW skips tensors without a gradient: with none, nothing can move.
        saved = _snapshot(state) if grads else None
        for group in state.optimizer.param_groups:
            group["lr"] = params.learning_rate
            if isinstance(params, DimuonParams):
                group["beta1"] = params.beta1
            else:
                group["betas"] = (params.beta1, params.beta2)
                group["eps"] = params.eps
                group["weight_decay"] = params.weight_decay
        state.optimizer.step()
        state.optimizer.zero_grad(set_to_none=True)
        if saved is not None and not _all_finite(tensors):
            _restore(state, saved)
            raise UserError(
                "optim_step refused: the step would make the weights non-finite "
                f"(learning_rate={params.learning_rate}, "
                f"weight_decay={getattr(params, 'weight_decay', 0.0)}); "
                "it was undone and the weights and optimizer state are unchanged"
            )
        state.steps += 1
        elapsed = time.perf_counter() - started
        self.stats.busy_seconds += elapsed
        self.stats.train_seconds += elapsed
        return {"grad_norm:mean": norm, "learning_rate:mean": params.learning_rate}


def padded_batches(items: list[T], lengths: list[int], limit: int) -> list[list[T]]:
    """Consecutive items in micro-batches whose padded size (the longest item times their
    count) stays within `limit` tokens; an item longer than `limit` gets a batch of its own."""
    batches: list[list[T]] = [[]]
    longest = 0
    for item, n in zip(items, lengths, strict=True):
        if batches[-1] and max(longest, n) * (len(batches[-1]) + 1) > limit:
            batches.append([])
            longest = 0
        batches[-1].append(item)
        longest = max(longest, n)
    return batches


def _pad(rows: list[np.ndarray], width: int, value: float, dtype: torch.dtype) -> torch.Tensor:
    """Right-pad 1-D or 2-D per-row arrays to `width` positions."""
    trailing = rows[0].shape[1:]
    out = torch.full((len(rows), width, *trailing), value, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.from_numpy(np.ascontiguousarray(row)).to(dtype)
    return out


def _routed_adapter(job: ForwardBackwardJob) -> AdapterWeights:
    """The adapter a job's rows go through: forward-only jobs through a detached view, so
    being fused with a training job never gives their run a gradient."""
    adapter = job.state.adapter
    return adapter.detached() if job.forward_only and adapter is not None else adapter


def _all_finite(tensors: list[torch.Tensor]) -> bool:
    """One reduction per tensor, no copies: a single flag to the host."""
    if not tensors:
        return True
    return bool(torch.stack([torch.isfinite(t.detach()).all() for t in tensors]).all())


def _snapshot(state: RunState) -> tuple[list[torch.Tensor], dict]:
    """The run's weights and AdamW state, copied, so a step can be undone."""
    weights = [t.detach().clone() for t in state.adapter.parameters()]
    optim = {
        id(p): {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()}
        for p, s in state.optimizer.state.items()
    }
    return weights, optim


def _restore(state: RunState, saved: tuple[list[torch.Tensor], dict]) -> None:
    weights, optim = saved
    with torch.no_grad():
        for tensor, value in zip(state.adapter.parameters(), weights):
            tensor.copy_(value)
    for param in list(state.optimizer.state):
        if id(param) in optim:
            state.optimizer.state[param] = optim[id(param)]
        else:
            del state.optimizer.state[param]
