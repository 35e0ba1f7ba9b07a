"""What each device runs, so that the CPU can run another device's layout (`--emulate-device`).

A layout is the part of the engine's numerics that a device decides: whether the model lives
wholly in bf16 (CUDA and MPS: weights, activations, attention and KV cache) or only its matmul
weights (a CPU with bf16 instructions keeps fp32 activations), and whether a mechanism makes a
row's bits independent of its batch. On the CPU one exists: the probes of `invariance` and the
fixed-order `invariant_attention`. On CUDA and MPS none does here: cuBLAS and Metal choose
kernels (split-K included) by shape, and no batch-invariant kernel library is installed, so the
engine runs their fast path with invariance off and reports `batch_invariant` and
`sampler_trainer_bitwise` false. Invariance can still be forced on there
(`AUTORESEARCH_BATCH_INVARIANT=1`); the flags stay false, because nothing guarantees it.

Emulation runs such a layout on the CPU: the dtypes, the cache, the attention and invariance
paths and the flags are the device's; the kernels and their summation order are the CPU's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

EMULATED_DEVICES = ("cuda", "mps")


@dataclass(frozen=True)
class DeviceLayout:
    """The numerics a device runs, and where the tensors really live."""

    kind: str
    """The device whose layout this is: cpu, cuda or mps."""
    tensors: torch.device
    """Where the tensors live: `kind`'s device, or the CPU when emulating."""
    wholly_half: bool
    """A half-precision model is wholly in that dtype (activations and KV cache too)."""
    invariance_mechanism: str | None
    """What makes a row's bits independent of its batch on this device; None: nothing."""

    @property
    def emulated(self) -> bool:
        return self.tensors.type != self.kind

    @property
    def name(self) -> str:
        return f"{self.kind} (emulated on cpu)" if self.emulated else str(self.tensors)


def layout_for(device: torch.device, emulate: str | None = None) -> DeviceLayout:
    """The layout of `device`, or of the emulated device `emulate` on the CPU."""
    if emulate:
        if emulate not in EMULATED_DEVICES:
            raise ValueError(
                f"--emulate-device takes one of {', '.join(EMULATED_DEVICES)}, got {emulate!r}"
            )
        if device.type != "cpu":
            raise ValueError(f"--emulate-device runs on the cpu, not on {device}")
        return DeviceLayout(emulate, device, True, None)
    if device.type == "cpu":
        return DeviceLayout(
            "cpu", device, False,
            "probed CPU GEMM row tiles and fixed-order block attention (server.engine.invariance)",
        )
    return DeviceLayout(device.type, device, True, None)


DETERMINISTIC_ENV = "AUTORESEARCH_DETERMINISTIC"


def deterministic_kernels(layout: DeviceLayout) -> bool:
    """With `AUTORESEARCH_DETERMINISTIC=1`, ask CUDA for deterministic kernels (a fixed cuBLAS
    workspace, no atomic adds in the backward of `index_select` and friends), so the same seeds
    give the same bits run after run on one GPU and one batch composition. This is
    reproducibility, not batch invariance, and it is opt-in: on an H200 it cost 19-28% of
    decoding throughput (`bench/device_check.py`). Fresh allocations are not NaN-filled (torch
    does so by default under deterministic algorithms): every tensor the engine reads is
    written first. True when in force; `get_info`'s `deterministic` says so."""
    if layout.emulated or layout.kind != "cuda" or os.environ.get(DETERMINISTIC_ENV) != "1":
        return False
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.utils.deterministic.fill_uninitialized_memory = False
    torch.backends.cudnn.benchmark = False
    return True
