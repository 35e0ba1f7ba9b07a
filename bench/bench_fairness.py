"""Fair queuing across keys: how long one key's call waits while another key bursts.

Key A sends one forward_backward; key B has already queued a burst it is allowed (several
runs, several requests each). Measured on the embedded Gemma 3 270M (or `--model`), in one
process, through the SDK:

- A's call alone on a quiet server (the solo time), and one of B's requests alone;
- A's call submitted right after B's burst, with the per-key share of each fused batch on and,
  as the baseline in the same run, with it off (every queued request of every key joins one
  batch, the earlier behaviour).

The SDK keeps one request of a run in flight at a time, so B's burst is many runs with one
request each. The server's default share is 4096 tokens; the benchmark uses `--share` (1024 by
default) so that its burst spans several shares within a few minutes on two CPU cores.

The documented bound is A's solo time plus two share-sized batches of B: the one already
running when A's call arrives, and the one A's call rides in. Printed: each latency, the bound,
and the ratio of the baseline's delay to the fair one's.

    python -m bench.bench_fairness                  # embedded Gemma 3 270M, about 5 minutes
    python -m bench.bench_fairness --model tiny     # a tiny random Gemma, seconds
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]

A_KEY, B_KEY = "tml-fair-a", "tml-fair-b"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="'tiny', a model directory, or the "
                        "embedded Gemma 3 270M (default)")
    parser.add_argument("--burst-runs", type=int, default=12)
    parser.add_argument("--burst-requests", type=int, default=1, help="per burst run")
    parser.add_argument("--datums", type=int, default=4, help="per request")
    parser.add_argument("--tokens", type=int, default=128, help="per datum")
    parser.add_argument("--share", type=int, default=1024, help="per-key tokens per batch")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()

    import tinker
    from tinker import types

    from tests.server.server_helpers import build_tiny_model, start_server

    work = Path(tempfile.mkdtemp(prefix="bench-fairness-"))
    model = args.model
    if model == "tiny":
        model = str(build_tiny_model(work / "tiny"))
    server = start_server(None if model is None else Path(model), work / "data",
                          api_keys=f"{A_KEY},{B_KEY}")
    share = server.service.scheduler.key_share_tokens = args.share
    try:
        vocab = server.service.engine.vocab_size
        rng = np.random.default_rng(0)

        def batch(n: int) -> list[types.Datum]:
            out = []
            for _ in range(n):
                ids = rng.integers(10, vocab, size=args.tokens + 1).tolist()
                out.append(types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                                       loss_fn_inputs={"target_tokens": ids[1:],
                                                       "weights": [1.0] * args.tokens}))
            return out

        a_service = tinker.ServiceClient(base_url=server.url, api_key=A_KEY)
        b_service = tinker.ServiceClient(base_url=server.url, api_key=B_KEY)
        base = server.service.base_model
        a_run = a_service.create_lora_training_client(base_model=base, rank=8, seed=1).result()
        b_runs = [
            b_service.create_lora_training_client(base_model=base, rank=8, seed=2 + i).result()
            for i in range(args.burst_runs)
        ]
        a_data, b_data = batch(args.datums), batch(args.datums)

        def timed(call) -> float:
            started = time.perf_counter()
            call()
            return time.perf_counter() - started

        fb_a = lambda: a_run.forward_backward(a_data, "cross_entropy").result()  # noqa: E731
        fb_a()  # warm-up
        solo = statistics.median(timed(fb_a) for _ in range(3))
        one_b = statistics.median(
            timed(lambda: b_runs[0].forward_backward(b_data, "cross_entropy").result())
            for _ in range(2))
        b_tokens = args.datums * args.tokens
        share_batch = one_b * max(1, share // b_tokens)

        def under_burst() -> float:
            pending = [run.forward_backward(b_data, "cross_entropy") for run in b_runs
                       for _ in range(args.burst_requests)]
            time.sleep(0.5)  # the burst is queued before A's call arrives
            latency = timed(fb_a)
            for future in pending:
                future.result()
            return latency

        results = {}
        for label, key_share in (("fair share on", share), ("share off (baseline)", 10**12)):
            server.service.scheduler.key_share_tokens = key_share
            results[label] = [under_burst() for _ in range(args.repeats)]
        server.service.scheduler.key_share_tokens = share

        burst = args.burst_runs * args.burst_requests * b_tokens
        bound = solo + 2 * share_batch
        print(f"model {server.service.base_model}; A: 1 request of {args.datums} x "
              f"{args.tokens} tokens; B's burst: {args.burst_runs} runs x "
              f"{args.burst_requests} requests = {burst} tokens; share {share} tokens")
        print(f"A alone: {solo:.2f} s; one of B's requests alone: {one_b:.2f} s; "
              f"one share-sized batch of B: {share_batch:.2f} s")
        print(f"bound (A alone + two share batches of B): {bound:.2f} s")
        for label, values in results.items():
            print(f"A under B's burst, {label}: median {statistics.median(values):.2f} s, "
                  f"max {max(values):.2f} s ({max(values) / bound:.2f}x the bound)")
        fair, unfair = (max(results[k]) for k in results)
        print(f"baseline delay / fair delay: {unfair / fair:.2f}x")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
