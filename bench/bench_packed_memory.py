"""Prefix sharing's memory against the row's length: chunked attention vs dense square masks.

One packed row per measurement: a prompt of half the row shared by four continuations, through
forward_backward (`importance_sampling`, rank 16) on the embedded Gemma 3 270M. Each width runs
twice in the same process, alternating:

- `chunked`: the engine as it is (`packed_attention`: masks per chunk of queries, keys limited
  to what the chunk may see);
- `dense`: the same layouts turned into one `[rows, 1, width, width]` boolean mask per layer
  type (with an int64 position-distance tensor for the sliding layers), as prefix sharing built
  them before, and handed to SDPA whole.

Each (width, mode) runs in a fresh process with glibc's default allocator
(`AUTORESEARCH_KEEP_FREED_MEMORY=0`: memory kept from an earlier call would hide what this one
needs). Peak RSS is sampled every 10 ms during the call and reported above the RSS just before
it.

    python -m bench.bench_packed_memory                    # widths 1024 2048 4096 8192
    python -m bench.bench_packed_memory --widths 1024 2048 # quicker
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
import psutil
import torch

from bench.bench_rl_step import PeakRss
from server.engine import packed_attention
from server.engine.engine import Engine, ForwardBackwardJob
from server.engine.lora import LoraSpec
from server.engine.model_loading import load_base_model
from server.protocol.codec import Datum

MEMBERS = 4


def row_data(width: int, vocab: int, seed: int) -> list[Datum]:
    """A prompt of `width / 2` tokens and four continuations filling the rest of the row."""
    rng = np.random.default_rng(seed)
    prompt_len = width // 2
    tail = (width - prompt_len) // MEMBERS
    prompt = rng.integers(5, vocab, size=prompt_len)
    data = []
    for _ in range(MEMBERS):
        full = np.concatenate([prompt, rng.integers(5, vocab, size=tail + 1)])
        n = len(full) - 1
        adv = np.zeros(n, np.float32)
        adv[prompt_len - 1 :] = rng.normal()
        data.append(Datum(full[:-1], {"target_tokens": full[1:],
                                      "logprobs": np.full(n, -2.0, np.float32),
                                      "advantages": adv}))
    return data


def dense_attention(query, key, value, layout, scaling):
    """The earlier way: the whole row's mask at once, built like `prefix_sharing` built it."""
    segments, positions = layout.segments, layout.positions
    width = segments.shape[1]
    index = torch.arange(width)
    causal = index[None, :] <= index[:, None]
    seg_q, seg_k = segments[:, :, None], segments[:, None, :]
    real = segments >= 0
    allowed = causal & ((seg_k == 0) | (seg_k == seg_q)) & real[:, None, :] & real[:, :, None]
    if layout.window:
        distance = positions[:, :, None] - positions[:, None, :]
        allowed = allowed & (distance < layout.window)
    allowed = allowed | ((~real)[:, :, None] & torch.eye(width, dtype=torch.bool))
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=allowed[:, None], scale=scaling,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous()


def measure(engine: Engine, data: list[Datum], mode: str) -> tuple[float, float]:
    original = packed_attention.packed_attention
    if mode == "dense":
        packed_attention.packed_attention = dense_attention
    try:
        state = engine.create_run(LoraSpec(rank=16), seed=0)
        before = psutil.Process().memory_info().rss
        started = time.perf_counter()
        with PeakRss(every_s=0.01) as peak:
            engine.forward_backward(
                [ForwardBackwardJob(state, data, "importance_sampling", {}, False)]
            )
        return (peak.peak - before) / 2**20, time.perf_counter() - started
    finally:
        packed_attention.packed_attention = original


def one(width: int, mode: str, dtype: str | None) -> None:
    """One measurement in this process, printed as a JSON line."""
    engine = Engine(load_base_model(None, "cpu", dtype))
    engine.tokens_per_microbatch = width  # one row per call, whatever its width
    data = row_data(width, engine.vocab_size, width)
    measure(engine, row_data(256, engine.vocab_size, 0)[:1], mode)  # warm-up
    peak_mib, seconds = measure(engine, data, mode)
    print(json.dumps({"peak_mib": peak_mib, "seconds": seconds, "dtype": str(engine.dtype)}))


def spawn(width: int, mode: str, dtype: str | None) -> dict:
    command = [sys.executable, __file__, "--one", str(width), mode]
    if dtype:
        command += ["--dtype", dtype]
    env = dict(os.environ, AUTORESEARCH_KEEP_FREED_MEMORY="0")
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--one", nargs=2, metavar=("WIDTH", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        one(int(args.one[0]), args.one[1], args.dtype)
        return
    print(f"embedded Gemma 3 270M on cpu; {MEMBERS} continuations share a prompt of half the "
          f"row; a fresh process per cell; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("\n| row tokens | chunked peak MiB | dense peak MiB | dense / chunked | chunked s | "
          "dense s |")
    print("|---|---|---|---|---|---|")
    for width in args.widths:
        chunked = spawn(width, "chunked", args.dtype)
        dense = spawn(width, "dense", args.dtype)
        print(f"| {width} | {chunked['peak_mib']:.0f} | {dense['peak_mib']:.0f} | "
              f"{dense['peak_mib'] / chunked['peak_mib']:.2f}x | {chunked['seconds']:.1f} | "
              f"{dense['seconds']:.1f} |", flush=True)
    print(f"\ndtype {chunked['dtype']}; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
