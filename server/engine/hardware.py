"""Which compute dtype the resident base model gets on this device, and why.

A CPU with bf16 matmul instructions (x86 `avx512_bf16` or AMX, Arm `FEAT_BF16` as on Apple
M2 and later) multiplies bf16 two to four times faster than fp32, and a small model's training
and sampling are bound by those matmuls; a CPU without them emulates bf16 and is slower in it
than in fp32. Accelerators (CUDA, MPS) always take bf16. LoRA weights, their gradients and the
AdamW moments stay fp32 whatever is chosen here (see `lora.new_adapter`).
"""

from __future__ import annotations

import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path

import torch

X86_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@dataclass(frozen=True)
class DtypeChoice:
    """The dtype the base model is served in and the reason, for `get_info` and the logs."""

    dtype: torch.dtype
    reason: str

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")


def cpu_bf16_features(cpuinfo: str | None = None, machine: str | None = None) -> list[str]:
    """The bf16 matmul features this CPU advertises (empty when it has none).

    `cpuinfo` (the text of `/proc/cpuinfo`) and `machine` are parameters so the rule can be
    tested on the strings of other machines.
    """
    machine = machine or platform.machine()
    if cpuinfo is None:
        path = Path("/proc/cpuinfo")
        cpuinfo = path.read_text(errors="replace") if path.exists() else ""
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    found = [flag for flag in X86_BF16_FLAGS if flag in flags]
    if "bf16" in flags:  # Linux on Arm lists FEAT_BF16 as `bf16`
        found.append("bf16")
    if not found and machine == "arm64" and platform.system() == "Darwin":
        found += _darwin_bf16()
    return found


def _darwin_bf16() -> list[str]:
    try:
        out = subprocess.run(
            ["sysctl", "-n", "hw.optional.arm.FEAT_BF16"],
            capture_output=True, text=True, timeout=5, check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return []
    return ["FEAT_BF16"] if out == "1" else []


def choose_dtype(device: torch.device, features: list[str] | None = None) -> DtypeChoice:
    """bf16 where the device multiplies it natively, fp32 where it would be emulated."""
    if device.type != "cpu":
        return DtypeChoice(torch.bfloat16, f"{device.type} computes bf16 natively")
    features = cpu_bf16_features() if features is None else features
    if features:
        return DtypeChoice(
            torch.bfloat16, f"CPU has bf16 matmul instructions ({', '.join(features)})"
        )
    return DtypeChoice(
        torch.float32, "CPU has no bf16 matmul instructions (avx512_bf16, AMX or FEAT_BF16)"
    )
