"""Keep freed host memory for reuse instead of handing it back to the kernel at every free.

On CPU the engine's large temporaries (`[rows, vocabulary]` logits and their exponentials, the
output head's chunks in training, activations kept for backward: tens of MiB each) are
allocated and freed many times per step. glibc serves each block over 32 MiB with a fresh
`mmap` and gives it back with `munmap`, and trims the heap whenever its free top passes 128 KiB,
so every step pays page faults on memory it had a moment before. Measured on 2 Zen 4 cores
(`bench/bench_host_memory.py`): a forward_backward of the RL step's shape spent a third of its
time in the kernel on 32 M minor faults.

The policy here: blocks come from the heap, one arena serves every thread (a thread arena
cannot hold blocks over 64 MiB), and the heap is not trimmed while the engine works, so busy
steps reuse warm memory. `AUTORESEARCH_MMAP_ABOVE_MB=128` maps blocks of that size and more (a
head chunk's 512 MiB of logits) on their own: the transfer recipe's peak was 12.6 GiB with every
block in the heap, 11.0 with these mapped (`bench/bench_peak_memory.py`); not the default yet.

What is kept is bounded by what the machine has now: after each batch the scheduler calls
`release_above_budget`, and every free page goes back (`malloc_trim`, the middle of the heap
included) when the process's RSS exceeds `KEPT_MEMORY_FRACTION` of its memory limit (the
container's cgroup limit where one is set, else the RAM), or when what is available to it
(`MemAvailable`, and the cgroup's headroom) falls under `RESERVE_FRACTION` of that limit because
other processes (a notebook kernel, a second engine) use it. So shapes that fragment the heap
cannot make RSS grow without bound, and a busy neighbour gets the pages back; an engine idle for
a while gives everything back (`release_freed_memory`). Only glibc has these knobs; elsewhere
this does nothing. `AUTORESEARCH_KEEP_FREED_MEMORY=0` keeps glibc's defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform
from pathlib import Path

log = logging.getLogger(__name__)

KEEP_FREED_MEMORY_ENV = "AUTORESEARCH_KEEP_FREED_MEMORY"
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_MAX = -4
_M_MMAP_THRESHOLD = -3
MMAP_ABOVE_ENV = "AUTORESEARCH_MMAP_ABOVE_MB"
MMAP_ABOVE_MB = 0
"""Blocks of at least this many MiB are mapped on their own and unmapped when freed (0: none
is; every block comes from the heap)."""
_M_ARENA_MAX = -8
_NEVER = -1
"""As a trim threshold, -1 becomes SIZE_MAX in glibc: never trim."""
_TOP_PAD = 256 << 20
KEPT_MEMORY_FRACTION = 0.6
"""RSS above this share of the memory limit after a batch makes the free pages go back."""
RESERVE_FRACTION = 0.15
"""Less than this share of the memory limit available after a batch makes them go back too."""
CGROUP_ROOT = Path("/sys/fs/cgroup")
MEMINFO = Path("/proc/meminfo")
_state: dict[str, bool] = {}
_libc: list[ctypes.CDLL] = []


def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc and the policy is not switched off, else None."""
    if _libc:
        return _libc[0]
    if os.environ.get(KEEP_FREED_MEMORY_ENV, "1") == "0" or platform.system() != "Linux":
        return None
    if platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt  # noqa: B018  (glibc's, absent from other C libraries)
    except (OSError, AttributeError):
        return None
    _libc.append(libc)
    return libc


def one_malloc_arena() -> bool:
    """Cap glibc at the one malloc arena it has, and nothing else; True if capped.

    For a process that may start an embedded server later (`import autoresearch` in a notebook
    or a script): imports such as statsmodels' start threads that allocate, and each would get
    an arena of its own, which the engine thread may then be handed. The cap costs only lock
    waits where threads allocate at once; freed memory still goes back to the kernel as glibc's
    defaults say until `keep_freed_memory` applies the rest of the policy."""
    if "one_arena" not in _state:
        libc = _glibc()
        _state["one_arena"] = libc is not None and libc.mallopt(_M_ARENA_MAX, 1) == 1
    return _state["one_arena"]


def keep_freed_memory() -> bool:
    """Apply the policy once per process; call it before worker threads allocate. True if the
    policy is in force."""
    if "applied" in _state:
        return _state["applied"]
    _state["applied"] = False
    libc = _glibc()
    if libc is None:
        return False
    mallopt = libc.mallopt
    huge = int(os.environ.get(MMAP_ABOVE_ENV, MMAP_ABOVE_MB)) << 20
    mmap = (_M_MMAP_THRESHOLD, huge) if huge > 0 else (_M_MMAP_MAX, 0)
    settings = ((_M_ARENA_MAX, 1), mmap, (_M_TRIM_THRESHOLD, _NEVER), (_M_TOP_PAD, _TOP_PAD))
    _state["applied"] = all(mallopt(option, value) == 1 for option, value in settings)
    log.info("freed host memory kept for reuse: %s", _state["applied"])
    arenas = allocator_arenas()
    if _state["applied"] and arenas > 1:
        log.warning(
            "%d malloc arenas existed before the engine's memory policy was applied: a thread "
            "that allocated first keeps an arena of its own, and an engine thread that shares "
            "one maps and unmaps every block over 64 MiB (an SFT step ran 1.3x slower so). "
            "Import autoresearch or server.entrypoints before other threads start, or set "
            "MALLOC_ARENA_MAX=1 in the environment of the process (a notebook kernel's, say)",
            arenas,
        )
    return _state["applied"]


