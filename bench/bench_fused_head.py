"""The output head alone, forward and backward, by vocabulary block size, against the plain head
and against its own three GEMMs, in one run.

Gemma 3 270M's head shape (262,144 rows x 640, bf16), a rank-16 LoRA on it, Gemma's soft cap
30, 512 positions with one target each (a chunk of `scoring.HEAD_CHUNK`), random weights: the
head's cost does not depend on their values. Ways:

- `GEMMs only`: the three `[512, 640] x [640, 262144]` products a step needs (forward, the
  backward's recompute, the gradient of the hidden states), nothing else: the floor.
- `plain`: the whole vocabulary as one block (the engine's computation before `fused_head`):
  fp32 logits, delta add, soft cap, log-softmax and gather, checkpointed.
- `fused, block B`: `fused_head.fused_logprobs` with `VOCAB_BLOCK = B`.

Prints milliseconds per forward and backward (the median of `--repeats`), the ratio against
`plain`, and the share of the time that is the GEMMs'.

    python -m bench.bench_fused_head [--blocks 1024 2048 4096 16384] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.utils.checkpoint

from server.engine import fused_head
from server.engine.invariance import row_invariant
from server.engine.invariant_attention import take_columns

VOCAB, HIDDEN, RANK, POSITIONS, CAP = 262_144, 640, 16, 512, 30.0


def operands(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    weight = (torch.randn(VOCAB, HIDDEN, generator=g) * 0.02).to(torch.bfloat16)
    a = (torch.randn(RANK, HIDDEN, generator=g) * 0.05).requires_grad_(True)
    b = (torch.randn(VOCAB, RANK, generator=g) * 0.01).requires_grad_(True)
    hidden = torch.randn(POSITIONS, HIDDEN, generator=g).to(torch.bfloat16)
    targets = torch.randint(0, VOCAB, (POSITIONS,), generator=g)
    return weight, a, b, hidden, targets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[1024, 2048, 4096, 16384])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    weight, a, b, hidden, targets = operands()
    pos = torch.arange(POSITIONS)
    deltas = [fused_head.HeadDelta(0, POSITIONS, a, b, 2.0)]

    def gemms() -> None:
        with torch.no_grad():
            for _ in range(3):
                hidden @ weight.T

    def plain() -> None:
        x = hidden.clone().requires_grad_(True)

        def head(x: torch.Tensor) -> torch.Tensor:
            lows = fused_head.low_rank(x, deltas)
            z = fused_head.block_logits(x, weight, 0, VOCAB, deltas, lows)
            logprobs = torch.log_softmax(fused_head.soft_cap(z, CAP), -1)
            return take_columns(logprobs, pos, targets[:, None])[:, 0]

        torch.utils.checkpoint.checkpoint(head, x, use_reentrant=False).sum().backward()

    def fused(block: int) -> Callable[[], None]:
        def run() -> None:
            fused_head.VOCAB_BLOCK = block
            x = hidden.clone().requires_grad_(True)
            fused_head.fused_logprobs(x, pos, targets, weight, CAP, deltas).sum().backward()
        return run

    ways = [("GEMMs only", gemms), ("plain", plain)]
    ways += [(f"fused, block {block}", fused(block)) for block in args.blocks]
    default = fused_head.VOCAB_BLOCK
    times: dict[str, float] = {}
    with row_invariant():  # the engine's default path
        for name, run in ways:
            run()  # warm: first-touch allocations, the invariance probes of each shape
            samples = []
            for _ in range(args.repeats):
                started = time.perf_counter()
                run()
                samples.append(time.perf_counter() - started)
            times[name] = statistics.median(samples)
            print(f"  {name:22s} {times[name] * 1000:7.0f} ms", flush=True)
    fused_head.VOCAB_BLOCK = default
    print(f"\n{POSITIONS} positions, head {VOCAB} x {HIDDEN} bf16, LoRA rank {RANK}, "
          f"threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f}; "
          f"median of {args.repeats}\n")
    print("| way | ms | vs plain | GEMMs' share |")
    print("| --- | --- | --- | --- |")
    for name, seconds in times.items():
        print(f"| {name} | {seconds * 1000:.0f} | {times['plain'] / seconds:.2f}x | "
              f"{times['GEMMs only'] / seconds:.0%} |")


if __name__ == "__main__":
    main()
