"""What a study's numbers depend on besides its declaration: package versions, the machine, its
threads, and the server's model and dtype.

Journaled once each time the study runs (a resume on another machine adds its own) and shown
in the report, so a reader can tell whether two journals came from the same environment. The
same seeds give the same bits only on the same environment: another CPU model or instruction
set, another thread count, another dtype or another package version changes the kernels'
summation order, and with it the low bits of every number.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from pathlib import Path
from typing import Any

import httpx

PACKAGES = ("autoresearch", "torch", "transformers", "tinker", "duckdb", "numpy", "scipy",
            "optuna", "sqlglot")
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "fma", "neon", "bf16")
"""Instruction-set extensions that choose which matmul kernels run."""


def api_key() -> str:
    """The key this process talks to Tinker servers with (`TINKER_API_KEY`; any `tml-` key
    opens a server that has none configured)."""
    return os.environ.get("TINKER_API_KEY") or "tml-local"


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def cpu_facts(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict[str, Any]:
    """The CPU model and the instruction-set flags that matter for the kernels (Linux reads
    /proc/cpuinfo; elsewhere the platform's processor string)."""
    model, flags = platform.processor() or platform.machine(), set()
    if cpuinfo.exists():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "Model") and model in ("", platform.machine(),
                                                              platform.processor()):
                model = value.strip()
            elif key in ("flags", "Features"):
                flags |= set(value.split())
    return {"model": model, "machine": platform.machine(), "cores": os.cpu_count(),
            "flags": sorted(f for f in CPU_FLAGS if f in flags)}


def server_facts(url: str, api_key: str) -> dict[str, Any]:
    """The served model, its dtype and why: from the server's capabilities (empty if it does
    not say)."""
    try:
        answer = httpx.get(f"{url.rstrip('/')}/api/v1/get_server_capabilities",
                           headers={"X-API-Key": api_key}, timeout=10).raise_for_status()
        model = (answer.json().get("supported_models") or [{}])[0]
    except (httpx.HTTPError, ValueError):
        return {}
    keys = ("model_name", "dtype", "dtype_reason", "base_model_origin", "device", "emulated",
            "batch_invariant", "sampler_trainer_bitwise", "deterministic", "threads")
    return {k: model[k] for k in keys if k in model}


def fingerprint(server_url: str | None = None, api_key: str = "") -> dict[str, Any]:
    """This process's environment, and the server's where it is reachable."""
    torch = sys.modules.get("torch")  # threads only where torch already runs here
    facts: dict[str, Any] = {
        "python": platform.python_version(), "platform": platform.platform(),
        "cpu": cpu_facts(), "packages": package_versions(),
        "torch_threads": torch.get_num_threads() if torch is not None else None,
    }
    if server_url:
        facts["server"] = server_facts(server_url, api_key)
    return facts


def environment_text(facts: dict[str, Any]) -> str:
    """One paragraph for the report."""
    cpu, server = facts.get("cpu") or {}, facts.get("server") or {}
    packages = ", ".join(f"{k} {v}" for k, v in (facts.get("packages") or {}).items())
    parts = [f"Python {facts.get('python')} on {facts.get('platform')}",
             f"CPU {cpu.get('model')} ({cpu.get('cores')} cores; "
             f"{', '.join(cpu.get('flags') or []) or 'no listed extensions'})",
             f"torch threads {facts.get('torch_threads')}"]
    if server:
        device = server.get("device")
        if device and server.get("emulated"):
            device += " (emulated on cpu)"
        parts.append(f"server model {server.get('model_name')} in {server.get('dtype')} "
                     f"({server.get('dtype_reason')}) on {device or 'an unreported device'}, "
                     f"{server.get('threads')} threads, "
                     f"batch-invariant: {server.get('batch_invariant')}")
    return "; ".join(parts) + f". Packages: {packages}."
