"""Peak resident memory of a command under the engine's keep budget, against the earlier rule.

The engine keeps freed host memory for reuse (`server.engine.host_memory`). It gives it back
when its RSS passes a share of the memory limit (a container's cgroup limit where set;
`--fractions` runs one side per share, default the engine's) or when less than 15% of that
limit is still available to anyone; the earlier rule compared RSS with 60% of the host's
physical RAM alone (`AUTORESEARCH_KEEP_BUDGET=physical`). The command runs once per side,
optionally beside a Jupyter kernel that holds memory as a notebook session does
(`--kernel-gib`). Printed per side: wall time, the command's peak RSS (its process tree,
sampled every 0.2 s), the lowest `MemAvailable` seen, and the ratios to the earlier rule.

    python -m bench.bench_peak_memory --kernel-gib 4 -- \\
        python -m bench.bench_transfer_learning --train-only --sft-steps 8 --rl-steps 2 \\
        --out runs/peak-{side} ...
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
BEFORE = "physical RAM (before)"
BASELINE = {"AUTORESEARCH_KEEP_BUDGET": "physical"}


def _mem_available() -> int:
    return psutil.virtual_memory().available


def run_side(command: list[str], extra_env: dict[str, str], side: str,
             timeline: Path | None = None) -> dict:
    """Run `command` to its end, sampling its tree's RSS; its wall time, peak RSS and the
    lowest available memory seen. `{side}` in an argument becomes the side's name, so each
    side writes (and resumes) its own output."""
    env = {**os.environ, **extra_env}
    slug = "".join(c if c.isalnum() or c == "." else "-" for c in side).strip("-")
    command = [arg.replace("{side}", slug) for arg in command]
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    peak, lowest = 0, _mem_available()
    stop = threading.Event()
    samples: list[str] = []

    def sample() -> None:
        nonlocal peak, lowest
        root = psutil.Process(process.pid)
        while not stop.is_set():
            try:
                tree = [root, *root.children(recursive=True)]
                rss = sum(p.memory_info().rss for p in tree if p.is_running())
            except psutil.Error:
                rss = 0
            peak, lowest = max(peak, rss), min(lowest, _mem_available())
            samples.append(f"{time.time():.1f} {rss}")
            stop.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, err = process.communicate()
    stop.set()
    sampler.join()
    if timeline is not None:
        path = Path(str(timeline).replace("{side}", slug))
        path.write_text("\n".join(samples) + "\n")  # unix time, RSS bytes
    if process.returncode != 0:
        raise SystemExit(f"{command[:3]} failed ({process.returncode}):\n{err[-3000:]}")
    return {"seconds": time.perf_counter() - started, "peak_rss": peak, "lowest_available": lowest}


def kernel_holding(gib: float):
    """A Jupyter kernel that imported the project and holds `gib` GiB, as a notebook does."""
    from jupyter_client.manager import start_new_kernel

    manager, client = start_new_kernel(kernel_name="python3", cwd=str(ROOT))
    code = (f"import autoresearch, numpy as np\n"
            f"held = np.ones(int({gib} * 2**30 // 8))\nprint(held.nbytes)")
    client.execute_interactive(code, timeout=300)
    return manager, client


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel-gib", type=float, default=0.0,
                        help="run beside a Jupyter kernel holding this much (0: none)")
    parser.add_argument("--now-only", action="store_true",
                        help="only the current budget (for a long command), no baseline run")
    parser.add_argument("--fractions", default="",
                        help="comma-separated keep fractions to run (default: the engine's); "
                        "`off`: glibc's defaults, nothing kept")
    parser.add_argument("--timeline", type=Path, default=None,
                        help="write each side's RSS samples here ({side} names the side)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    if command[0] == "python":
        command[0] = sys.executable
    kernel = kernel_holding(args.kernel_gib) if args.kernel_gib else None
    total = psutil.virtual_memory().total
    print(f"machine: {total / 2**30:.1f} GiB, {os.cpu_count()} cores; kernel beside: "
          f"{args.kernel_gib} GiB; command: {' '.join(command)}", flush=True)
    results = {}
    try:
        sides = {(f"budget, keep {f}" if f != "off" else "glibc defaults, nothing kept"):
                 ({"AUTORESEARCH_KEEP_FRACTION": f} if f != "off"
                  else {"AUTORESEARCH_KEEP_FREED_MEMORY": "0"})
                 for f in args.fractions.split(",") if f} or {"budget (now)": {}}
        if not args.now_only:
            sides[BEFORE] = BASELINE
        for name, env in sides.items():
            results[name] = run_side(command, env, name, args.timeline)
            r = results[name]
            print(f"{name:22s} {r['seconds']:8.0f} s  peak RSS {r['peak_rss'] / 2**30:6.2f} GiB"
                  f"  lowest available {r['lowest_available'] / 2**30:6.2f} GiB", flush=True)
    finally:
        if kernel is not None:
            manager, client = kernel
            client.stop_channels()
            manager.shutdown_kernel(now=True)
    if args.now_only:
        return 0
    before = results[BEFORE]
    for name, now in results.items():
        if name != BEFORE:
            print(f"{name}: peak RSS before / now {before['peak_rss'] / now['peak_rss']:.2f}x, "
                  f"time before / now {before['seconds'] / now['seconds']:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
