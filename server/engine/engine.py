"""The engine: all tensor work on the one resident base model.

It knows nothing of HTTP, sessions or ordering. It is given *jobs* (forward_backward for some
training runs, optimizer steps, sampling requests) and runs them as padded batches, several
runs fused into one batch where asked, each row through its own LoRA adapter. Validation of
user data happens here too, because only the engine knows the vocabulary and the model.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.utils.checkpoint

from server.engine import decoding, host_decoding, losses, packed_attention, prefix_sharing
from server.engine.lora import AdapterWeights, LoraSpec, RowGroup, new_adapter, routing, wrap_model
from server.engine.model_loading import LoadedModel
from server.protocol.codec import Datum, SampledSequence, SampleResult


class UserError(ValueError):
    """The request is invalid; report it to the client as a `user` error."""


class NonFiniteRun(UserError):
    """The run's weights are not finite; load a checkpoint into it to go on."""


@dataclass
class AdamParams:
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0


@dataclass
class RunState:
    """What the engine holds for one training run: its adapter and its own optimizer."""

    adapter: AdapterWeights
    optimizer: torch.optim.AdamW
    steps: int = 0
    nonfinite: str | None = None
    """Why the run's weights are not finite (set when weights were loaded so); such a run
    refuses training until a checkpoint is loaded into it."""


@dataclass
class ForwardBackwardJob:
    state: RunState
    data: list[Datum]
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool


@dataclass
class ForwardBackwardResult:
    outputs: list[dict[str, np.ndarray]]
    metrics: dict[str, float]


@dataclass
class SamplingParams:
    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    stop: list[str] | list[int] | None = None


@dataclass
class SampleJob:
    adapter: AdapterWeights | None
    prompt: list[int]
    num_samples: int
    params: SamplingParams
    prompt_logprobs: bool = False
    topk_prompt_logprobs: int = 0
    topk_sample_logprobs: int = 0
    first_sample: int = 0
    """Index of this job's first sample within its request: a request wider than one decode
    batch is decoded as several jobs, and each row keeps the random stream of its index."""


@dataclass
class EngineStats:
    """Counters for observability; the scheduler reads them."""

    busy_seconds: float = 0.0
    train_tokens: int = 0
    sample_tokens: int = 0
    train_batches: int = 0
    sample_batches: int = 0
    last_batch_rows: int = 0
    started: float = field(default_factory=time.monotonic)


DEFAULT_MAX_TOKENS = 256
MAX_NUM_SAMPLES = 1024
MAX_DECODE_ROWS = 128
"""Rows decoded together at most; a request for more samples is decoded in several batches."""
MIN_TEMPERATURE = 1e-4
"""Below this a temperature is greedy decoding: dividing logits by less overflows float32 and
every logprob would be NaN."""
MAX_TOPK_PROMPT_LOGPROBS = 1024
MAX_TOPK_PROMPT_VALUES = 1 << 22
"""`topk_prompt_logprobs` times prompt length: the ids and logprobs a result may hold (32 MiB)."""
MAX_STOP_SEQUENCES = 32
MAX_STOP_CHARS = 256
TOKENS_PER_MICROBATCH = {"cpu": 2048}
"""Padded tokens per training micro-batch, by device type (default 8192). Activations kept for
backward cost about 1 MiB per token on Gemma 3 270M, so a CPU box sharing its RAM with
everything else gets small micro-batches; they are large enough to keep its cores busy."""
DEFAULT_TOKENS_PER_MICROBATCH = 8192
HEAD_CHUNK = 512
TWO_D_INPUTS = frozenset({"target_tokens", "weights"})
"""Loss inputs that may carry several values per position (cross-entropy over several
targets); every other input is one value per position."""
SHARE_PREFIXES_ENV = "AUTORESEARCH_SHARE_PREFIXES"
DEVICE_SAMPLING_ENV = "AUTORESEARCH_DEVICE_SAMPLING"
"""Positions per output-head chunk (bounds the vocabulary-wide tensors: about 1 MiB per
position each on Gemma's 262k vocabulary)."""


