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


MPS_BF16_MACOS = (14, 0)
"""Metal runs bf16 from macOS 14 (Sonoma); on earlier systems MPS refuses bf16 tensors."""


def macos_version(release: str | None = None) -> tuple[int, ...] | None:
    """This Mac's macOS version, None elsewhere (`release` as `platform.mac_ver()[0]` gives)."""
    release = platform.mac_ver()[0] if release is None else release
    try:
        return tuple(int(part) for part in release.split(".")) if release else None
    except ValueError:
        return None


def mps_bf16_refusal(release: str | None = None) -> str | None:
    """Why MPS cannot compute bf16 on this system, or None when it can (or this is no Mac:
    `--emulate-device mps` runs a current Mac's layout)."""
    version = macos_version(release)
    if version is None or version >= MPS_BF16_MACOS:
        return None
    shown = ".".join(str(v) for v in version)
    return f"MPS computes bf16 only on macOS 14 or later (this Mac runs macOS {shown})"


def choose_dtype(device: torch.device, features: list[str] | None = None,
                 macos_release: str | None = None) -> DtypeChoice:
    """bf16 where the device multiplies it natively, fp32 where it would be emulated (or, on a
    Mac before macOS 14, refused)."""
    if device.type == "mps":
        refusal = mps_bf16_refusal(macos_release)
        if refusal:
            return DtypeChoice(torch.float32, f"{refusal}: float32")
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
