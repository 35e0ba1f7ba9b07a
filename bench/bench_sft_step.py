"""The transfer recipe's SFT step on the engine: padded GEMMs against one GEMM per tile.

Under batch invariance every fp32 product of the LoRA layers (and, on a CPU without bf16
matmuls, of the whole base model) gives each row the bits of its own 16-row product. The engine
used to compute exactly that, one GEMM per tile; now, where its probe finds that this machine's
GEMM already gives each row those bits in a padded product of up to 512 rows, it runs such
products (`server.engine.invariance.tiled_matmul`). This benchmark times both on the step the
transfer benchmark spends its training on: `forward_backward(cross_entropy)` over 8 examples of
the multi-table corpus, prompted with CREATE TABLE statements and sample rows, no two sharing a
prompt. The fused engine (`AUTORESEARCH_BATCH_INVARIANT=0`) is timed beside them as the bound
that invariance costs against.

One loaded model; the three ways alternate step by step on the same batches, so that drift in
the machine's load falls on each. Prints seconds per step, tokens per second, GFLOP/s, the
fraction of this machine's own matmul rate at training width (measured in the same run), the
ratio of each way to one GEMM per tile, and whether the padded and per-tile ways gave the same
logprobs and loss to the bit.

    python -m bench.bench_sft_step               # 3 steps per way, ~10 min on 2 cores
    python -m bench.bench_sft_step --steps 1     # ~4 min
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch

from autoresearch.evaluation.evaluate import prompt_tokens
from autoresearch.rl.trial import gold_completion
from bench.bench_roofline import TRAIN_WIDTH, Shapes, roofline
from rewards import Task
from server.engine import invariance
from server.engine.engine import Engine, ForwardBackwardJob
from server.engine.lora import LoraSpec
from server.engine.model_loading import load_base_model
from server.protocol.codec import Datum
from sqltasks import SchemaView, load_corpus

WAYS = ("one GEMM per tile", "padded GEMMs", "fused (no invariance)")


def sft_datum(engine: Engine, task: Task, view: SchemaView) -> Datum:
    """One SFT example as the trial sends it: prompt positions weigh 0, the gold query's 1."""
    prompt = prompt_tokens(engine.tokenizer, task, "base", view)
    completion = engine.tokenizer.encode(gold_completion(task, "base"), add_special_tokens=False)
    full = np.asarray(prompt + list(completion), dtype=np.int64)
    weights = np.zeros(len(full) - 1, np.float32)
    weights[len(prompt) - 1 :] = 1.0
    return Datum(full[:-1], {"target_tokens": full[1:], "weights": weights})


def sft_batches(engine: Engine, steps: int, batch: int, sample_rows: int, max_chars: int,
                seed: int) -> list[list[Datum]]:
    """The transfer recipe's SFT batches."""
    train = load_corpus("train", 0, corpus="multitable")
    view = SchemaView(sample_rows=sample_rows, max_chars=max_chars)
    rng = np.random.default_rng(seed)
    return [[sft_datum(engine, train[int(i)], view)
             for i in rng.choice(len(train), size=batch, replace=False)] for _ in range(steps)]


def sft_flops(shapes: Shapes, data: list[Datum]) -> float:
    """Layers forward and backward over every token, attention three times, the head over
    every position plus its backward where a weight is non-zero (as `bench_roofline` counts)."""
    total = 0.0
    for datum in data:
        n = len(datum.tokens)
        total += 2 * shapes.body_flops(n) + shapes.head_flops(n)
        total += 3 * sum(shapes.attention_flops(c + 1) for c in range(n))
        total += shapes.head_flops(int((datum.inputs["weights"] != 0).sum()))
    return total


def run_way(engine: Engine, state, data: list[Datum], way: str):
    """One forward_backward in `way`; returns (seconds, outputs, loss)."""
    engine.batch_invariant = way != WAYS[2]
    saved = invariance.padded_gemm_is_tiled
    if way == WAYS[0]:
        invariance.padded_gemm_is_tiled = lambda *key: False
    try:
        started = time.perf_counter()
        result = engine.forward_backward([ForwardBackwardJob(state, data, "cross_entropy", {},
                                                             False)])[0]
        seconds = time.perf_counter() - started
    finally:
        invariance.padded_gemm_is_tiled = saved
        state.optimizer.zero_grad(set_to_none=True)
    return seconds, result.outputs, result.metrics["loss:sum"]


def embedded_engine(describe: str = "") -> tuple[Engine, Shapes, float]:
    """The embedded model on the CPU, its shapes and this machine's matmul rate at training
    width (measured now, so every ratio is against the same run), both printed."""
    loaded = load_base_model(None, "cpu", None)
    engine = Engine(loaded)
    shapes = Shapes.of(engine.model.config)
    print(f"model {engine.model_name} on cpu/{engine.dtype} ({loaded.dtype_reason}); "
          f"{describe}threads {torch.get_num_threads()}; "
          f"load average {os.getloadavg()[0]:.2f}", flush=True)
    peak = roofline(shapes, TRAIN_WIDTH, engine.dtype, engine.device, True)
    print(f"matmul roofline at training width M={TRAIN_WIDTH} (+head), {engine.dtype}: "
          f"{peak / 1e9:.1f} GFLOP/s", flush=True)
    return engine, shapes, peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--sample-rows", type=int, default=2)
    parser.add_argument("--max-schema-chars", type=int, default=1600)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    started = time.time()
    engine, shapes, peak = embedded_engine()

    state = engine.create_run(LoraSpec(rank=16), seed=args.seed)
    batches = sft_batches(engine, args.steps, args.batch, args.sample_rows,
                          args.max_schema_chars, args.seed)
    run_way(engine, state, batches[0][:2], WAYS[1])  # the probe and first-touch allocations
    run_way(engine, state, batches[0][:2], WAYS[0])
    times = {way: [] for way in WAYS}
    same_bits = True
    for step, data in enumerate(batches):
        got = {}
        for way in WAYS:
            seconds, outputs, loss = run_way(engine, state, data, way)
            times[way].append(seconds)
            got[way] = (outputs, loss)
            print(f"  step {step} {way:22s} {seconds:6.1f} s", flush=True)
        (tiled, tiled_loss), (padded, padded_loss) = got[WAYS[0]], got[WAYS[1]]
        same_bits &= tiled_loss == padded_loss and all(
            np.array_equal(a["logprobs"], b["logprobs"]) for a, b in zip(tiled, padded,
                                                                         strict=True))

    tokens = statistics.mean(sum(len(d.tokens) for d in data) for data in batches)
    flops = statistics.mean(sft_flops(shapes, data) for data in batches)
    base = statistics.median(times[WAYS[0]])
    print(f"\nSFT step: {args.batch} examples, {tokens:.0f} tokens on average, "
          f"{flops / 1e12:.2f} TFLOP; median of {args.steps} steps per way\n")
    print("| way | seconds | tokens/s | GFLOP/s | of roofline | vs one GEMM per tile |")
    print("| --- | --- | --- | --- | --- | --- |")
    for way in WAYS:
        s = statistics.median(times[way])
        print(f"| {way} | {s:.1f} | {tokens / s:.0f} | {flops / s / 1e9:.0f} | "
              f"{flops / s / peak:.0%} | {base / s:.2f}x |")
    print(f"\npadded GEMMs and one GEMM per tile gave the same logprobs and loss to the bit: "
          f"{'yes' if same_bits else 'NO'}")
    print(f"wall {time.time() - started:.0f} s; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
