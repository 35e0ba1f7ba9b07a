"""Keep freed host memory for reuse instead of handing it back to the kernel at every free.

On CPU the engine's large temporaries (`[rows, vocabulary]` logits and their exponentials, the
output head's chunks in training, activations kept for backward: tens of MiB each) are
allocated and freed many times per step. glibc serves each block over 32 MiB with a fresh
`mmap` and gives it back with `munmap`, and trims the heap whenever its free top passes 128 KiB,
so every step pays page faults on memory it had a moment before. Measured on 2 Zen 4 cores
(`bench/bench_host_memory.py`): a forward_backward of the RL step's shape spent a third of its
time in the kernel on 32 M minor faults.

The policy here: blocks come from the heap (no `mmap`), one arena serves every thread (a thread
arena cannot hold blocks over 64 MiB), and the heap is not trimmed while the engine works, so
busy steps reuse warm memory. What is kept is bounded: after each batch the scheduler calls
`release_above_budget`, and when the process's RSS exceeds `KEPT_MEMORY_FRACTION` of the
machine's RAM every free page goes back (`malloc_trim`, the middle of the heap included), so
shapes that fragment the heap cannot make RSS grow without bound; an engine idle for a while
gives everything back (`release_freed_memory`). Only glibc has these knobs; elsewhere this does
nothing. `AUTORESEARCH_KEEP_FREED_MEMORY=0` keeps glibc's defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import platform

log = logging.getLogger(__name__)

KEEP_FREED_MEMORY_ENV = "AUTORESEARCH_KEEP_FREED_MEMORY"
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
_NEVER = -1
"""As a trim threshold, -1 becomes SIZE_MAX in glibc: never trim."""
_TOP_PAD = 256 << 20
KEPT_MEMORY_FRACTION = 0.6
"""RSS above this share of physical memory after a batch makes the free pages go back."""
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
    settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, _NEVER),
                (_M_TOP_PAD, _TOP_PAD))
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


def release_above_budget(fraction: float = KEPT_MEMORY_FRACTION) -> bool:
    """`release_freed_memory` if RSS exceeds `fraction` of physical memory; True if it did."""
    if not _state.get("applied"):
        return False
    budget = fraction * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return resident_bytes() > budget and release_freed_memory()


def release_freed_memory() -> bool:
    """Give every free heap page back to the kernel (when the policy is in force); True if it
    did. For an idle engine: the next batch faults its pages in again."""
    if not _state.get("applied"):
        return False
    return bool(_libc[0].malloc_trim(0))
