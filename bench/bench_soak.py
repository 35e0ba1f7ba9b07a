"""Soak: does a long-running server hold memory and disk flat under RL traffic?

`python -m server` runs in its own process (as an operator runs it) on a tiny random Gemma 3
with the real Gemma vocabulary size (262144, so every LoRA snapshot carries a full-vocabulary
`lm_head` adapter and every step scores the whole vocabulary). Five runs, each with its own SDK
session, drive it concurrently: one does `--steps` RL-like steps, four do `--side-steps`. One
step is forward_backward (importance sampling) + optim_step + a new sampler snapshot
(`save_weights_and_get_sampling_client`) + a sample from it, which is what an RL loop does.

Every 50 steps of the long run it prints the server's RSS and the data directory's size.
Target: flat after warm-up, i.e. growth from step 100 to the end under 100 MB of RSS and under
100 MB of disk, with zero errors. Growth is also printed as a ratio to the step-100 figure.
The same soak then runs with the snapshot bounds turned off (`--snapshots-per-run 0
--snapshot-ttl-seconds 0`, the behaviour before the lifecycle policy) as the baseline measured
in the same invocation, and the summary prints the policy's growth as a ratio to it.

    python -m bench.bench_soak                        # 500 + 4 x 100 steps, policy on and off
    python -m bench.bench_soak --steps 100 --side-steps 20   # quick look
"""

from __future__ import annotations

import argparse
import logging
import os
import shlex
import shutil
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

GEMMA_VOCAB = 262_144
API_KEY = "tml-soak"
REPORT_EVERY = 50


