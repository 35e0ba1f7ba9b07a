"""What a study will take on this machine, said before it starts.

A study's YAML may carry the wall times measured for it (`expected_time`): per device, dtype
and core count, with and without a change kept, each naming the results log it comes from.
Before the study starts, the one measured on the closest machine is scaled to this one's
threads and printed, and where it runs over the study's target the reason is said then, not
discovered half an hour later. No measurement for this kind of machine: that is said too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Threads beyond the measurement's speed a CPU study up by at most this much: trials already
# run side by side, and the scoring processes share the same cores.
MAX_SPEED_UP = 2.0


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MeasuredTime(_Strict):
    """One end-to-end wall time of the study, on one kind of machine."""

    device: Literal["cpu", "cuda", "mps"] = "cpu"
    dtype: Literal["float32", "bfloat16"]
    cores: int = Field(ge=1, le=4096)
    minutes: float = Field(gt=0)
    """From the first command to the report, with nothing kept (the warm-up trained)."""
    keep_minutes: float | None = Field(None, gt=0)
    """The same with a change kept: its confirmation re-runs and fresh test runs added."""
    source: str = Field(min_length=1)
    """The results log that holds the measurement."""


class ExpectedTime(_Strict):
    target_minutes: float | None = Field(None, gt=0)
    measured: list[MeasuredTime] = Field(default_factory=list, max_length=32)
    over_target: str | None = None
    """Why the study is not cut to fit its target where a machine runs over it."""


@dataclass(frozen=True)
class Machine:
    """What the embedded server runs on here, as the engine chooses it."""

    device: str
    dtype: str
    threads: int
    dtype_reason: str = ""


def expected_time_lines(expected: ExpectedTime | None, machine: Machine | None) -> list[str]:
    """The lines to print before the study starts (none without a declaration, or when the
    server is elsewhere and this machine says nothing about its speed)."""
    if expected is None or machine is None:
        return []
    here = f"{machine.device}, {machine.dtype}, {machine.threads} thread(s)"
    same = [m for m in expected.measured
            if m.device == machine.device and m.dtype == machine.dtype]
    if not same:
        known = "; ".join(f"{m.device} {m.dtype} on {m.cores} cores: {m.minutes:.0f} min"
                          for m in expected.measured) or "none"
        return [f"Expected time: nothing measured on a machine like this one ({here}). "
                f"Measured: {known}."]
    closest = min(same, key=lambda m: abs(m.cores - machine.threads))
    factor = 1.0
    if machine.device == "cpu" and closest.cores != machine.threads:
        factor = max(closest.cores / machine.threads, 1 / MAX_SPEED_UP)
    minutes = closest.minutes * factor
    scaled = (f"scaled from {closest.cores} cores" if factor != 1.0 else
              f"measured on {closest.cores} cores")
    keep = (f", about {closest.keep_minutes * factor:.0f} if a change is kept"
            if closest.keep_minutes else "")
    lines = [f"Expected time on this machine ({here}): about {minutes:.0f} minutes{keep} "
             f"({scaled}, {closest.source})."]
    target = expected.target_minutes
    if target is not None and minutes > target:
        why = [f"the engine runs {machine.dtype} here ({machine.dtype_reason})"
               if machine.dtype == "float32" and machine.dtype_reason else "",
               f"this machine has {machine.threads} thread(s)"
               if machine.device == "cpu" and machine.threads <= 2 else ""]
        reason = "; ".join(w for w in why if w)
        lines.append(f"That is over the study's {target:.0f}-minute target"
                     + (f": {reason}." if reason else ".")
                     + (f" {expected.over_target}" if expected.over_target else ""))
    return lines
