"""Start-up time of the embedded server: cold (GGUF conversion + load) versus warm (cached load).

Cold start converts the packaged GGUF into an empty cache directory (`AUTORESEARCH_CACHE` points
at a temporary directory, so the real cache is never touched); warm start loads that converted
cache. Each start is measured twice:

- end to end: from spawning `python -m server --port P --data-dir D` until `/api/v1/healthz`
  answers, with the server's own `load_base_model` time read from its log;
- in process: `load_base_model()` called in this process (warm only: a cold in-process load would
  convert a second time).

Cold start takes minutes on a small CPU machine and runs once; warm starts repeat. The machine is
shared, so read the ratios, not the absolute seconds; the load average is printed alongside.

    python -m bench.bench_startup            # cold once, warm three times
    python -m bench.bench_startup --skip-cold
    python -m bench.bench_startup --quick    # one warm start, no cold start
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

LOAD_LINE = re.compile(r"loaded \S+ from (\w+) on .*? in ([0-9.]+)s$", re.MULTILINE)


@dataclass
class Start:
    """One measured server start."""

    to_healthz: float
    """Seconds from spawning the process until the health check answered."""
    load: float
    """Seconds the server itself reported for `load_base_model`."""
    source: str
    """Where the weights came from: `gguf` (converted now) or `cache`."""


def start_server(cache_root: Path, timeout: float) -> Start:
    """Spawn the server, wait for its health check, stop it, and read its load time."""
    from server.entrypoints.runtime import free_port
    from tools.processes import ServiceProcess, server_command

    port = free_port()
    env = dict(os.environ, AUTORESEARCH_CACHE=str(cache_root))
    with tempfile.TemporaryDirectory(prefix="bench-data-") as data:
        server = ServiceProcess(server_command("--port", str(port), "--data-dir", data),
                                Path(data) / "server.log", url=f"http://127.0.0.1:{port}",
                                env=env)
        started = time.perf_counter()
        with server:
            server.wait_answers(timeout=timeout)
            elapsed = time.perf_counter() - started
        match = LOAD_LINE.search(server.tail(chars=1_000_000))
    if match is None:
        raise RuntimeError("the server log has no 'loaded ... in Ns' line")
    return Start(elapsed, float(match.group(2)), match.group(1))


def load_in_process(cache_root: Path) -> tuple[float, float]:
    """(import seconds, load seconds) for `load_base_model` against `cache_root`'s cache."""
    started = time.perf_counter()
    import transformers

    from server.engine.model_loading import load_base_model

    transformers.utils.logging.disable_progress_bar()
    imported = time.perf_counter()
    loaded = load_base_model(cache_dir=cache_root / "models")
    loaded_at = time.perf_counter()
    if loaded.source != "cache":
        raise RuntimeError(f"expected a cached load, got source={loaded.source!r}")
    return imported - started, loaded_at - imported


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-cold", action="store_true",
                        help="measure warm starts only, from the existing cache")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: one warm start, no cold start")
    parser.add_argument("--repeats", type=int, default=3, help="warm starts to measure")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds to wait for one server start")
    args = parser.parse_args(argv)
    skip_cold = args.skip_cold or args.quick
    repeats = 1 if args.quick else args.repeats

    print("command:", shlex.join([sys.executable, *sys.argv]))
    print(f"cpus={os.cpu_count()} loadavg(1,5,15)={loadavg()}")
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as tmp:
        if skip_cold:
            cache_root = Path(os.environ.get("AUTORESEARCH_CACHE")
                              or Path.home() / ".cache" / "autoresearch")
            cold = None
        else:
            cache_root = Path(tmp)
            print("cold start: converting the packaged GGUF into an empty cache ...", flush=True)
            cold = start_server(cache_root, args.timeout)
            if cold.source != "gguf":
                raise RuntimeError(f"cold start loaded from {cold.source!r}, not the GGUF")
            print(f"  cold: healthz after {cold.to_healthz:.1f}s "
                  f"(server load {cold.load:.1f}s)  loadavg={loadavg()}", flush=True)
        warm: list[Start] = []
        for i in range(repeats):
            start = start_server(cache_root, args.timeout)
            if start.source != "cache":
                raise RuntimeError(f"warm start loaded from {start.source!r}, not the cache")
            warm.append(start)
            print(f"  warm {i + 1}: healthz after {start.to_healthz:.1f}s "
                  f"(server load {start.load:.1f}s)  loadavg={loadavg()}", flush=True)
        import_s, load_s = load_in_process(cache_root)

    warm_healthz = statistics.median(s.to_healthz for s in warm)
    warm_load = statistics.median(s.load for s in warm)
    print()
    print(f"{'start':<28}{'healthz s':>12}{'load s':>10}")
    if cold is not None:
        print(f"{'cold (subprocess)':<28}{cold.to_healthz:>12.1f}{cold.load:>10.1f}")
    print(f"{'warm (subprocess, median)':<28}{warm_healthz:>12.1f}{warm_load:>10.1f}")
    print(f"{'warm (in process)':<28}{'':>12}{load_s:>10.1f}   (+{import_s:.1f}s imports)")
    if cold is not None:
        print(f"cold/warm ratio: healthz {cold.to_healthz / warm_healthz:.1f}x, "
              f"load {cold.load / warm_load:.1f}x")
    print(f"loadavg at end: {loadavg()}")


if __name__ == "__main__":
    main()
