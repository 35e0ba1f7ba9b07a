"""How one client's burst of sample requests reaches the scheduler, and which batching window
keeps it in one batch.

One in-process server on the embedded Gemma 3 270M; `--rounds` times, one `SamplingClient`
submits `--prompts` requests of 100 random tokens at once (as an evaluation or an RL group
does, `--max-tokens` new tokens each) and awaits them all. The server's window is opened wide
(1 s of quiet, 5 s at most) so that every round arrives as one batch and nothing the window
does shapes the arrivals; each request's arrival time is read from the batch. Then, from those
same arrivals, how many rounds each candidate window (quiet, at most) would have cut into more
than one batch: a cut round decodes its stragglers in a second batch at part of the width,
and through the SDK a day's greedy rate was 142 tokens/s with cut rounds against 195 without
(`bench/decode_results.md`). The quiet is also what a lone request waits before it starts.

    python -m bench.bench_arrival_gaps [--rounds 40] [--prompts 48] [--max-tokens 8]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from bench.bench_multirun import bench_server, loadavg, quiet

WINDOWS = ((0.01, 0.05), (0.03, 0.3), (0.05, 0.3), (0.1, 0.3), (0.15, 0.3), (0.2, 0.5))
"""(quiet, at most) seconds: the earlier windows, the default, and wider ones."""


def batches_under(arrivals: list[float], quiet_s: float, most_s: float) -> int:
    """How many batches a scheduler with this window forms from a burst that arrives at these
    times, its engine idle: a batch starts once `quiet_s` pass without an arrival or `most_s`
    after its first request; what arrives later waits for the next batch (the engine is then
    busy decoding, so the rest goes together)."""
    times = sorted(arrivals)
    first, last = times[0], times[0]
    for t in times[1:]:
        if t - last >= quiet_s or t - first >= most_s:
            return 2
        last = t
    return 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--prompts", type=int, default=48)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    args.quick = False
    quiet()
    from tinker import types

    started = time.time()
    spreads, gaps, bursts = [], [], []
    with bench_server(args) as bench:
        scheduler = bench.service.scheduler
        scheduler.sample_quiet_seconds, scheduler.sample_gather_seconds = 1.0, 5.0
        prepare = scheduler.before_batch
        seen: list[list[float]] = []

        def record(kind, batch) -> None:
            if kind == "sample":
                seen.append([work.enqueued for work in batch])
            if prepare is not None:
                prepare(kind, batch)

        scheduler.before_batch = record
        sampler = bench.client.create_sampling_client(base_model=bench.base_model).result()
        rng = np.random.default_rng(0)
        prompts = [types.ModelInput.from_ints(
            rng.integers(10, bench.engine.vocab_size - 10, size=100).tolist())
            for _ in range(args.prompts)]
        params = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=1,
                                      stop=[])
        for round_ in range(args.rounds + 1):
            seen.clear()
            futures = [sampler.sample(p, 1, params) for p in prompts]
            for future in futures:
                future.result()
            if round_ == 0:
                continue  # connections, first-touch allocations
            arrivals = sorted(t for batch in seen for t in batch)
            bursts.append(arrivals)
            spreads.append(arrivals[-1] - arrivals[0])
            gaps.append(float(np.diff(arrivals).max()))
    print(f"{args.rounds} rounds of {args.prompts} requests ({args.max_tokens} new tokens); "
          f"load average {loadavg()}; {time.time() - started:.0f} s\n")
    print(f"a round's arrivals spread over: median {statistics.median(spreads) * 1000:.0f} ms, "
          f"largest {max(spreads) * 1000:.0f} ms; the largest gap within a round: median "
          f"{statistics.median(gaps) * 1000:.0f} ms, largest {max(gaps) * 1000:.0f} ms, "
          f"over 50 ms in {sum(g >= 0.05 for g in gaps)} rounds\n")
    print("| window: quiet, at most | rounds cut in two | a lone request waits |")
    print("| --- | --- | --- |")
    for quiet_s, most_s in WINDOWS:
        cut = sum(batches_under(b, quiet_s, most_s) > 1 for b in bursts)
        print(f"| {quiet_s * 1000:.0f} ms, {most_s * 1000:.0f} ms | {cut} of {len(bursts)} | "
              f"{quiet_s * 1000:.0f} ms |")


if __name__ == "__main__":
    main()
