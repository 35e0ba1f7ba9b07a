"""Freed host memory is kept for reuse: a large block freed and allocated again costs the kernel
nothing (no fresh mapping to fault in and zero).

Each case runs in a fresh interpreter, since the policy is process-wide and must come before
the first large allocation.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

PROBE = """
import json, resource
import numpy as np
from server.engine.host_memory import keep_freed_memory
kept = keep_freed_memory()
assert keep_freed_memory() == kept  # applied once, idempotent
np.ones(16 << 20, np.float32)  # 64 MiB, touched, freed
before = resource.getrusage(resource.RUSAGE_SELF)
for _ in range(40):
    np.ones(16 << 20, np.float32)
after = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"kept": kept, "kernel_s": after.ru_stime - before.ru_stime,
                  "faults": after.ru_minflt - before.ru_minflt}))
"""


def _probe(**env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], env={**os.environ, **env},
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the policy is glibc's knobs")
def test_a_freed_block_is_reused_without_page_faults_and_the_switch_turns_it_off():
    kept = _probe(AUTORESEARCH_KEEP_FREED_MEMORY="1")
    default = _probe(AUTORESEARCH_KEEP_FREED_MEMORY="0")
    assert kept["kept"] is True and default["kept"] is False
    # glibc maps each of the 40 blocks afresh: the kernel faults in and zeroes 2.5 GiB (in 4 KiB
    # or 2 MiB pages); kept, the heap's pages are reused and the kernel does next to nothing.
    assert default["faults"] > 40 and default["kernel_s"] > 0.05
    assert kept["faults"] < 40 and kept["kernel_s"] < default["kernel_s"] / 4


RELEASE_PROBE = """
import json
import numpy as np
import psutil
from server.engine.host_memory import keep_freed_memory, release_freed_memory
assert keep_freed_memory()
process = psutil.Process()
block = np.ones(64 << 20, np.float32)  # 256 MiB
del block
held = process.memory_info().rss
released = release_freed_memory()
print(json.dumps({"released": released, "freed_mib": (held - process.memory_info().rss) >> 20}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the policy is glibc's knobs")
def test_kept_memory_goes_back_to_the_kernel_when_released():
    out = subprocess.run([sys.executable, "-c", RELEASE_PROBE], capture_output=True, text=True,
                         check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["released"] and result["freed_mib"] >= 200  # of the 256 MiB kept


def test_an_idle_engine_releases_kept_memory_once_per_idle_period(monkeypatch):
    from types import SimpleNamespace

    from server.scheduling import scheduler as scheduling
    from tests.server.server_helpers import wait_until

    calls: list[float] = []
    monkeypatch.setattr(scheduling, "RELEASE_MEMORY_AFTER_IDLE_S", 0.0)
    monkeypatch.setattr(scheduling, "release_freed_memory", lambda: calls.append(1.0))
    engine = SimpleNamespace(stats=SimpleNamespace(busy_seconds=0.0))
    scheduler = scheduling.Scheduler(engine, maintenance_seconds=0.01)
    try:
        wait_until(lambda: calls, what="the first release")
        ticks = scheduler.last_tick
        wait_until(lambda: scheduler.last_tick > ticks + 0.1, what="ten more idle rounds")
        assert len(calls) == 1
    finally:
        scheduler.stop()


BUDGET_PROBE = """
import json
import numpy as np
from server.engine.host_memory import keep_freed_memory, release_above_budget, resident_bytes
assert keep_freed_memory()
block = np.ones(64 << 20, np.float32)  # 256 MiB, freed: kept
del block
held = resident_bytes()
generous = release_above_budget(fraction=1.0)  # RSS is far below all of RAM: nothing released
after_generous = resident_bytes()
tight = release_above_budget(fraction=1e-6)  # RSS is above a tiny budget: released
print(json.dumps({"generous": generous, "tight": tight,
                  "kept_mib": after_generous >> 20,
                  "held_mib": held >> 20, "freed_mib": (after_generous - resident_bytes()) >> 20}))
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the policy is glibc's knobs")
def test_kept_memory_is_released_only_above_the_budget():
    out = subprocess.run([sys.executable, "-c", BUDGET_PROBE], capture_output=True, text=True,
                         check=True).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["generous"] is False and result["kept_mib"] >= result["held_mib"] - 8
    assert result["tight"] is True and result["freed_mib"] >= 200


THREAD_PROBE = """
import json, resource, sys, threading
if sys.argv[1] == "package":
    import autoresearch  # caps glibc at one arena, as a notebook's first import does
import numpy as np
if sys.argv[1] in ("late", "package"):  # a thread allocates first
    ready, done = threading.Event(), threading.Event()
    def early():
        np.ones(1 << 20, np.float32)
        ready.set()
        done.wait()
    threading.Thread(target=early, daemon=True).start()
    ready.wait()
import server.entrypoints  # applies the policy on import
from server.engine.host_memory import allocator_arenas
result = {}
def engine_thread():  # an embedded server's engine: a thread started after the policy
    np.ones(80 << 20, np.float32)  # 320 MiB, over a thread heap's 64 MiB
    before = resource.getrusage(resource.RUSAGE_THREAD)
    for _ in range(10):
        np.ones(80 << 20, np.float32)
    after = resource.getrusage(resource.RUSAGE_THREAD)
    result["faults"] = after.ru_minflt - before.ru_minflt
worker = threading.Thread(target=engine_thread)
worker.start()
worker.join()
print(json.dumps({**result, "arenas": allocator_arenas()}))
"""


def _thread_probe(when: str) -> tuple[dict, str]:
    done = subprocess.run([sys.executable, "-c", THREAD_PROBE, when], capture_output=True,
                          text=True, check=True, env={**os.environ,
                                                      "AUTORESEARCH_KEEP_FREED_MEMORY": "1"})
    return json.loads(done.stdout.strip().splitlines()[-1]), done.stderr


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the policy is glibc's knobs")
def test_importing_the_entry_points_first_gives_a_later_engine_thread_the_kept_heap():
    """An embedded server's engine runs on a thread of its own: with the policy applied on
    import, before any other thread allocates, that thread shares the one arena and reuses its
    large blocks; applied after a thread has its own arena, the process says so."""
    early, quiet = _thread_probe("early")
    assert early["arenas"] == 1 and early["faults"] < 100, early
    assert "malloc arenas existed" not in quiet
    late, warned = _thread_probe("late")
    assert late["arenas"] > 1
    assert "2 malloc arenas existed before the engine's memory policy" in warned
    assert "MALLOC_ARENA_MAX=1" in warned


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the policy is glibc's knobs")
def test_importing_autoresearch_first_keeps_one_arena_for_a_later_engine_thread():
    """`import autoresearch` comes before the imports that start threads (statsmodels', in the
    statistics): a thread that allocates after it gets no arena of its own, so an embedded
    server's engine thread, started later still, reuses the kept heap without a warning."""
    result, stderr = _thread_probe("package")
    assert result["arenas"] == 1 and result["faults"] < 100, result
    assert "malloc arenas existed" not in stderr


def _meminfo(path, total_gib: float, available_gib: float):
    path.write_text(f"MemTotal:       {int(total_gib * 2**20)} kB\n"
                    f"MemFree:        1000 kB\n"
                    f"MemAvailable:   {int(available_gib * 2**20)} kB\n")
    return path


def test_the_memory_limit_is_the_containers_not_the_hosts(tmp_path):
    from server.engine import host_memory

    meminfo = _meminfo(tmp_path / "meminfo", 64, 60)
    plain = tmp_path / "no-cgroup"
    plain.mkdir()
    assert host_memory.memory_limit_bytes(plain, meminfo) == 64 << 30
    assert host_memory.available_bytes(plain, meminfo) == 60 << 30
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text(f"{8 << 30}\n")
    (v2 / "memory.current").write_text(f"{6 << 30}\n")
    assert host_memory.memory_limit_bytes(v2, meminfo) == 8 << 30
    assert host_memory.available_bytes(v2, meminfo) == 2 << 30  # the pod's headroom, not 60
    (v2 / "memory.max").write_text("max\n")
    assert host_memory.memory_limit_bytes(v2, meminfo) == 64 << 30
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text(f"{4 << 30}\n")
    (v1 / "memory" / "memory.usage_in_bytes").write_text(f"{1 << 30}\n")
    assert host_memory.memory_limit_bytes(v1, meminfo) == 4 << 30
    assert host_memory.available_bytes(v1, meminfo) == 3 << 30
    (v1 / "memory" / "memory.limit_in_bytes").write_text(f"{(1 << 63) - 4096}\n")  # unlimited
    assert host_memory.memory_limit_bytes(v1, meminfo) == 64 << 30


def test_kept_memory_goes_back_when_the_neighbours_need_it(tmp_path, monkeypatch):
    from server.engine import host_memory

    plain = tmp_path / "no-cgroup"
    plain.mkdir()
    monkeypatch.setattr(host_memory, "resident_bytes", lambda: 2 << 30)
    quiet = _meminfo(tmp_path / "quiet", 16, 12)
    assert not host_memory.over_budget(root=plain, meminfo=quiet)
    busy = _meminfo(tmp_path / "busy", 16, 1.5)  # a notebook kernel and a browser took the rest
    assert host_memory.over_budget(root=plain, meminfo=busy)
    monkeypatch.setattr(host_memory, "resident_bytes", lambda: 10 << 30)  # 62% of 16 GiB
    assert host_memory.over_budget(root=plain, meminfo=quiet)
    pod = tmp_path / "pod"
    pod.mkdir()
    (pod / "memory.max").write_text(f"{12 << 30}\n")
    (pod / "memory.current").write_text(f"{11 << 30}\n")
    monkeypatch.setattr(host_memory, "resident_bytes", lambda: 5 << 30)
    assert host_memory.over_budget(root=pod, meminfo=quiet)  # 1 GiB headroom of 12