def build_model(directory: Path) -> Path:
    """A random 2-layer Gemma 3 with Gemma's vocabulary size (and a small test tokenizer: the
    benchmark sends token ids, so only the embedding and output sizes matter)."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from tests.server.server_helpers import build_tiny_model

    build_tiny_model(directory)
    config = Gemma3TextConfig.from_pretrained(directory)
    config.vocab_size = GEMMA_VOCAB
    # Narrow layers: on a small CPU box the [positions, 262144] output head dominates a step.
    config.hidden_size, config.intermediate_size = 16, 32
    config.head_dim = config.query_pre_attn_scalar = 8
    torch.manual_seed(0)
    Gemma3ForCausalLM(config).save_pretrained(directory)
    return directory


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def disk_mb(root: Path) -> float:
    total = 0
    for path in root.rglob("*"):
        try:
            if path.is_file():
                total += path.stat().st_size
        except FileNotFoundError:  # deleted while we walked
            pass
    return total / 2**20


@dataclass
class Soak:
    errors: list[str] = field(default_factory=list)
    progress: dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def rl_steps(url: str, base_model: str, steps: int, seed: int, soak: Soak, args) -> None:
    import tinker
    from tinker import types

    rng = np.random.default_rng(seed)
    prompt = rng.integers(10, GEMMA_VOCAB, size=args.prompt_tokens).tolist()
    params = types.SamplingParams(max_tokens=args.new_tokens, temperature=1.0, seed=seed)
    with tinker.ServiceClient(base_url=url, api_key=API_KEY) as service:
        run = service.create_lora_training_client(base_model=base_model, rank=args.rank,
                                                   seed=seed).result()
        sampler = run.save_weights_and_get_sampling_client().result()
        for step in range(1, steps + 1):
            try:
                result = sampler.sample(types.ModelInput.from_ints(prompt), args.samples,
                                        params).result()
                advantages = rng.standard_normal(len(result.sequences))
                data = []
                for seq, adv in zip(result.sequences, advantages - advantages.mean()):
                    completion = list(seq.tokens) or [11]
                    lps = list(seq.logprobs or [0.0] * len(completion))
                    tokens = prompt + completion
                    n = len(tokens) - 1
                    data.append(types.Datum(
                        model_input=types.ModelInput.from_ints(tokens[:-1]),
                        loss_fn_inputs={
                            "target_tokens": tokens[1:],
                            "logprobs": [0.0] * (len(prompt) - 1) + lps[: n - len(prompt) + 1],
                            "advantages": [0.0] * (len(prompt) - 1)
                            + [float(adv)] * (n - len(prompt) + 1),
                        },
                    ))
                run.forward_backward(data, "importance_sampling").result()
                run.optim_step(types.AdamParams(learning_rate=1e-4)).result()
                sampler = run.save_weights_and_get_sampling_client().result()
            except Exception as exc:  # noqa: BLE001 - counted and reported, the soak goes on
                with soak.lock:
                    soak.errors.append(f"run {seed} step {step}: {type(exc).__name__}: {exc}")
            with soak.lock:
                soak.progress[seed] = step


def soak_once(args, model_dir: Path, label: str, server_flags: list[str]) -> dict[str, float]:
    from server.entrypoints.runtime import free_port
    from tools.processes import ServiceProcess, server_command, without_api_keys
    from tools.scrape import sample_value

    data_dir = Path(tempfile.mkdtemp(prefix="soak-data-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = data_dir.parent / f"{data_dir.name}.log"
    server = ServiceProcess(
        server_command("--model", str(model_dir), "--port", str(port), "--data-dir",
                       str(data_dir), *server_flags),
        log_path, url=url, env=without_api_keys()).start()
    try:
        server.wait_answers()
        print(f"\n--- {label}: server flags {shlex.join(server_flags) or '(defaults)'}")
        soak = Soak()
        threads = [threading.Thread(target=rl_steps, args=(url, str(model_dir), args.steps, 0,
                                                           soak, args))]
        threads += [threading.Thread(target=rl_steps,
                                     args=(url, str(model_dir), args.side_steps, i, soak, args))
                    for i in range(1, 5)]
        started = time.monotonic()
        for thread in threads:
            thread.start()
        rows = [("step", "seconds", "server RSS MB", "data dir MB", "freed snapshots",
                 "errors", "side runs' steps")]
        figures: dict[int, tuple[float, float]] = {}
        reported = 0
        while reported < args.steps:
            time.sleep(0.5)
            with soak.lock:
                step = soak.progress.get(0, 0)
                side = sum(soak.progress.get(i, 0) for i in range(1, 5))
                errors = len(soak.errors)
            if step >= reported + REPORT_EVERY or (step == args.steps and step > reported):
                reported = step - step % REPORT_EVERY if step < args.steps else step
                rss, disk = rss_mb(server.pid), disk_mb(data_dir)
                figures[reported] = (rss, disk)
                freed = sample_value(url, "autoresearch_freed_snapshots_total")
                freed = float("nan") if freed is None else freed
                rows.append((str(reported), f"{time.monotonic() - started:.0f}", f"{rss:.0f}",
                             f"{disk:.1f}", f"{freed:.0f}", str(errors), str(side)))
                print("  " + "  ".join(rows[-1]), flush=True)
            if not threads[0].is_alive() and step < args.steps:
                break
        for thread in threads:
            thread.join()
        # The last sample can land after the long run closed its session (its snapshots go
        # then), so growth is read up to the last sample taken while it still ran.
        end = max([s for s in figures if s < max(figures)] or [max(figures)])
        base = 100 if 100 in figures and end > 100 else min(figures)
        rss_growth = figures[end][0] - figures[base][0]
        disk_growth = figures[end][1] - figures[base][1]
        peak_rss = max(r for r, _ in figures.values())
        peak_disk = max(d for _, d in figures.values())
        print(f"  columns: {', '.join(rows[0])}")
        print(f"  growth step {base} -> {end}: RSS {rss_growth:+.0f} MB "
              f"(x{figures[end][0] / figures[base][0]:.2f}), "
              f"data dir {disk_growth:+.1f} MB "
              f"(x{figures[end][1] / max(figures[base][1], 1e-9):.2f}); peak RSS "
              f"{peak_rss:.0f} MB, peak data dir {peak_disk:.1f} MB; errors {len(soak.errors)}")
        for line in soak.errors[:5]:
            print("   error:", line)
        return {"rss_growth": rss_growth, "disk_growth": disk_growth, "peak_rss": peak_rss,
                "peak_disk": peak_disk, "rss_end": figures[end][0], "disk_end": figures[end][1],
                "errors": float(len(soak.errors)), "seconds": time.monotonic() - started}
    finally:
        server.stop()
        shutil.rmtree(data_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--side-steps", type=int, default=100)
    parser.add_argument("--rank", type=int, default=4)
    parser.add_argument("--samples", type=int, default=2, help="completions per step")
    parser.add_argument("--prompt-tokens", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=4)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.getLogger("tinker").setLevel(logging.ERROR)
    os.environ.setdefault("TINKER_TELEMETRY", "0")

    import torch

    print("command:", shlex.join(["python", "bench/bench_soak.py", *sys.argv[1:]]))
    print(f"cpus={os.cpu_count()} torch_threads={torch.get_num_threads()} "
          f"loadavg(1,5,15) at start={' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory(prefix="soak-model-") as tmp:
        model_dir = build_model(Path(tmp))
        bounded = soak_once(args, model_dir, "lifecycle policy on (defaults)", [])
        unbounded = soak_once(args, model_dir, "snapshot bounds off (baseline)",
                              ["--snapshots-per-run", "0", "--snapshot-ttl-seconds", "0"])
        results = [("lifecycle policy on", bounded), ("snapshot bounds off", unbounded)]
    print("\nsummary (growth from step 100 to the last step sampled while the long run ran; "
          "target < 100 MB each, 0 errors)")
    for label, r in results:
        print(f"  {label:22s} RSS {r['rss_growth']:+7.0f} MB  disk {r['disk_growth']:+8.1f} MB"
              f"  peak RSS {r['peak_rss']:.0f} MB  peak disk {r['peak_disk']:.1f} MB"
              f"  errors {r['errors']:.0f}  {r['seconds']:.0f} s")
    b, u = bounded, unbounded
    print(f"  policy on / baseline: peak data dir {b['peak_disk'] / max(u['peak_disk'], 1e-9):.3f}"
          f", peak RSS {b['peak_rss'] / u['peak_rss']:.3f}; disk growth {b['disk_growth']:+.1f} "
          f"vs {u['disk_growth']:+.1f} MB")
    met = all(r["rss_growth"] < 100 and r["disk_growth"] < 100 and r["errors"] == 0
              for label, r in results[:1])
    print(f"  target met (policy on): {'yes' if met else 'no'}")
    print(f"loadavg(1,5,15) at end={' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
