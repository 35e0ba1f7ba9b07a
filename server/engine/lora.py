"""Multi-LoRA layers: one resident base model, any number of adapters, chosen per batch row.

Every targeted `nn.Linear` of the base model is wrapped once in a `MultiLoRALinear`. A forward
pass is told, through `routing(...)`, which rows of the batch belong to which adapter; each row
gets `base(x) + scale * B(A(x))` with its own adapter, so rows from different training runs (or
sampler snapshots) can share one batch and gradients land only in the adapter that produced
them. With no routing in effect the layer is exactly the base layer.

Adapters are plain tensors (`AdapterWeights`); the layers own none of them, so a training run, a
frozen sampler snapshot and a checkpoint are all the same kind of value.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from server.engine import fused_head, invariance

ATTN_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
UNEMBED_MODULES = ("lm_head",)
LORA_ALPHA = 32.0
"""Fixed alpha, so the effective scale is alpha / rank (the convention of the hosted service)."""


@dataclass(frozen=True)
class LoraSpec:
    """What an adapter covers: its rank and which module families it trains."""

    rank: int
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True
    alpha: float = LORA_ALPHA

    @property
    def scale(self) -> float:
        return self.alpha / self.rank

    def module_suffixes(self) -> tuple[str, ...]:
        suffixes: tuple[str, ...] = ()
        if self.train_attn:
            suffixes += ATTN_MODULES
        if self.train_mlp:
            suffixes += MLP_MODULES
        if self.train_unembed:
            suffixes += UNEMBED_MODULES
        return suffixes


@dataclass
class AdapterWeights:
    """LoRA matrices of one adapter, keyed by the base model's module name."""

    spec: LoraSpec
    a: dict[str, torch.Tensor] = field(default_factory=dict)
    b: dict[str, torch.Tensor] = field(default_factory=dict)
    _detached: AdapterWeights | None = field(default=None, repr=False, compare=False)

    def parameters(self) -> list[torch.Tensor]:
        return [t for name in sorted(self.a) for t in (self.a[name], self.b[name])]

    def detached(self) -> AdapterWeights:
        """The same weights (shared storage, so later steps show through) outside autograd:
        a forward-only pass routed through it can never leave a gradient, not even zeros."""
        if self._detached is None:
            self._detached = AdapterWeights(
                self.spec,
                {k: v.detach() for k, v in self.a.items()},
                {k: v.detach() for k, v in self.b.items()},
            )
        return self._detached

    def frozen_copy(self) -> AdapterWeights:
        """An immutable snapshot: detached clones that later training cannot touch."""
        return AdapterWeights(
            self.spec,
            {k: v.detach().clone() for k, v in self.a.items()},
            {k: v.detach().clone() for k, v in self.b.items()},
        )

    def to(self, device: torch.device | str) -> AdapterWeights:
        return AdapterWeights(
            self.spec,
            {k: v.detach().to(device) for k, v in self.a.items()},
            {k: v.detach().to(device) for k, v in self.b.items()},
        )

    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.parameters())


@dataclass(frozen=True)
class RowGroup:
    """Rows `start:stop` of the batch use `adapter` (None means the plain base model)."""

    adapter: AdapterWeights | None
    start: int
    stop: int


class Routing:
    """The row groups of one batch, merged where one adapter's rows are adjacent.

    Isolation is by construction: each group's rows are sliced out and multiplied by that
    group's adapter alone. No row is ever multiplied by another run's weights, not even by
    weights masked to zero (NaN x 0 is NaN, so a masked product would let one run's diverged
    adapter reach every run it shares a batch with).
    """

    def __init__(self, groups: list[RowGroup]):
        # Adjacent groups of one adapter act as one (e.g. several requests on one snapshot), so
        # a batch on a single adapter takes the layers' one-adapter path.
        merged: list[RowGroup] = []
        for group in sorted(groups, key=lambda g: g.start):
            last = merged[-1] if merged else None
            if last is not None and last.adapter is group.adapter and last.stop == group.start:
                merged[-1] = RowGroup(group.adapter, last.start, group.stop)
            else:
                merged.append(group)
        self.groups = tuple(merged)
        self.routed = tuple(g for g in self.groups if g.adapter is not None)


_ROUTING: contextvars.ContextVar[Routing | None] = contextvars.ContextVar(
    "lora_routing", default=None
)


@contextlib.contextmanager
def routing(groups: list[RowGroup]) -> Iterator[None]:
    """Route batch rows to adapters for the forward passes inside this block."""
    token = _ROUTING.set(Routing(groups) if groups else None)
    try:
        yield
    finally:
        _ROUTING.reset(token)