def _pad(rows: list[np.ndarray], width: int, value: float, dtype: torch.dtype) -> torch.Tensor:
    """Right-pad 1-D or 2-D per-row arrays to `width` positions."""
    trailing = rows[0].shape[1:]
    out = torch.full((len(rows), width, *trailing), value, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.from_numpy(np.ascontiguousarray(row)).to(dtype)
    return out


def _cache_of(output: object) -> object:
    cache = getattr(output, "cache", None)
    return cache if cache is not None else output.past_key_values


class Engine:
    """Owns the base model and runs batched training and sampling on it."""

    def __init__(
        self,
        loaded: LoadedModel,
        max_context: int | None = None,
        share_prefixes: bool | None = None,
        device_sampling: bool | None = None,
    ):
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.model_name = loaded.model_name
        self.device = loaded.device
        self.dtype = loaded.dtype
        self.dtype_reason = loaded.dtype_reason
        self.model_origin = loaded.origin or loaded.model_name
        self.layers = wrap_model(self.model)
        config = self.model.config
        self.vocab_size = int(self.model.get_output_embeddings().out_features)
        self.max_context = int(max_context or getattr(config, "max_position_embeddings", 8192))
        self.eos_ids = self._eos_ids()
        anchor = self.tokenizer.encode("a", add_special_tokens=False) or [0]
        self._pieces = decoding.TokenPieces(self.tokenizer.decode, int(anchor[0]))
        self._body = self.model.get_decoder()
        self._head = self.model.get_output_embeddings()
        self._softcap = getattr(config, "final_logit_softcapping", None)
        params = inspect.signature(self.model.forward).parameters
        self._cache_kw = "cache" if "cache" in params else "past_key_values"
        self.stats = EngineStats()
        self.lock = threading.Lock()
        self.tokens_per_microbatch = TOKENS_PER_MICROBATCH.get(
            torch.device(self.device).type, DEFAULT_TOKENS_PER_MICROBATCH
        )
        if share_prefixes is None:
            share_prefixes = os.environ.get(SHARE_PREFIXES_ENV, "1") != "0"
        self.share_prefixes = share_prefixes
        """Compute prompt prefixes shared by several datums once (see `prefix_sharing`); off:
        every datum on its own row, as before (kept for benchmarks and as a reference)."""
        if device_sampling is None:
            device_sampling = os.environ.get(DEVICE_SAMPLING_ENV, "1") != "0"
        self.device_sampling = device_sampling
        """Choose tokens where the logits are (see `decoding`); off: the host-side loop of
        `host_decoding`, kept as the reference a benchmark compares with."""
        self._layer_types = set(getattr(config, "layer_types", None) or [])
        self._sliding_window = getattr(config, "sliding_window", None)
        # Packed rows need per-layer-type layouts, which Gemma 3's SDPA or eager attention takes
        # through `packed_attention`.
        self._can_pack = (
            bool(self._layer_types)
            and self._layer_types <= {"sliding_attention", "full_attention"}
            and packed_attention.install(self.model)
        )

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        gen = getattr(self.model, "generation_config", None)
        for source in (getattr(gen, "eos_token_id", None), self.tokenizer.eos_token_id):
            if isinstance(source, int):
                ids.add(source)
            elif source:
                ids.update(int(i) for i in source)
        end_of_turn = self.tokenizer.convert_tokens_to_ids("<end_of_turn>")
        if isinstance(end_of_turn, int) and end_of_turn != self.tokenizer.unk_token_id:
            ids.add(end_of_turn)  # chat-tuned Gemma ends its turns with this token
        return ids

    # ----------------------------------------------------------------- runs
    def create_run(self, spec: LoraSpec, seed: int) -> RunState:
        if not 1 <= spec.rank <= 512:
            raise UserError(f"LoRA rank must be between 1 and 512, got {spec.rank}")
        if not (spec.train_attn or spec.train_mlp or spec.train_unembed):
            raise UserError("at least one of train_attn, train_mlp, train_unembed must be true")
        adapter = new_adapter(self.layers, spec, seed, self.device)
        return RunState(adapter, self._optimizer(adapter))

    def _optimizer(self, adapter: AdapterWeights) -> torch.optim.AdamW:
        return torch.optim.AdamW(
            adapter.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0
        )

    def restore_run(self, adapter: AdapterWeights, optimizer_state: dict | None) -> RunState:
        for tensor in adapter.parameters():
            tensor.requires_grad_(True)
        state = RunState(adapter, self._optimizer(adapter))
        if optimizer_state is not None:
            state.optimizer.load_state_dict(optimizer_state)
        if not _all_finite(adapter.parameters()):
            state.nonfinite = (
                "the run's weights are not finite (they were loaded so); its forward passes "
                "give NaN for it alone and optim_step is refused until a finite checkpoint is "
                "loaded with load_state"
            )
        return state

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

    def _check_vocab(self, tokens: np.ndarray, what: str) -> None:
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            bad = int(tokens.max()) if tokens.max() >= self.vocab_size else int(tokens.min())
            raise UserError(
                f"{what}: token id {bad} is outside the vocabulary [0, {self.vocab_size})"
            )

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
        """Log-softmax over the vocabulary of the (LoRA-routed, soft-capped) output head."""
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
    ) -> torch.Tensor:
        """log p(target | prefix) for `[B, T, K]` targets.

        The output head over Gemma's 262k-token vocabulary costs more than the whole body of a
        small model. So every position is scored once without gradients (in chunks, never
        holding `[B, T, V]` logits), and only the `active` positions (those with a non-zero
        weight or advantage) go through the head again with gradients. Positions whose loss
        term is zero get no gradient either way, so the gradient is unchanged.
        """
        with routing(groups):
            hidden = self._body(input_ids=tokens, attention_mask=mask, use_cache=False)
            hidden = hidden.last_hidden_state
        batch, width = tokens.shape
        grad = active is not None and torch.is_grad_enabled() and bool(active.any())
        if grad and int(active.sum()) * 2 > int(mask.sum()):
            # Most positions carry weight: score every real position once, with gradients.
            need = mask.bool()
            scored = torch.zeros(targets.shape, dtype=torch.float32, device=self.device)
        else:
            need = active
            step = max(1, HEAD_CHUNK // max(1, batch))
            with torch.no_grad():
                scored = torch.cat(
                    [
                        self._head_logprobs(
                            hidden[:, t : t + step].detach(), targets[:, t : t + step], groups
                        )
                        for t in range(0, width, step)
                    ],
                    dim=1,
                )
            if not grad:
                return scored
        rows, cols = need.nonzero(as_tuple=True)  # row-major: each group's rows stay together
        counts = need.sum(dim=1).tolist()
        offsets = [0]
        for count in counts:
            offsets.append(offsets[-1] + count)
        picked_groups = [RowGroup(g.adapter, offsets[g.start], offsets[g.stop]) for g in groups]
        picked = self._picked_logprobs(hidden[rows, cols], targets[rows, cols], picked_groups)
        return torch.index_put(scored, (rows, cols), picked)

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
                torch.utils.checkpoint.checkpoint(
                    self._head_logprobs,
                    hidden[first:stop],
                    targets[first:stop],
                    local,
                    use_reentrant=False,
                )
            )
        return torch.cat(parts)

    @staticmethod
    def _active_positions(
        loss_fn: str, inputs: dict[str, torch.Tensor], real: torch.Tensor
    ) -> torch.Tensor:
        """Positions whose loss term can be non-zero (so need gradients)."""
        if loss_fn == "cross_entropy":
            weights = inputs["weights"]
            return (weights != 0).flatten(2).any(-1) if weights.dim() > 2 else weights != 0
        if loss_fn in ("importance_sampling", "ppo", "cispo", "gspo"):
            return inputs["advantages"] != 0
        if loss_fn in losses.NEEDS_SAMPLING_RECORD:
            return inputs[losses.RECORDED_MASK] != 0
        return real.bool()  # e.g. dro: its quadratic term is not masked by the advantages

    def forward_backward(self, jobs: list[ForwardBackwardJob]) -> list[ForwardBackwardResult]:
        """Run several runs' forward_backward work as fused, padded micro-batches.

        Rows of one job stay contiguous; micro-batches split only between jobs or between rows,
        so gradient accumulation gives each run exactly the gradient of its own loss sum.
        """
        started = time.perf_counter()
        rows: list[tuple[int, int]] = [
            (j, i) for j, job in enumerate(jobs) for i in range(len(job.data))
        ]
        per_row_lp: dict[tuple[int, int], np.ndarray] = {}
        per_row_loss: dict[tuple[int, int], float] = {}
        if self.share_prefixes and self._can_pack:
            self._forward_packed(jobs, rows, per_row_lp, per_row_loss)
        else:
            for chunk in self._microbatches(jobs, rows):
                self._run_microbatch(jobs, chunk, per_row_lp, per_row_loss)
        results = []
        for j, job in enumerate(jobs):
            outputs = [{"logprobs": per_row_lp[(j, i)]} for i in range(len(job.data))]
            loss = sum(per_row_loss[(j, i)] for i in range(len(job.data)))
            results.append(ForwardBackwardResult(outputs, {"loss:sum": loss}))
        self.stats.busy_seconds += time.perf_counter() - started
        self.stats.train_batches += 1
        self.stats.last_batch_rows = len(rows)
        self.stats.train_tokens += sum(len(jobs[j].data[i].tokens) for j, i in rows)
        return results

    def _microbatches(
        self, jobs: list[ForwardBackwardJob], rows: list[tuple[int, int]]
    ) -> list[list[tuple[int, int]]]:
        chunks: list[list[tuple[int, int]]] = [[]]
        longest = 0
        for row in rows:
            n = len(jobs[row[0]].data[row[1]].tokens)
            limit = self.tokens_per_microbatch
            if chunks[-1] and max(longest, n) * (len(chunks[-1]) + 1) > limit:
                chunks.append([])
                longest = 0
            chunks[-1].append(row)
            longest = max(longest, n)
        return chunks

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
                active[a:b] = self._active_positions(job.loss_fn, padded[j], mask[a:b])
        with torch.set_grad_enabled(needs_grad):
            target_lp = self._target_logprobs(tokens, mask, targets, groups, active)
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

    def _forward_packed(
        self,
        jobs: list[ForwardBackwardJob],
        rows: list[tuple[int, int]],
        per_row_lp: dict[tuple[int, int], np.ndarray],
        per_row_loss: dict[tuple[int, int], float],
    ) -> None:
        """All rows through packed micro-batches; datums share a row only within one adapter."""
        packed = prefix_sharing.plan_rows(
            [jobs[j].data[i].tokens for j, i in rows],
            [(id(_routed_adapter(jobs[j])), jobs[j].forward_only) for j, _ in rows],
            row_tokens=min(prefix_sharing.ROW_TOKENS, self.tokens_per_microbatch),
        )
        for part in self._packed_microbatches(packed):
            self._run_packed(jobs, rows, part, per_row_lp, per_row_loss)

    def _packed_microbatches(
        self, packed: list[prefix_sharing.PackedRow]
    ) -> list[list[prefix_sharing.PackedRow]]:
        """Packed rows in micro-batches of at most `tokens_per_microbatch` padded tokens."""
        parts: list[list[prefix_sharing.PackedRow]] = [[]]
        longest = 0
        for row in packed:
            n = len(row.tokens)
            if parts[-1] and max(longest, n) * (len(parts[-1]) + 1) > self.tokens_per_microbatch:
                parts.append([])
                longest = 0
            parts[-1].append(row)
            longest = max(longest, n)
        return parts

    def _packed_inputs(
        self, packed: list[prefix_sharing.PackedRow]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, packed_attention.PackedLayout]]:
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
        segments, positions = segments.to(self.device), positions.to(self.device)
        layouts = {
            layer_type: packed_attention.PackedLayout(
                segments,
                positions,
                self._sliding_window if layer_type == prefix_sharing.SLIDING else None,
            )
            for layer_type in self._layer_types
        }
        return tokens, positions, real, layouts

    def _run_packed(
        self,
        jobs: list[ForwardBackwardJob],
        rows: list[tuple[int, int]],
        packed: list[prefix_sharing.PackedRow],
        per_row_lp: dict[tuple[int, int], np.ndarray],
        per_row_loss: dict[tuple[int, int], float],
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
        pairs: dict[str, list[np.ndarray]] = {n: [] for n in ("pos", "tgt", "b", "t", "k", "on")}
        depth = 1
        for b, (k, m, d) in enumerate(members):
            j, i = rows[d]
            job, datum = jobs[j], jobs[j].data[i]
            targets = datum.inputs["target_tokens"]
            targets = targets[:, None] if targets.ndim == 1 else targets
            n, kk = targets.shape
            depth = max(depth, kk)
            where = compact[torch.from_numpy(k * width + packed[k].columns[m])].numpy()
            pairs["pos"].append(np.repeat(where, kk))
            pairs["tgt"].append(targets.reshape(-1).astype(np.int64))
            pairs["b"].append(np.full(n * kk, b))
            pairs["t"].append(np.repeat(np.arange(n), kk))
            pairs["k"].append(np.tile(np.arange(kk), n))
            if job.forward_only:
                pairs["on"].append(np.zeros(n * kk, dtype=bool))
            else:
                pairs["on"].append(_active_pairs(job.loss_fn, datum.inputs, n, kk))
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
            active = torch.zeros(n_pos, dtype=torch.bool)
            active[pos[flat["on"]]] = True
            if not (needs_grad and bool(active.any())):
                active[:] = False
            # Each position goes through the head once without gradients if no loss term reads
            # it, else once with them (checkpointed): never both, never once per datum.
            values = torch.zeros(len(pos), dtype=torch.float32, device=dev)
            for with_grad in (False, True):
                subset = active if with_grad else ~active
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
                    torch.utils.checkpoint.checkpoint(self._gather_head, *args, use_reentrant=False)
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
        """Log-softmax over the vocabulary for `hidden`, read at `(pos, targets)` pairs."""
        return self._vocab_logprobs(hidden, groups)[pos, targets]

    def optim_step(self, state: RunState, params: AdamParams) -> dict[str, float]:
        """One AdamW step on this run only; its gradient norm is clipped on its own gradients.

        A step is all or nothing: gradients that are not finite are refused before anything
        moves, and a step whose result is not finite anyway is undone, so weights and AdamW
        state stay as they were and the run can go on from its last good state. Both refusals
        are the client's error.
        """
        started = time.perf_counter()
        if state.nonfinite is not None:
            raise NonFiniteRun(state.nonfinite)
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
            group["betas"] = (params.beta1, params.beta2)
            group["eps"] = params.eps
            group["weight_decay"] = params.weight_decay
        state.optimizer.step()
        state.optimizer.zero_grad(set_to_none=True)
        if saved is not None and not _all_finite(tensors):
            _restore(state, saved)
            raise UserError(
                "optim_step refused: the step would make the weights non-finite "
                f"(learning_rate={params.learning_rate}, weight_decay={params.weight_decay}); "
                "it was undone and the weights and optimizer state are unchanged"
            )
        state.steps += 1
        self.stats.busy_seconds += time.perf_counter() - started
        return {"grad_norm:mean": norm, "learning_rate:mean": params.learning_rate}

    # -------------------------------------------------------------- sampling
    def validate_sample(self, job: SampleJob) -> None:
        """Refuse what cannot be sampled and normalise what means something else: a top-k of 0
        or past the vocabulary is no top-k, a temperature under `MIN_TEMPERATURE` is greedy."""
        if not job.prompt:
            raise UserError("the prompt is empty")
        self._check_vocab(np.asarray(job.prompt), "prompt")
        if not 1 <= job.num_samples <= MAX_NUM_SAMPLES:
            raise UserError(
                f"num_samples must be between 1 and {MAX_NUM_SAMPLES}, got {job.num_samples}"
            )
        p = job.params
        if p.max_tokens is not None and p.max_tokens < 0:
            raise UserError("max_tokens must not be negative")
        if p.temperature < 0 or not math.isfinite(p.temperature):
            raise UserError("temperature must be a finite number >= 0")
        if p.temperature < MIN_TEMPERATURE:
            p.temperature = 0.0
        if not 0 < p.top_p <= 1:
            raise UserError("top_p must be in (0, 1]")
        if p.top_k <= 0 or p.top_k >= self.vocab_size:
            p.top_k = -1
        if len(job.prompt) + self._max_new(job) > self.max_context:
            raise UserError(f"prompt plus max_tokens exceeds the context of {self.max_context}")
        top = job.topk_prompt_logprobs
        if not 0 <= top <= MAX_TOPK_PROMPT_LOGPROBS:
            raise UserError(
                f"topk_prompt_logprobs must be between 0 and {MAX_TOPK_PROMPT_LOGPROBS}, got {top}"
            )
        if top * len(job.prompt) > MAX_TOPK_PROMPT_VALUES:
            raise UserError(
                f"topk_prompt_logprobs={top} on a {len(job.prompt)}-token prompt asks for "
                f"{top * len(job.prompt)} values; the limit is {MAX_TOPK_PROMPT_VALUES}"
            )
        self._check_stop(p.stop)

    def _check_stop(self, stop: list[str] | list[int] | None) -> None:
        if stop is None:
            return
        if not isinstance(stop, list) or len(stop) > MAX_STOP_SEQUENCES:
            raise UserError(f"stop takes at most {MAX_STOP_SEQUENCES} strings or token ids")
        if all(isinstance(s, str) for s in stop):
            if any(len(s) > MAX_STOP_CHARS for s in stop):
                raise UserError(f"stop strings are at most {MAX_STOP_CHARS} characters")
            return
        if all(isinstance(s, int) and not isinstance(s, bool) for s in stop):
            self._check_vocab(np.asarray(stop, dtype=np.int64), "stop token")
            return
        raise UserError("stop takes strings or token ids, not a mix or other values")

    @staticmethod
    def _max_new(job: SampleJob) -> int:
        return DEFAULT_MAX_TOKENS if job.params.max_tokens is None else job.params.max_tokens

    @torch.inference_mode()
    def prompt_logprobs(
        self, adapter: AdapterWeights | None, prompt: list[int], topk: int = 0
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray] | None]:
        """Logprob of each prompt token given its prefix (NaN at position 0), untempered.

        The body runs once; the vocabulary-wide head runs `HEAD_CHUNK` positions at a time, so
        memory holds one chunk's logits whatever the prompt's length.
        """
        tokens = torch.tensor([prompt], device=self.device)
        groups = [RowGroup(adapter, 0, 1)]
        with routing(groups):
            hidden = self._body(input_ids=tokens, use_cache=False).last_hidden_state[:, :-1]
        picked, top_ids, top_lps = [], [], []
        for first in range(0, hidden.shape[1], HEAD_CHUNK):
            # `[1, chunk, H]`: the routing's rows are the batch's, not its positions.
            logp = self._vocab_logprobs(hidden[:, first : first + HEAD_CHUNK], groups)[0]
            targets = tokens[0, 1 + first : 1 + first + logp.shape[0], None]
            picked.append(torch.gather(logp, -1, targets)[:, 0])
            if topk > 0:
                lp, ids = torch.topk(logp, min(topk, logp.shape[-1]), dim=-1)
                top_lps.append(lp)
                top_ids.append(ids)
        values = np.concatenate([[np.nan], *(p.cpu().numpy() for p in picked)]).astype(np.float32)
        top = None
        if topk > 0:
            width = min(topk, self.vocab_size)
            pad_ids = np.zeros((1, width), dtype=np.int32)
            pad_lp = np.full((1, width), -99999.0, dtype=np.float32)
            top = (
                np.concatenate([pad_ids, *(i.cpu().numpy().astype(np.int32) for i in top_ids)]),
                np.concatenate([pad_lp, *(v.cpu().numpy().astype(np.float32) for v in top_lps)]),
            )
        return values, top

    @torch.inference_mode()
    def sample(self, jobs: list[SampleJob]) -> list[SampleResult]:
        """Decode every job's samples together in one batched loop with a KV cache."""
        started = time.perf_counter()
        results = [SampleResult(sequences=[]) for _ in jobs]
        together = [
            j
            for j, job in enumerate(jobs)
            if job.prompt_logprobs and not job.topk_prompt_logprobs and len(job.prompt) > 1
        ]
        if together and self.share_prefixes and self._can_pack:
            scored = self._shared_prompt_logprobs([jobs[j] for j in together])
            for j, values in zip(together, scored):
                results[j].prompt_logprobs = values
        else:
            together = []
        for j, (job, result) in enumerate(zip(jobs, results)):
            if j in together:
                continue
            if job.prompt_logprobs or job.topk_prompt_logprobs:
                values, top = self.prompt_logprobs(
                    job.adapter, job.prompt, job.topk_prompt_logprobs
                )
                result.prompt_logprobs = values if job.prompt_logprobs else None
                result.topk_prompt = top
        to_decode = [(j, job) for j, job in enumerate(jobs) if self._max_new(job) > 0]
        for j, job in enumerate(jobs):
            if self._max_new(job) == 0:
                results[j].sequences = [
                    SampledSequence([], [], False) for _ in range(job.num_samples)
                ]
        for batch in _decode_batches(to_decode, MAX_DECODE_ROWS):
            sequences = self._decode([job for _, job in batch])
            for (j, _), seqs in zip(batch, sequences):
                results[j].sequences.extend(seqs)
        self.stats.busy_seconds += time.perf_counter() - started
        self.stats.sample_batches += 1
        return results

    def _shared_prompt_logprobs(self, jobs: list[SampleJob]) -> list[np.ndarray]:
        """`prompt_logprobs` of many prompts in packed forwards: prompts of one adapter that
        share a prefix (a group's samples scored against a reference) compute it once."""
        scoring = [
            ForwardBackwardJob(
                # Scoring only: never stepped, so no optimizer.
                RunState(job.adapter, None),  # type: ignore[arg-type]
                [
                    Datum(
                        np.asarray(job.prompt[:-1], dtype=np.int64),
                        {
                            "target_tokens": np.asarray(job.prompt[1:], dtype=np.int64),
                            "weights": np.zeros(len(job.prompt) - 1, dtype=np.float32),
                        },
                    )
                ],
                "cross_entropy",
                {},
                True,
            )
            for job in jobs
        ]
        per_row_lp: dict[tuple[int, int], np.ndarray] = {}
        self._forward_packed(scoring, [(j, 0) for j in range(len(jobs))], per_row_lp, {})
        return [
            np.concatenate([[np.nan], per_row_lp[(j, 0)]]).astype(np.float32)
            for j in range(len(jobs))
        ]

    def _decode(self, jobs: list[SampleJob]) -> list[list[SampledSequence]]:
        """Decode every job's rows together; finished rows leave the batch as they pile up.

        Each row draws from its own random stream (seeded from its job's seed and its index in
        the job), so the randomness a row uses does not depend on which other requests shared
        its batch or on when finished rows were dropped. Its logits can, in the last bits: the
        batch width sets the padding and the row count changes how the base model's kernels
        sum. So a row sampled with batch-mates matches the same row sampled alone except where
        such a difference flips a draw that sits on a near-tie.
        """
        owners = [j for j, job in enumerate(jobs) for _ in range(job.num_samples)]
        rows = len(owners)
        width = max(len(job.prompt) for job in jobs)
        pad_id = int(self.tokenizer.pad_token_id or 0)
        tokens = torch.full((len(jobs), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(jobs), width), dtype=torch.long)
        for j, job in enumerate(jobs):  # left padding keeps every row's last token aligned
            tokens[j, width - len(job.prompt) :] = torch.tensor(job.prompt)
            mask[j, width - len(job.prompt) :] = 1
        tokens, mask = tokens.to(self.device), mask.to(self.device)
        params = self._row_params(jobs)
        stops = [self._stop_rule(job) for job in jobs for _ in range(job.num_samples)]
        on_host = not self.device_sampling
        if on_host:
            generators = host_decoding.row_generators(
                [job.params.seed for job in jobs],
                [job.num_samples for job in jobs],
                [job.first_sample for job in jobs],
            )
        max_new = [self._max_new(job) for job in jobs]
        out_tokens: list[list[int]] = [[] for _ in range(rows)]
        out_lps: list[list[float]] = [[] for _ in range(rows)]
        stopped = [False] * rows
        done = [False] * rows
        live = list(range(rows))  # batch row k decodes original row live[k]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        # One prefill per request, not per sample: a request's rows share its prompt and
        # adapter, so their caches start equal and are copied out after the prefill.
        with routing([RowGroup(job.adapter, j, j + 1) for j, job in enumerate(jobs)]):
            out = self.model(
                input_ids=tokens,
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                logits_to_keep=1,
            )
        cache = _cache_of(out)
        expand = torch.tensor(owners, device=self.device)
        if rows != len(jobs):
            cache.batch_select_indices(expand)
        mask, positions = mask[expand], positions[expand]
        logits = out.logits[:, -1][expand]
        step = 0
        while True:
            if on_host:
                blocks = [
                    (p.temperature, p.top_k, p.top_p, first, stop)
                    for j, first, stop in _job_blocks(owners, live)
                    for p in (jobs[j].params,)
                ]
                picks, picked_lp = host_decoding.choose(blocks, live, logits, generators, done)
                picks = picks.to(self.device)
            else:
                picks, picked_lp = decoding.choose(logits, params, step)
            # The step's one host synchronisation: chosen ids (exact in float32) and logprobs.
            chosen = torch.stack([picks.to(torch.float32), picked_lp.to(picks.device)])
            chosen = chosen.cpu().tolist()
            step += 1
            for k, r in enumerate(live):
                if done[r]:
                    continue
                out_tokens[r].append(int(chosen[0][k]))
                out_lps[r].append(chosen[1][k])
                if stops[r](out_tokens[r]):
                    done[r] = stopped[r] = True
                elif len(out_tokens[r]) >= max_new[owners[r]]:
                    done[r] = True
            finished = sum(done[r] for r in live)
            if finished == len(live):
                break
            if finished * 4 >= len(live):
                # Drop finished rows once they are a quarter of the batch: each copy of the
                # cache is paid back by every later step computing fewer rows.
                keep = [k for k, r in enumerate(live) if not done[r]]
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                mask, positions, picks = mask[index], positions[index], picks[index]
                params = params.select(index)
                live = [live[k] for k in keep]
            mask = torch.cat(
                [mask, torch.ones((len(live), 1), dtype=mask.dtype, device=self.device)], 1
            )
            positions = positions[:, -1:] + 1
            with routing(_row_groups(jobs, owners, live)):
                out = self.model(
                    input_ids=picks[:, None],
                    attention_mask=mask,
                    position_ids=positions,
                    use_cache=True,
                    **{self._cache_kw: cache},
                )
            cache = _cache_of(out)
            logits = out.logits[:, -1]
        self.stats.sample_tokens += sum(len(t) for t in out_tokens)
        results: list[list[SampledSequence]] = [[] for _ in jobs]
        for r in range(rows):
            results[owners[r]].append(SampledSequence(out_tokens[r], out_lps[r], stopped[r]))
        return results

    def _row_params(self, jobs: list[SampleJob]) -> decoding.RowParams:
        """Every row's sampling parameters and random key, on the device.

        A row's key comes from its job's seed (or a fresh one) and its index in the job, so
        what a row samples does not depend on which other requests share its batch or on when
        finished rows were dropped.
        """
        temperatures, top_ks, top_ps, keys = [], [], [], []
        for job in jobs:
            p = job.params
            seed = p.seed
            base = int(torch.randint(0, 2**62, ())) if seed is None else int(seed)
            for k in range(job.first_sample, job.first_sample + job.num_samples):
                temperatures.append(float(p.temperature))
                top_ks.append(int(p.top_k) if p.top_k and p.top_k > 0 else 0)
                top_ps.append(float(p.top_p))
                keys.append(decoding.row_key(base, k))
        return decoding.row_params(temperatures, top_ks, top_ps, keys, self.device)

    def _stop_rule(self, job: SampleJob) -> Callable[[list[int]], bool]:
        """A fresh per-row predicate on the generated tokens, called once per new token."""
        stop = job.params.stop
        if stop is None:
            eos = self.eos_ids
            return lambda toks: toks[-1] in eos
        if not stop:
            return lambda toks: False
        if isinstance(stop[0], int):
            ids = set(stop)
            return lambda toks: toks[-1] in ids
        strings = [s for s in stop if s]
        if not strings:
            return lambda toks: False
        if not self.device_sampling:
            return host_decoding.text_stop_rule(strings, self.tokenizer.decode)
        return decoding.StopStrings(strings, self._pieces, self.tokenizer.decode).hit


