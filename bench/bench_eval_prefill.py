"""An evaluation's prefill through the SDK: prompts that share their database's schema computed
once, the rest grouped by length, against every prompt whole in one padded forward, in one run
on one in-process server.

48 multi-table dev questions and 48 transfer questions (a seeded sample of each split, the
whole schema in each prompt, as a study's evaluation renders them) on the embedded Gemma 3 270M,
decoded greedily with the evaluation's own submission (`sample_completions`: every prompt
submitted at once, 64 new tokens at most, stopping at the closing fence). Rounds alternate the
reference (`Engine.shared_prefill = False`) and the default. Prints the prefill's engine time,
the evaluation's wall time, batches and whether both ways decoded the same tokens.

    python -m bench.bench_eval_prefill [--rounds 2]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from bench.bench_multirun import bench_server, loadavg, quiet


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--questions", type=int, default=48)
    parser.add_argument("--model", default=None)
    args = parser.parse_args()
    args.quick = False
    quiet()
    from autoresearch.evaluation.evaluate import sample_completions
    from sqltasks import load_corpus

    splits = {
        "multi-table dev": random.Random(0).sample(load_corpus("dev", corpus="multitable"),
                                                   args.questions),
        "transfer": random.Random(0).sample(load_corpus("transfer"), args.questions),
    }
    with bench_server(args) as bench:
        engine = bench.engine
        sampler = bench.client.create_sampling_client(base_model=bench.base_model)

        def evaluate(tasks: list, shared: bool) -> tuple[float, float, float, list]:
            engine.shared_prefill = shared
            prefill, batches = engine.stats.prefill_seconds, bench.batch_stats("sample")[0]
            started = time.perf_counter()
            sequences = sample_completions(sampler, engine.tokenizer, tasks, "base", 64)
            seconds = time.perf_counter() - started
            tokens = [s.tokens for seqs in sequences for s in seqs]
            return (engine.stats.prefill_seconds - prefill, seconds,
                    bench.batch_stats("sample")[0] - batches, tokens)

        evaluate(splits["transfer"][:4], True)  # connections, first-touch allocations
        results: dict[tuple[str, bool], list[tuple[float, float, float]]] = {}
        same = True
        for _ in range(args.rounds):
            for name, tasks in splits.items():
                outputs = []
                for shared in (False, True):
                    prefill, seconds, batches, tokens = evaluate(tasks, shared)
                    results.setdefault((name, shared), []).append((prefill, seconds, batches))
                    outputs.append(tokens)
                    print(f"  {name} {'shared' if shared else 'reference'}: prefill "
                          f"{prefill:.1f} s, evaluation {seconds:.1f} s, {batches:.0f} "
                          f"batch(es)", flush=True)
                same &= outputs[0] == outputs[1]
        engine.shared_prefill = True
    print(f"\n{args.questions} questions per split, greedy, 64 new tokens at most; median of "
          f"{args.rounds} rounds; load average {loadavg()}; same tokens both ways: {same}\n")
    print("| split | way | prefill s | evaluation s | batches | prefill ratio | evaluation "
          "ratio |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in splits:
        ref = [statistics.median(v) for v in zip(*results[(name, False)])]
        for shared in (False, True):
            got = [statistics.median(v) for v in zip(*results[(name, shared)])]
            batches = [int(b) for _, _, b in results[(name, shared)]]
            print(f"| {name} | {'shared prefixes, grouped' if shared else 'whole, one forward'}"
                  f" | {got[0]:.1f} | {got[1]:.1f} | {batches} | {ref[0] / got[0]:.2f}x | "
                  f"{ref[1] / got[1]:.2f}x |")


if __name__ == "__main__":
    main()