def allocator_arenas() -> int:
    """How many malloc arenas this process has (glibc's `malloc_info`; 0 where unknown).

    An arena is made for a thread that allocates while all existing ones are busy, up to the
    arena limit in force then; once several exist, a later thread may be given any of them."""
    if not _libc:
        return 0
    import tempfile

    libc = _libc[0]
    libc.fopen.restype = ctypes.c_void_p
    with tempfile.NamedTemporaryFile(suffix=".xml") as report:
        stream = libc.fopen(report.name.encode(), b"w")
        if not stream:
            return 0
        libc.malloc_info(0, ctypes.c_void_p(stream))
        libc.fclose(ctypes.c_void_p(stream))
        return report.read().decode(errors="replace").count("<heap nr=")


def resident_bytes() -> int:
    """This process's resident set now (from `/proc/self/statm`; 0 where there is none)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _read_int(path: Path) -> int | None:
    """An integer file's value (None when absent, unreadable or `max`)."""
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _meminfo(field: str, meminfo: Path) -> int | None:
    """A `/proc/meminfo` field in bytes."""
    try:
        for line in meminfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key == field:
                return int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_limit_and_usage(root: Path) -> tuple[int | None, int | None]:
    """This process's cgroup memory limit and usage in bytes (v2, else v1; None where unset).

    A pod's limit lives here; `SC_PHYS_PAGES` sees the whole host."""
    limit = _read_int(root / "memory.max")
    if limit is not None:
        return limit, _read_int(root / "memory.current")
    limit = _read_int(root / "memory" / "memory.limit_in_bytes")
    if limit is not None and limit >= 1 << 60:  # v1 writes "no limit" as a huge number
        limit = None
    return limit, _read_int(root / "memory" / "memory.usage_in_bytes")


def memory_limit_bytes(root: Path = CGROUP_ROOT, meminfo: Path = MEMINFO) -> int:
    """The memory this process may use: its cgroup limit where one is set, else the RAM."""
    physical = _meminfo("MemTotal", meminfo) or (
        os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    limit, _ = _cgroup_limit_and_usage(root)
    return min(physical, limit) if limit else physical


def available_bytes(root: Path = CGROUP_ROOT, meminfo: Path = MEMINFO) -> int:
    """Memory this process could still take now: the kernel's `MemAvailable`, and under a cgroup
    limit no more than that limit's headroom."""
    available = _meminfo("MemAvailable", meminfo)
    if available is None:  # no /proc (macOS): the system's own count of what it can give
        available = _system_available() or memory_limit_bytes(root, meminfo)
    limit, usage = _cgroup_limit_and_usage(root)
    if limit and usage is not None:
        available = min(available, max(0, limit - usage))
    return available


def _system_available() -> int | None:
    try:
        import psutil
    except ImportError:
        return None
    return int(psutil.virtual_memory().available)


def over_budget(fraction: float = KEPT_MEMORY_FRACTION, reserve: float = RESERVE_FRACTION,
                root: Path = CGROUP_ROOT, meminfo: Path = MEMINFO) -> bool:
    """Whether kept memory should go back: RSS above `fraction` of the limit, or less than
    `reserve` of it still available."""
    limit = memory_limit_bytes(root, meminfo)
    return (resident_bytes() > fraction * limit
            or available_bytes(root, meminfo) < reserve * limit)


KEEP_BUDGET_ENV = "AUTORESEARCH_KEEP_BUDGET"
"""`physical`: the earlier rule (RSS against a share of the host's RAM, whatever a container's
limit or the neighbours), kept as the baseline `bench/bench_peak_memory.py` compares with."""


KEEP_FRACTION_ENV = "AUTORESEARCH_KEEP_FRACTION"
"""Overrides `KEPT_MEMORY_FRACTION` (a share of the memory limit, 0 to 1)."""


def kept_fraction() -> float:
    """The share of the memory limit freed memory may be kept up to."""
    try:
        value = float(os.environ.get(KEEP_FRACTION_ENV, KEPT_MEMORY_FRACTION))
    except ValueError:
        return KEPT_MEMORY_FRACTION
    return min(1.0, max(0.0, value))


def release_above_budget(fraction: float | None = None) -> bool:
    """`release_freed_memory` when `over_budget`; True if it did."""
    if not _state.get("applied"):
        return False
    fraction = kept_fraction() if fraction is None else fraction
    if os.environ.get(KEEP_BUDGET_ENV) == "physical":
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return resident_bytes() > 0.6 * physical and release_freed_memory()
    return over_budget(fraction) and release_freed_memory()


def release_freed_memory() -> bool:
    """Give every free heap page back to the kernel (when the policy is in force); True if it
    did. For an idle engine: the next batch faults its pages in again."""
    if not _state.get("applied"):
        return False
    return bool(_libc[0].malloc_trim(0))