def _decode_batches(
    jobs: list[tuple[int, SampleJob]], max_rows: int
) -> list[list[tuple[int, SampleJob]]]:
    """Jobs in decode batches of at most `max_rows` rows; a wider job is cut into parts that
    keep its seed (a fresh one drawn here when it had none) and their samples' indices."""
    batches: list[list[tuple[int, SampleJob]]] = [[]]
    rows = 0
    for j, job in jobs:
        if job.num_samples > max_rows and job.params.seed is None:
            job.params.seed = int(torch.randint(0, 2**62, ()))
        for first in range(0, job.num_samples, max_rows):
            count = min(max_rows, job.num_samples - first)
            part = job if count == job.num_samples else dataclasses.replace(
                job, num_samples=count, first_sample=job.first_sample + first
            )
            if batches[-1] and rows + count > max_rows:
                batches.append([])
                rows = 0
            batches[-1].append((j, part))
            rows += count
    return [batch for batch in batches if batch]


def _routed_adapter(job: ForwardBackwardJob) -> AdapterWeights:
    """The adapter a job's rows go through: forward-only jobs through a detached view, so
    being fused with a training job never gives their run a gradient."""
    adapter = job.state.adapter
    return adapter.detached() if job.forward_only and adapter is not None else adapter


def _active_pairs(loss_fn: str, inputs: dict[str, np.ndarray], n: int, depth: int) -> np.ndarray:
    """Which of a datum's `n * depth` (position, target) pairs can have a non-zero loss term."""
    if loss_fn == "cross_entropy":
        weights = inputs["weights"]
        if weights.ndim == 1:
            return np.repeat(weights != 0, depth)
        return (weights != 0).reshape(-1)
    if loss_fn in ("importance_sampling", "ppo", "cispo"):
        return np.repeat(inputs["advantages"] != 0, depth)
    return np.ones(n * depth, dtype=bool)  # e.g. dro: its quadratic term is not masked


def _job_blocks(owners: list[int], live: list[int]) -> list[tuple[int, int, int]]:
    """`(job, first, stop)`: the contiguous batch rows each job still has in the batch."""
    blocks: list[tuple[int, int, int]] = []
    for k, r in enumerate(live):
        if blocks and blocks[-1][0] == owners[r]:
            blocks[-1] = (owners[r], blocks[-1][1], k + 1)
        else:
            blocks.append((owners[r], k, k + 1))
    return blocks


def _row_groups(jobs: list[SampleJob], owners: list[int], live: list[int]) -> list[RowGroup]:
    """LoRA routing for the rows still in the batch."""
    return [RowGroup(jobs[j].adapter, first, stop) for j, first, stop in _job_blocks(owners, live)]


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