class MultiLoRALinear(nn.Module):
    """An `nn.Linear` plus per-row LoRA deltas chosen by the current routing."""

    def __init__(self, base: nn.Linear, name: str):
        super().__init__()
        self.base = base
        self.name = name
        self.is_head = name.rsplit(".", 1)[-1] in UNEMBED_MODULES
        """The output head: its logits come back in float32, one vocabulary block at a time
        (`fused_head`), so an fp32 adapter's delta reaches them unrounded."""

    @property
    def weight(self) -> torch.Tensor:  # keeps tied-weight and dtype lookups working
        return self.base.weight

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 2:
            return self._forward_2d(x, 1)
        # As one `[tokens, features]` matrix: a strided 3-D input (the last position of each
        # row, as a prefill's output head gets) would make `matmul` broadcast the weight into a
        # copy per row (2.7 GB for the head of 8 rows), and each token's product comes from the
        # same 2-D kernel whatever the batch's shape.
        shape = x.shape
        flat = self._forward_2d(x.reshape(-1, shape[-1]), math.prod(shape[1:-1]))
        return flat.view(*shape[:-1], flat.shape[-1])

    def _forward_2d(self, x: torch.Tensor, per_row: int) -> torch.Tensor:
        """`x` is `[rows * per_row, features]`: the routing's batch rows, `per_row` tokens each.

        A half-precision base layer under fp32 activations (`model_loading.low_precision_
        matmuls`) multiplies `x` cast down and gives its output back in `x`'s dtype."""
        routed = self._routed_rows(per_row)
        if self.is_head:
            # The blocks, and so the bits, that training's fused head computes for these rows.
            deltas = fused_head.head_deltas(routed, self.name)
            lows = fused_head.low_rank(x, deltas)
            return fused_head.head_logits(x, self.base.weight, deltas, lows)
        weight, bias = self.base.weight, self.base.bias
        if x.dtype == weight.dtype:
            out = invariance.linear(x, weight, bias)
        else:
            out = invariance.linear(x.to(weight.dtype), weight, bias).to(x.dtype)
        if not routed:
            return out
        if len(routed) == 1 and routed[0].start == 0 and routed[0].stop == x.shape[0]:
            return (out + self._delta(x, routed[0].adapter)).to(out.dtype)
        return self._grouped(x, out, routed).to(out.dtype)

    def _routed_rows(self, per_row: int) -> list[RowGroup]:
        """The current routing's groups whose adapter covers this layer, in rows of `x`."""
        plan = _ROUTING.get()
        if plan is None:
            return []
        return [RowGroup(g.adapter, g.start * per_row, g.stop * per_row)
                for g in plan.routed if self.name in g.adapter.a]

    def _grouped(self, x: torch.Tensor, out: torch.Tensor, routed: list[RowGroup]) -> torch.Tensor:
        """Each group's delta from its own rows and its own adapter only (a segmented product);
        rows of no adapter get nothing added. With and without gradients a row's value is the
        same `out + delta` summed in float32, so scoring and training agree to the bit."""
        batch = x.shape[0]
        if not torch.is_grad_enabled():
            for group in routed:
                rows = x[group.start : group.stop]
                out[group.start : group.stop] += self._delta(rows, group.adapter)
            return out
        # One out-of-place add of the deltas stacked along the batch: in-place adds on row
        # slices would make autograd copy the whole output gradient once per group. The rows
        # are taken with one `split`, whose backward joins the groups' gradients in one tensor
        # (a slice per group would build a zero-filled input gradient per group).
        ordered = sorted(routed, key=lambda g: g.start)
        bounds = sorted({0, batch, *(g.start for g in ordered), *(g.stop for g in ordered)})
        rows = dict(zip(bounds, x.split([b - a for a, b in zip(bounds, bounds[1:])])))
        pieces, cursor = [], 0
        for group in ordered:
            delta = self._delta(rows[group.start], group.adapter)
            if group.start > cursor:
                pieces.append(delta.new_zeros((group.start - cursor, *out.shape[1:])))
            pieces.append(delta)
            cursor = group.stop
        if cursor < batch:
            pieces.append(pieces[-1].new_zeros((batch - cursor, *out.shape[1:])))
        return out + torch.cat(pieces)

    def _delta(self, x: torch.Tensor, adapter: AdapterWeights) -> torch.Tensor:
        """`scale * B(A(x))` for these rows in the adapter's dtype (float32), scaling the rank-r
        intermediate rather than the (possibly vocabulary-wide) output."""
        a, b = adapter.a[self.name], adapter.b[self.name]
        if invariance.rows_are_invariant():
            low = invariance.tiled_matmul(x.to(a.dtype), a.T) * adapter.spec.scale
            return invariance.tiled_matmul(low, b.T)
        return ((x.to(a.dtype) @ a.T) * adapter.spec.scale) @ b.T


def wrap_model(model: nn.Module,
               rename: Callable[[str], str] | None = None) -> dict[str, MultiLoRALinear]:
    """Wrap every LoRA-capable linear layer of `model` in place; returns them by name.

    `rename` gives each layer the name adapters know it by (the checkpoint architecture's,
    where the model is a multimodal checkpoint's language model loaded alone)."""
    wanted = ATTN_MODULES + MLP_MODULES + UNEMBED_MODULES
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in wanted
    ]
    wrapped: dict[str, MultiLoRALinear] = {}
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        outside = rename(name) if rename else name
        layer = MultiLoRALinear(module, outside)
        setattr(parent, child, layer)
        wrapped[outside] = layer
    return wrapped


def new_adapter(
    layers: dict[str, MultiLoRALinear],
    spec: LoraSpec,
    seed: int,
    device: torch.device,
    dtype: torch.dtype = torch.float32,
) -> AdapterWeights:
    """A fresh adapter: A Kaiming-uniform from `seed` (as PEFT does), B zero: starts as a no-op."""
    generator = torch.Generator().manual_seed(seed)
    suffixes = spec.module_suffixes()
    adapter = AdapterWeights(spec)
    for name in sorted(layers):
        if name.rsplit(".", 1)[-1] not in suffixes:
            continue
        layer = layers[name]
        a = torch.empty(spec.rank, layer.in_features, dtype=torch.float32)
        bound = 1.0 / math.sqrt(layer.in_features)  # kaiming_uniform_ with a=sqrt(5)
        a.uniform_(-bound, bound, generator=generator)
        b = torch.zeros(layer.out_features, spec.rank, dtype=torch.float32)
        adapter.a[name] = a.to(device=device, dtype=dtype).requires_grad_(True)
        adapter.b[name] = b.to(device=device, dtype=dtype).requires_grad_(True)
    return adapter
