"""Decoding at batch width on the engine: greedy against sampling on the same prompts, in one run.

Random 100-token prompts on the embedded Gemma 3 270M, 64 new tokens each, no stop token (every
row decodes all 64, so greedy and sampling do the same work), all prompts in one `sample` call
(as a server batches requests that arrive together), in process (no HTTP). Greedy (temperature
0) and sampling (temperature 1) alternate, `--repeats` times each, at each width in
`--widths`. Prints tokens per second (the prefill included) and the greedy/sampling ratio
(greedy should be at least as fast: it skips the draw).

    python -m bench.bench_decode_width [--widths 8 48] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from bench.bench_sft_step import embedded_engine
from server.engine.engine import Engine, SampleJob, SamplingParams

PROMPT_TOKENS, NEW_TOKENS = 100, 64


def decode(engine: Engine, prompts: list[list[int]], temperature: float) -> tuple[float, int]:
    """Seconds and tokens for one batched `sample` call over `prompts`."""
    jobs = [SampleJob(None, prompt, 1, SamplingParams(max_tokens=NEW_TOKENS, seed=i,
                                                      temperature=temperature, stop=[]))
            for i, prompt in enumerate(prompts)]
    started = time.perf_counter()
    results = engine.sample(jobs)
    seconds = time.perf_counter() - started
    return seconds, sum(len(seq.tokens) for r in results for seq in r.sequences)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--widths", type=int, nargs="+", default=[8, 48])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    engine, _, _ = embedded_engine()
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, engine.vocab_size - 10, size=PROMPT_TOKENS).tolist()
               for _ in range(max(args.widths))]
    decode(engine, prompts[:4], 1.0)  # first-touch allocations and probes
    rows = []
    for width in args.widths:
        rates: dict[float, list[float]] = {0.0: [], 1.0: []}
        for _ in range(args.repeats):
            for temperature in rates:
                seconds, tokens = decode(engine, prompts[:width], temperature)
                rates[temperature].append(tokens / seconds)
                print(f"  {width} prompts, T={temperature:g}: {seconds:.1f} s, {tokens} tokens",
                      flush=True)
        greedy, sampled = (statistics.median(rates[t]) for t in (0.0, 1.0))
        rows.append(f"| {width} | {greedy:.0f} | {sampled:.0f} | {greedy / sampled:.2f}x |")
    print(f"\n{PROMPT_TOKENS}-token prompts, {NEW_TOKENS} new tokens, median of {args.repeats}; "
          f"load average {os.getloadavg()[0]:.2f}\n")
    print("| prompts | greedy tokens/s | sampling tokens/s | greedy / sampling |")
    print("| --- | --- | --- | --- |")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
