"""The engine: all tensor work on the one resident base model.

It knows nothing of HTTP, sessions or ordering. It is given *jobs* (`jobs`: forward_backward for
some training runs, optimizer steps, sampling requests) and runs them as padded batches, several
runs fused into one batch where asked, each row through its own LoRA adapter. Training lives in
`training` and `packed_training`, sampling in `sampling`, scoring through the output head in
`scoring`; this module holds the shared model state and the runs. Validation of user data
happens in the engine too, because only the engine knows the vocabulary and the model.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading

import numpy as np
import torch

from server.engine import decoding, kv_budget, microbatch_budget, packed_attention, prefix_sharing
from server.engine.devices import layout_for
from server.engine.dimuon import OPTIMIZER_TYPES, Dimuon, optimizer_type
from server.engine.engine_thread import EngineThread
from server.engine.jobs import (
    AdamParams,
    DimuonParams,
    EngineStats,
    ForwardBackwardJob,
    ForwardBackwardResult,
    NonFiniteRun,
    RunState,
    SampleJob,
    SamplingParams,
    UserError,
)
from server.engine.kv_budget import MAX_DECODE_ROWS
from server.engine.lora import AdapterWeights, LoraSpec, new_adapter, wrap_model
from server.engine.model_loading import LoadedModel
from server.engine.packed_training import PackedTraining
from server.engine.sampling import DEFAULT_MAX_TOKENS, Sampling
from server.engine.scoring import HeadScoring
from server.engine.training import (
    DEFAULT_TOKENS_PER_MICROBATCH,
    TOKENS_PER_MICROBATCH,
    Training,
    _all_finite,
)
from server.protocol.codec import Datum

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "MAX_DECODE_ROWS",
    "AdamParams",
    "DimuonParams",
    "Engine",
    "EngineStats",
    "ForwardBackwardJob",
    "ForwardBackwardResult",
    "NonFiniteRun",
    "RunState",
    "SampleJob",
    "SamplingParams",
    "UserError",
]

SHARE_PREFIXES_ENV = "AUTORESEARCH_SHARE_PREFIXES"
DEVICE_SAMPLING_ENV = "AUTORESEARCH_DEVICE_SAMPLING"
BATCH_INVARIANT_ENV = "AUTORESEARCH_BATCH_INVARIANT"
MICROBATCH_ENV = "AUTORESEARCH_TOKENS_PER_MICROBATCH"
log = logging.getLogger(__name__)


class Engine(Training, PackedTraining, Sampling, HeadScoring):
    """Owns the base model and runs batched training and sampling on it."""

    def __init__(
        self,
        loaded: LoadedModel,
        max_context: int | None = None,
        share_prefixes: bool | None = None,
        device_sampling: bool | None = None,
        batch_invariant: bool | None = None,
    ):
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.model_name = loaded.model_name
        self.device = loaded.device
        self.dtype = loaded.dtype
        self.dtype_reason = loaded.dtype_reason
        self.layout = loaded.layout or layout_for(torch.device(self.device))
        """Whose numerics the engine runs (another device's when emulated, see `devices`)."""
        self.deterministic = loaded.deterministic
        half = self.dtype in (torch.bfloat16, torch.float16)
        self.activation_dtype = self.dtype if half and self.layout.wholly_half else torch.float32
        """The dtype of hidden states, attention and the KV cache."""
        self.model_origin = loaded.origin or loaded.model_name
        self.thread: EngineThread | None = None
        """The thread that loaded the model and will run the loop driving this engine, where
        `engine_thread.on_own_thread` built it (None: whichever thread calls it)."""
        self.naming = loaded.naming
        self.layers = wrap_model(self.model, self.naming.outside)
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
        override = int(os.environ.get(MICROBATCH_ENV, 0))
        self.tokens_per_microbatch = override or (
            TOKENS_PER_MICROBATCH.get(torch.device(self.device).type,
                                      DEFAULT_TOKENS_PER_MICROBATCH))
        """Padded tokens per training micro-batch: what sets the activations kept for backward
        (`AUTORESEARCH_TOKENS_PER_MICROBATCH` overrides the device's default; on an
        accelerator, sized from free memory at the first training request:
        `size_microbatches`)."""
        self.microbatch_sizing = "override" if override else "fixed"
        """How `tokens_per_microbatch` was chosen: `override`, `fixed` (the device's default),
        or `free memory` once `size_microbatches` has run."""
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
        self.head_where_read = True
        """`forward_backward` runs the output head only at positions its loss reads
        (`loss_positions`) and returns 0.0 elsewhere; off: every position is scored, as before
        (kept as the reference a benchmark and the tests compare with)."""
        self.fused_head_pass = True
        """The output head scores one vocabulary block at a time (`fused_head`); off: each
        chunk's full `[positions, vocabulary]` fp32 logits, log-softmax and gather, checkpointed
        (the earlier computation, kept as the reference a benchmark and the tests compare with;
        its bits differ from the sampler's)."""
        self.fuse_invariant_runs = torch.device(self.device).type != "cpu"
        """Under invariance several runs' training micro-batches share one body pass, each with
        the bits it has alone (`PackedTraining._forward_invariant`); off: each micro-batch runs
        its own pass (bit for bit the same). Off on the CPU, where the body's products are
        compute-bound from a few hundred tokens on and sharing a pass measured 0.94x
        (`bench/bench_fused_runs.py`); on elsewhere, where a small run's micro-batch leaves an
        accelerator idle (not yet measured on one: the device check times it)."""
        self.shared_prefill = True
        """Under invariance, prompts that begin alike compute their shared prefix once and the
        rest run in groups of similar length (`Sampling._prefill_aligned`); off: every prompt
        whole, all in one forward padded to the longest (bit for bit the same; the reference
        `bench/bench_eval_prefill.py` compares with)."""
        self.first_token_from_scoring = True
        """A one-token request that also asks for its prompt's logprobs (`compute_logprobs`)
        draws its token from the scoring forward under invariance; off: a second prefill, as
        before (kept as the reference a benchmark compares with)."""
        self._layer_types = set(getattr(config, "layer_types", None) or [])
        sliding_window = getattr(config, "sliding_window", None)
        self._windows = {
            layer_type: sliding_window if layer_type == prefix_sharing.SLIDING else None
            for layer_type in self._layer_types
        }
        """Each attention layer type's window in positions (None: full attention)."""
        # Packed rows need per-layer-type layouts, which Gemma 3's SDPA or eager attention takes
        # through `packed_attention`.
        self._can_pack = (
            bool(self._layer_types)
            and self._layer_types <= {"sliding_attention", "full_attention"}
            and packed_attention.install(self.model)
        )
        if batch_invariant is None:
            # On by default only where a mechanism makes it hold (`devices`).
            default = "1" if self.layout.invariance_mechanism else "0"
            batch_invariant = os.environ.get(BATCH_INVARIANT_ENV, default) != "0"
        self.batch_invariant = batch_invariant and self._can_pack
        """The invariant path runs (see `invariance` and `invariant_attention`): each training
        job keeps its own micro-batches (their body passes shared with other runs' where
        `fuse_invariant_runs` is on), prefill and decoding stay fused on position-aligned
        attention. Needs the packed attention hook
        (Gemma 3's layer types); other models run fused."""

    def size_microbatches(self) -> None:
        """On CUDA and MPS (their layouts, emulated too), before the first training pass: size
        micro-batches from what a token's activations cost here and the memory free now
        (`microbatch_budget`). Kept fixed where bits must repeat across starts (deterministic
        or invariant) or a size was given."""
        if (self.microbatch_sizing != "fixed" or self.layout.kind == "cpu"
                or self.deterministic or self.batch_invariant):
            return
        self.microbatch_sizing = "free memory"  # first: the probe passes below train too
        per_token = microbatch_budget.saved_bytes_per_token(self._probe_saved_bytes)
        free = kv_budget.free_bytes(torch.device(self.device))
        self.tokens_per_microbatch = microbatch_budget.microbatch_tokens(per_token, free)
        log.info("training micro-batches of %d tokens: %.0f KiB saved per token, %.1f GiB free",
                 self.tokens_per_microbatch, per_token / 1024, free / 2**30)

    def _probe_saved_bytes(self, tokens: int) -> int:
        """Bytes a training pass of `tokens` tokens saves for backward, on a throwaway adapter
        of rank 32 on every module a run may train (each storage counted once)."""
        state = self.create_run(LoraSpec(rank=32, train_unembed=False), seed=0)
        ids = np.arange(tokens + 1, dtype=np.int64) % max(2, self.vocab_size - 1) + 1
        datum = Datum(ids[:-1], {"target_tokens": ids[1:],
                                 "weights": np.ones(tokens, np.float32)})
        storages: dict[int, int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            self.forward_backward([ForwardBackwardJob(state, [datum], "cross_entropy", {},
                                                      False)])
        return sum(storages.values())

    @property
    def invariance_guaranteed(self) -> bool:
        """A run's numbers do not depend on what shares its batches, and the sampler's logprobs
        are the trainer's bit for bit: the invariant path runs on a device where a mechanism
        makes it hold (the CPU's; on CUDA and MPS none does here, see `devices`)."""
        return self.batch_invariant and self.layout.invariance_mechanism is not None

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
    def create_run(self, spec: LoraSpec, seed: int, optimizer: str = "adamw") -> RunState:
        if not 1 <= spec.rank <= 512:
            raise UserError(f"LoRA rank must be between 1 and 512, got {spec.rank}")
        if not (spec.train_attn or spec.train_mlp or spec.train_unembed):
            raise UserError("at least one of train_attn, train_mlp, train_unembed must be true")
        adapter = new_adapter(self.layers, spec, seed, self.device)
        return RunState(adapter, self._optimizer(adapter, optimizer))

    def _optimizer(self, adapter: AdapterWeights, kind: str = "adamw") -> torch.optim.Optimizer:
        if kind == "dimuon":
            return Dimuon(adapter.parameters(), rank=adapter.spec.rank)
        if kind != "adamw":
            raise UserError(f"optimizer type must be one of {OPTIMIZER_TYPES}, got {kind!r}")
        return torch.optim.AdamW(
            adapter.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0,
            fused=self.fused_optimizer or None,
        )

    @property
    def fused_optimizer(self) -> bool:
        """AdamW as one fused kernel over every tensor of a run (CUDA's layout, emulated or
        not): a few launches per step instead of several per LoRA matrix. The CPU's own layout
        keeps the per-tensor update its bitwise references were measured with."""
        return self.layout.kind == "cuda"

    def restore_run(self, adapter: AdapterWeights, optimizer_state: dict | None,
                    optimizer: str = "adamw") -> RunState:
        """A run from saved weights; its optimizer is the saved state's where there is one,
        else a fresh `optimizer`."""
        for tensor in adapter.parameters():
            tensor.requires_grad_(True)
        kind = optimizer_type(optimizer_state) or optimizer
        state = RunState(adapter, self._optimizer(adapter, kind))
        if optimizer_state is not None:
            state.optimizer.load_state_dict(optimizer_state)
        if not _all_finite(adapter.parameters()):
            state.nonfinite = (
                "the run's weights are not finite (they were loaded so); its forward passes "
                "give NaN for it alone and optim_step is refused until a finite checkpoint is "
                "loaded with load_state"
            )
        return state

    def _check_vocab(self, tokens: np.ndarray, what: str) -> None:
        if tokens.size and (tokens.min() < 0 or tokens.max() >= self.vocab_size):
            bad = int(tokens.max()) if tokens.max() >= self.vocab_size else int(tokens.min())
            raise UserError(
                f"{what}: token id {bad} is outside the vocabulary [0, {self.vocab_size})"
            )

